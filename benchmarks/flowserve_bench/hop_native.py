"""The native floor of ``flowserve bench hop-cpu``: a relay whose Kafka work stays in C, woken by a pipe.

The other floors (:mod:`flowserve_bench.hop_floor`) say what a hop costs on the clients flowserve has. This
one says what it would cost on a binding built for a worker's data plane, the route issue 35's closing note
names: librdkafka driven from C a batch per call (``native_relay.c``: one call consumes every queued record,
one call queues a batch, delivery reports counted in C a batch of them per event) on the event loop's thread,
woken by a file descriptor librdkafka writes when a queue fills (no thread crossing into Python). Its
producer sends at once (``linger.ms`` 0), as a worker must at low load.

The module is compiled on first use into the flowserve cache with the C compiler, Python's headers and
librdkafka's ``rdkafka.h`` (Debian: librdkafka-dev), linked against the librdkafka confluent-kafka ships where
there is one (the version the librdkafka floors run), else the system's. Where it cannot be built the bench
says why and runs the other floors (:class:`NativeUnavailable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType
from typing import Any

SOURCE = Path(__file__).with_name("native_relay.c")
#: where rdkafka.h is looked for (under librdkafka/), after $FLOWSERVE_RDKAFKA_INCLUDE
INCLUDE_DIRS = ("/usr/include", "/usr/local/include")


class NativeUnavailable(RuntimeError):
    """The native relay cannot be built here; the message says what is missing."""


def _cache() -> Path:
    root = os.environ.get("FLOWSERVE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "flowserve") / "bench"


def _librdkafka() -> list[str]:
    """Linker arguments: confluent-kafka's bundled librdkafka (same version as the other floors), else -lrdkafka."""
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is not None and spec.origin is not None:
        libs = Path(spec.origin).parent.parent / "confluent_kafka.libs"
        for lib in sorted(libs.glob("librdkafka*.so*")):
            return [str(lib), f"-Wl,-rpath,{libs}"]
    return ["-lrdkafka"]


def build() -> Path:
    """The compiled module's path, building it on first use (cached by the source and toolchain)."""
    include = next((d for d in (os.environ.get("FLOWSERVE_RDKAFKA_INCLUDE"), *INCLUDE_DIRS)
                    if d and (Path(d) / "librdkafka" / "rdkafka.h").exists()), None)
    if include is None:
        raise NativeUnavailable("no librdkafka/rdkafka.h (Debian: apt-get install librdkafka-dev; or set "
                                "FLOWSERVE_RDKAFKA_INCLUDE)")
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise NativeUnavailable("no C compiler (cc or gcc) on PATH")
    link = _librdkafka()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, include, *link, suffix]).encode()).hexdigest()[:16]
    out = _cache() / f"native-relay-{key}" / f"_native_relay{suffix}"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}.tmp")
    command = [compiler, "-O2", "-shared", "-fPIC", "-Wall", f"-I{sysconfig.get_paths()['include']}", f"-I{include}",
               str(SOURCE), "-o", str(partial), *link]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise NativeUnavailable(f"{' '.join(command)} failed: {done.stderr.strip()[-600:]}")
    partial.replace(out)  # atomic: relays started at once all find a whole file
    return out


def load() -> ModuleType:
    """The built module, imported."""
    spec = importlib.util.spec_from_file_location("_native_relay", build())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def relay_native(source: str, sink: str, consumer_config: dict[str, Any], producer_config: dict[str, Any], *,
                       stop: list[bool], commit_every_s: float) -> None:
    """The native relay's loop, until ``stop[0]``: read what is queued, queue it all for ``sink``, wait until
    every record is acknowledged, commit (asynchronously, at most every ``commit_every_s``). The settings are
    a worker's on librdkafka, but its producer sends at once (``linger.ms`` 0): no thread flushes it."""
    native = load()
    consumer, consumer_fd = native.consumer(consumer_config, source)
    producer, producer_fd = native.producer({**producer_config, "linger.ms": 0})
    loop = asyncio.get_running_loop()
    fetched, reported = asyncio.Event(), asyncio.Event()

    def woken(fd: int, event: asyncio.Event) -> None:
        # empty the pipe here: a byte left in it would wake the loop on every turn
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 4096)
        event.set()

    loop.add_reader(consumer_fd, woken, consumer_fd, fetched)
    loop.add_reader(producer_fd, woken, producer_fd, reported)
    offsets: dict[int, int] = {}
    last = 0.0
    # SIGTERM sets stop[0]; a timer wakes the loop to see it (a wait_for per batch would cost a task each)
    ticker: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal ticker
        fetched.set()
        ticker = loop.call_later(0.1, tick)

    tick()
    while not stop[0]:
        await fetched.wait()
        fetched.clear()
        records = native.consume(consumer, 4096)
        if not records:
            continue
        pending = native.produce(producer, sink, [(p, key, value, headers) for p, _, key, value, headers in records])
        for partition, offset, *_ in records:
            offsets[partition] = offset + 1
        while True:
            ok, failed = native.reports(producer)
            pending -= ok + failed
            if pending <= 0:
                break
            await reported.wait()
            reported.clear()
        if time.monotonic() - last >= commit_every_s:
            native.commit(consumer, source, offsets)
            offsets, last = {}, time.monotonic()
    if ticker is not None:
        ticker.cancel()
    loop.remove_reader(consumer_fd)
    loop.remove_reader(producer_fd)


if __name__ == "__main__":  # build it now and say where, or why not
    try:
        print(build())
    except NativeUnavailable as exc:
        sys.exit(f"native relay: {exc}")
