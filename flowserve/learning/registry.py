"""A local registry of a node's model versions: weights blobs, manifests, and which version is live.

Layout, under ``$FLOWSERVE_CACHE`` (else ``~/.cache/flowserve``)::

    models/<topology>/<node>/
        v1/weights.bin       what the component's ``retrain`` returned (a torch state dict for torch models)
        v1/manifest.json     version, sha256 of weights.bin, parent version, created, training-set size, metrics
        live.json            {"live": "v2", "history": ["base", "v1"]}: promotions, newest last

``base`` is the version a node runs before anything is promoted: the weights its params name. The
weights are opaque bytes here (the core never imports torch); the component reads them back with
``load_weights``, which must refuse anything but plain tensors. Every read checks the blob against its
manifest's hash. Writes are atomic (write beside, rename over), so a worker never reads half a file.

Workers on other machines see the same versions when the cache directory is shared (a volume).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowserve.errors import ErrorKind, FlowserveError

#: the version a node runs before any promotion: the weights its params name.
BASE = "base"
_VERSION = re.compile(r"^v(\d+)$")


class RegistryError(FlowserveError):
    """A version that does not exist, weights that fail their hash, nothing to roll back to."""

    kind = ErrorKind.INVALID_INPUT


def cache_dir() -> Path:
    """``$FLOWSERVE_CACHE``, else ``~/.cache/flowserve`` (where the component library caches its models)."""
    env = os.environ.get("FLOWSERVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "flowserve"


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the registry knows of one version."""

    version: str
    weights_sha256: str
    parent: str
    created_ms: int
    training_size: int
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        doc = json.loads(text)
        return cls(version=str(doc["version"]), weights_sha256=str(doc["weights_sha256"]),
                   parent=str(doc["parent"]), created_ms=int(doc["created_ms"]),
                   training_size=int(doc["training_size"]),
                   metrics={str(k): float(v) for k, v in (doc.get("metrics") or {}).items()})


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class Registry:
    """The versions of one node of one topology. ``Registry("digits", "model")``."""

    def __init__(self, topology: str, node: str, root: Path | None = None) -> None:
        for what, name in (("topology", topology), ("node", node)):
            if not name or "/" in name or name.startswith("."):
                raise RegistryError(f"registry: {what} name {name!r} cannot name a directory")
        self.topology = topology
        self.node = node
        self.dir = (root or cache_dir() / "models") / topology / node

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # -- versions --------------------------------------------------------------------------------

    def versions(self) -> list[Manifest]:
        """Every registered version, oldest first."""
        if not self.dir.is_dir():
            return []
        found = []
        for child in self.dir.iterdir():
            m = _VERSION.match(child.name)
            if m and (child / "manifest.json").is_file():
                found.append((int(m.group(1)), Manifest.from_json((child / "manifest.json").read_text())))
        return [manifest for _, manifest in sorted(found, key=lambda pair: pair[0])]

    def manifest(self, version: str) -> Manifest:
        path = self.dir / version / "manifest.json"
        if not _VERSION.match(version) or not path.is_file():
            known = ", ".join(m.version for m in self.versions()) or "none yet"
            raise RegistryError(f"node '{self.node}' of '{self.topology}' has no version '{version}' "
                                f"(registered: {known}; 'flowserve learn' registers one)")
        return Manifest.from_json(path.read_text())

    def register(self, weights: bytes, *, parent: str, training_size: int,
                 metrics: Mapping[str, float] | None = None) -> Manifest:
        """Store ``weights`` as the next version (v1, v2, ...) and return its manifest."""
        with self._lock():
            numbers = [int(m.group(1)) for c in (self.dir.iterdir() if self.dir.is_dir() else [])
                       if (m := _VERSION.match(c.name))]
            version = f"v{max(numbers, default=0) + 1}"
            manifest = Manifest(version, hashlib.sha256(weights).hexdigest(), parent, int(time.time() * 1000),
                                training_size, {k: float(v) for k, v in (metrics or {}).items()})
            _write_atomic(self.dir / version / "weights.bin", weights)
            # the manifest last: a version is listed only once its weights are complete
            _write_atomic(self.dir / version / "manifest.json", manifest.to_json().encode())
        return manifest

    def weights(self, version: str) -> bytes:
        """The weights of ``version``, checked against the hash in its manifest."""
        manifest = self.manifest(version)
        data = (self.dir / version / "weights.bin").read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest.weights_sha256:
            raise RegistryError(f"weights of {self.node} {version} do not match their manifest "
                                f"(sha256 {digest[:16]}…, expected {manifest.weights_sha256[:16]}…): "
                                f"the file under {self.dir / version} was changed; register the version again")
        return data

    # -- which version is live ---------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        path = self.dir / "live.json"
        if not path.is_file():
            return {"live": BASE, "history": []}
        doc = json.loads(path.read_text())
        return {"live": str(doc.get("live", BASE)), "history": [str(v) for v in doc.get("history", [])]}

    def live(self) -> str:
        """The live version (:data:`BASE` until something is promoted)."""
        return str(self._state()["live"])

    def history(self) -> list[str]:
        """The versions live before the current one, oldest first (what ``rollback`` returns to)."""
        return list(self._state()["history"])

    def promote(self, version: str) -> str:
        """Make ``version`` live (recorded, so a restarted worker loads it); returns the one it replaced."""
        if version != BASE:
            self.manifest(version)  # exists
        with self._lock():
            state = self._state()
            before = str(state["live"])
            if before != version:
                state["history"].append(before)
                state["live"] = version
                _write_atomic(self.dir / "live.json", json.dumps(state).encode())
        return before

    def rollback(self) -> tuple[str, str]:
        """Return to the version live before the current one; returns (from, to)."""
        with self._lock():
            state = self._state()
            if not state["history"]:
                raise RegistryError(f"node '{self.node}' of '{self.topology}' has nothing to roll back to: "
                                    f"{state['live']} is the only version it has run")
            before = str(state["live"])
            state["live"] = state["history"].pop()
            _write_atomic(self.dir / "live.json", json.dumps(state).encode())
        return before, str(state["live"])


__all__ = ["BASE", "Manifest", "Registry", "RegistryError", "cache_dir"]
