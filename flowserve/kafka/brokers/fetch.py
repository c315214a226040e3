"""Apache Kafka's jars from Maven Central without Maven: the list pinned in the package, checked by SHA-256.

For a Kafka version with a pinned list beside ``apache/pom.xml`` (``apache/kafka-<version>.jars``, written by
``apache/pin-jars.sh``), :func:`fetch_jars` downloads each jar over HTTPS straight from its path in the
Maven repository, a few at a time, with a progress bar; every file must have the size and SHA-256 the list
gives, or the fetch is refused with an error that names the file. The list, not the server, is trusted:
Maven checked each jar against Maven Central's ``.sha1`` when the list was written, and a mirror (or a
proxy that rewrites bodies) cannot change what is accepted. Here it fetched the broker's 46 jars (44 MB)
in 1.3 s at the median of 11 runs, where ``mvn`` from an empty local repository took 7-13 s
(docs/operations.md).

Nothing blocks for ever: each connect and read waits at most :data:`SOCKET_TIMEOUT_S`, and the whole fetch at
most ``FLOWSERVE_FETCH_TIMEOUT_S`` (600 s). Jars land in a staging folder renamed into place with a
``.complete`` marker, so an interrupted or concurrent fetch never leaves half a classpath behind.

``FLOWSERVE_MAVEN_URL`` points it at a mirror (an Artifactory or Nexus proxy of Maven Central).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from flowserve.console import make_console
from flowserve.errors import BrokerError

#: where the jars come from when ``FLOWSERVE_MAVEN_URL`` is not set
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2/"
#: the longest one connect or one read may wait: a dead network fails in seconds, not minutes
SOCKET_TIMEOUT_S = 10.0
#: the longest a whole fetch may take when ``FLOWSERVE_FETCH_TIMEOUT_S`` is not set
FETCH_TIMEOUT_S = 600.0
#: downloads at once: most jars are small, so the round trips, not the bandwidth, bound a serial fetch
PARALLEL = 6
_CHUNK = 1 << 16
_LISTS = Path(__file__).resolve().parent / "apache"


class FetchError(BrokerError):
    """The jars could not be fetched: Maven Central (or the mirror) unreachable, a file missing there, or
    the fetch ran out of time. The message's first line says which, for one line of a log."""


class ChecksumError(FetchError):
    """A downloaded file is not the one the pinned list names (size or SHA-256); it was not kept."""


@dataclass(frozen=True, slots=True)
class Jar:
    """One line of a pinned list: the jar's path under the Maven repository, its size and SHA-256."""

    path: str
    size: int
    sha256: str

    @property
    def name(self) -> str:
        """The file name, as Maven's ``copy-dependencies`` names it (``artifact-version.jar``)."""
        return self.path.rsplit("/", 1)[-1]


def maven_url() -> str:
    """The Maven repository to fetch from: ``FLOWSERVE_MAVEN_URL``, else Maven Central; ends with ``/``."""
    url = os.environ.get("FLOWSERVE_MAVEN_URL") or MAVEN_CENTRAL
    if not url.startswith(("https://", "http://")):
        raise FetchError(f"FLOWSERVE_MAVEN_URL={url!r}: give an http(s):// URL of a Maven repository")
    return url if url.endswith("/") else f"{url}/"


def pinned_jars(version: str, *, tools: bool = False) -> list[Jar] | None:
    """The pinned jar list of Kafka ``version`` (``tools``: with the console clients), or None when this
    package has none for that version (then only Maven can resolve it)."""
    listed = _LISTS / (f"kafka-{version}-tools.jars" if tools else f"kafka-{version}.jars")
    if not listed.exists():
        return None
    jars = []
    for number, line in enumerate(listed.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            path, size, sha256 = line.split()
            jars.append(Jar(path, int(size), sha256))
        except ValueError:
            raise FetchError(f"{listed}:{number}: not '<maven path> <bytes> <sha256>': {line!r}") from None
    return jars


def _timeout_s() -> float:
    raw = os.environ.get("FLOWSERVE_FETCH_TIMEOUT_S", "")
    try:
        return float(raw) if raw else FETCH_TIMEOUT_S
    except ValueError:
        raise FetchError(f"FLOWSERVE_FETCH_TIMEOUT_S={raw!r} is not a number of seconds") from None


class _Download:
    """One fetch's shared state: its deadline, the stop flag every download checks, the progress bar."""

    def __init__(self, what: str, base_url: str, staging: Path, deadline: float, progress: Progress,
                 task: TaskID) -> None:
        self.what = what
        self.base_url = base_url
        self.staging = staging
        self.deadline = deadline
        self.stop = threading.Event()
        self.progress = progress
        self.task = task

    def get(self, jar: Jar) -> None:
        # One retry, for a failure after the server answered (a reset mid-body, a 5xx): a network that
        # cannot be reached at all is said at once, so the caller can fall back without waiting twice.
        for attempt in (1, 2):
            try:
                self._get_once(jar)
                return
            except _Transient as exc:
                if attempt == 2 or self.stop.is_set():
                    raise FetchError(f"{self.what}: {exc}") from None
                time.sleep(0.5)

    def _get_once(self, jar: Jar) -> None:
        url = self.base_url + jar.path
        digest, got = hashlib.sha256(), 0
        try:
            # http(s) only: maven_url() refuses any other scheme
            with (urllib.request.urlopen(url, timeout=SOCKET_TIMEOUT_S) as answer,  # noqa: S310
                  (self.staging / jar.name).open("wb") as out):
                while chunk := answer.read(_CHUNK):
                    if self.stop.is_set():
                        return
                    if time.monotonic() > self.deadline:
                        raise FetchError(f"{self.what}: not fetched in {_timeout_s():.0f} s (at {url}); "
                                         "raise FLOWSERVE_FETCH_TIMEOUT_S on a slow link")
                    got += len(chunk)
                    if got > jar.size:
                        break
                    digest.update(chunk)
                    out.write(chunk)
                    self.progress.advance(self.task, len(chunk))
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise _Transient(f"{url}: HTTP {exc.code}") from None
            raise FetchError(f"{self.what}: {url}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:  # before any answer: refused, no route, DNS, TLS
            raise FetchError(f"{self.what}: cannot reach {self.base_url} ({exc.reason})") from None
        except (OSError, http.client.HTTPException) as exc:  # after the answer began: a timeout, a reset
            raise _Transient(f"{url}: {exc or type(exc).__name__}") from None
        if got != jar.size or digest.hexdigest() != jar.sha256:
            (self.staging / jar.name).unlink(missing_ok=True)
            raise ChecksumError(
                f"{self.what}: {jar.name} refused: {url} served {'more than ' if got > jar.size else ''}"
                f"{got} bytes with SHA-256 {digest.hexdigest()[:16]}…, the pinned list has {jar.size} bytes "
                f"with {jar.sha256[:16]}… (a corrupted download, or a mirror serving another file)"
            )


class _Transient(Exception):
    """A failure worth one retry."""


def _reuse(jar: Jar, source: Path | None, staging: Path) -> bool:
    """Link (else copy) ``jar`` from ``source`` (the broker's libs/ beside tools/) when it is there, unchanged."""
    if source is None or not (source / jar.name).is_file():
        return False
    found = source / jar.name
    digest = hashlib.sha256()
    with found.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != jar.sha256:
        return False
    try:
        os.link(found, staging / jar.name)
    except OSError:
        shutil.copyfile(found, staging / jar.name)
    return True


def fetch_jars(target: Path, jars: Sequence[Jar], *, what: str = "Apache Kafka's jars",
               reuse: Path | None = None, base_url: str | None = None) -> float:
    """Fetch ``jars`` into the folder ``target`` once (a folder with a ``.complete`` marker is left alone),
    taking from ``reuse`` those already there; returns the seconds it took. Raises :class:`FetchError` (or
    :class:`ChecksumError`) and leaves nothing behind when any jar cannot be had."""
    if (target / ".complete").exists():
        return 0.0
    base_url = base_url or maven_url()
    started = time.monotonic()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-staging.", dir=target.parent))
    except OSError as exc:
        raise FetchError(f"{what}: cannot write under {target.parent}: {exc}") from None
    try:
        wanted = [jar for jar in jars if not _reuse(jar, reuse, staging)]
        total = sum(jar.size for jar in wanted)
        console = make_console(stderr=True)
        if wanted:
            console.print(f"{what}: fetching {len(wanted)} jars ({total / 1e6:.0f} MB) once from {base_url} "
                          f"into {target}, each checked against its pinned SHA-256…")
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True, disable=not wanted) as progress:
            task = progress.add_task("jars", total=total)
            run = _Download(what, base_url, staging, started + _timeout_s(), progress, task)
            with ThreadPoolExecutor(PARALLEL, thread_name_prefix="flowserve-fetch") as pool:
                futures = [pool.submit(run.get, jar) for jar in wanted]
                try:
                    done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                    failed = next((f.exception() for f in done if f.exception() is not None), None)
                    if failed is not None:
                        raise failed
                finally:  # a failure or Ctrl-C: queued downloads never start, running ones stop at their next chunk
                    run.stop.set()
                    for future in futures:
                        future.cancel()
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:
            if not (target / ".complete").exists():  # another fetch finishing first is as good as ours
                raise FetchError(f"{what}: could not move the jars into {target} (it exists and is not "
                                 "empty): remove it and try again") from None
        took = time.monotonic() - started
        if wanted:
            console.print(f"{what}: fetched {len(wanted)} jars ({total / 1e6:.0f} MB) in {took:.1f} s, "
                          f"cached in {target}")
        return took
    finally:
        shutil.rmtree(staging, ignore_errors=True)
