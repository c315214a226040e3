"""Redaction of captured ports: what ``capture.redact`` does to a tensor before it is written.

``drop`` writes no tensor at all: the capture record keeps its key (the request id) and headers, so lineage
still shows the request passed, and its :data:`H_REDACT` header says which port was withheld. ``hash``
replaces the tensor by keyed digests (HMAC-SHA256, hex, as a BYTES tensor): one per element of a BYTES
tensor (same shape), one per row of a numeric tensor (shape ``[rows]``, over the row's little-endian bytes
in its V2 datatype, as :func:`~flowserve.wire.tensors.encode_payload` lays them out). The same input and
key always give the same digest, so hashed ids can still be joined across records and requests, and anyone
holding the key can check a value against a digest; without the key a digest says nothing about the value.

Request ids (record keys, lineage entries) are not redacted: every edge topic carries them in the clear,
so hashing them only in capture records would hide nothing and break ``flowserve lineage``.

>>> r = Redactor("hash", b"k")
>>> r.apply(np.array([b"alice", b"bob"], dtype=object)).tolist()[0][:16]
b'ec631a55bb81f5b9'
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import numpy as np

from flowserve.errors import SettingsError
from flowserve.topology.capture import redactions
from flowserve.topology.spec import KeySource, Redaction, TopologySpec
from flowserve.wire.tensors import DATATYPES, as_bytes_array, datatype_of, encode_tensors

#: header of a capture record whose port was redacted: ``<port>=drop`` or ``<port>=hmac-sha256``.
H_REDACT = "fs-redact"
#: how :data:`H_REDACT` names each mode.
LABELS = {"drop": "drop", "hash": "hmac-sha256"}
#: the value of a dropped port's record: a frame of no tensors.
EMPTY = encode_tensors({})


def load_key(source: KeySource) -> bytes:
    """The key ``source`` names, as bytes. Raises :class:`SettingsError` naming the variable or file (never
    its content) when it is missing or empty. A file's trailing newline is not part of the key."""
    if source.env is not None:
        text = os.environ.get(source.env)
        key = text.encode() if text is not None else b""
    else:
        assert source.file is not None
        try:
            key = Path(source.file).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise SettingsError(f"capture.hash_key: cannot read the {source.describe()} "
                                f"({exc.strerror or type(exc).__name__})") from None
    if not key:
        raise SettingsError(f"capture.hash_key: the {source.describe()} is unset or empty; it must hold the "
                            "key of capture's hash redactions")
    return key


def digest(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data`` under ``key``, as lowercase hex (the element of a hashed tensor)."""
    return hmac.new(key, data, hashlib.sha256).hexdigest().encode()


class Redactor:
    """One port's redaction. Holds the key, and never shows it (``repr`` names only the mode)."""

    __slots__ = ("mode", "header", "_key")

    def __init__(self, mode: Redaction, key: bytes | None = None, port: str = "") -> None:
        if mode == "hash" and not key:
            raise SettingsError(f"capture.redact: port '{port}' is hashed but has no key (capture.hash_key)")
        self.mode = mode
        self._key = key or b""
        #: the (name, value) of the :data:`H_REDACT` header its records carry
        self.header = (H_REDACT, f"{port}={LABELS.get(mode, mode)}".encode())

    def __repr__(self) -> str:
        return f"Redactor({self.mode!r})"

    def apply(self, array: np.ndarray) -> np.ndarray | None:
        """The tensor to write in place of ``array`` (rows along axis 0 kept), or None for ``drop``."""
        if self.mode == "drop":
            return None
        if self.mode == "keep":
            return array
        key = self._key
        if datatype_of(array) == "BYTES":
            flat = as_bytes_array(array).reshape(-1)
            out = np.empty(flat.shape, dtype=object)
            for i, value in enumerate(flat):
                out[i] = digest(key, value)
            return out.reshape(array.shape)
        typed = np.ascontiguousarray(array, dtype=DATATYPES[datatype_of(array)])
        rows = typed.reshape(len(typed), -1) if typed.ndim else typed.reshape(1, 1)
        out = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            out[i] = digest(key, row.tobytes())
        return out

    def encode(self, port: str, array: np.ndarray) -> bytes:
        """The value of a capture record for ``array`` on ``port``, redacted."""
        redacted = self.apply(array)
        return EMPTY if redacted is None else encode_tensors({port: redacted})


def node_redactors(spec: TopologySpec, node_id: str) -> dict[str, Redactor]:
    """port -> :class:`Redactor` for a node's redacted ports (none for ``keep``); the key is read once, here."""
    modes = redactions(spec, node_id)
    if not modes:
        return {}
    cap = spec.capture
    assert cap is not None
    key = load_key(cap.hash_key) if cap.hash_key is not None and "hash" in modes.values() else None
    return {port: Redactor(mode, key, port) for port, mode in modes.items()}


def parse_header(value: str) -> dict[str, str]:
    """``{port: label}`` from an :data:`H_REDACT` header value (``port=label[,port=label]``)."""
    out: dict[str, str] = {}
    for part in value.split(","):
        port, eq, label = part.partition("=")
        if eq:
            out[port.strip()] = label.strip()
    return out
