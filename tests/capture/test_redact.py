"""Redaction of captured ports, without a broker: the redaction function, the key sources, the load-time
validation of ``capture.redact`` / ``hash_key`` / retention, and how ``inspect`` shows redacted records."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import numpy as np
import pytest

from flowserve.capture.inspect import format_record, to_json
from flowserve.capture.reader import Decoded
from flowserve.capture.redact import EMPTY, H_REDACT, Redactor, load_key, node_redactors, parse_header
from flowserve.errors import ErrorKind, SettingsError, TopologyError
from flowserve.topology import load_topology_text
from flowserve.topology.capture import topic_configs
from flowserve.topology.spec import KeySource
from flowserve.wire.tensors import decode_tensors

KEY = b"test-key"


def _hmac(data: bytes) -> bytes:
    return hmac.new(KEY, data, hashlib.sha256).hexdigest().encode()


def test_hash_of_a_bytes_tensor_is_the_hmac_of_each_element_in_the_same_shape() -> None:
    array = np.array([[b"alice", "bob"], [b"", "\u00e9"]], dtype=object)
    out = Redactor("hash", KEY).apply(array)
    assert out is not None and out.shape == (2, 2) and out.dtype == object
    assert out.tolist() == [[_hmac(b"alice"), _hmac(b"bob")], [_hmac(b""), _hmac("\u00e9".encode())]]


def test_hash_of_a_numeric_tensor_is_the_hmac_of_each_rows_little_endian_bytes() -> None:
    array = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = Redactor("hash", KEY).apply(array)
    assert out is not None and out.shape == (2,)
    assert out.tolist() == [_hmac(array[0].astype("<f4").tobytes()), _hmac(array[1].astype("<f4").tobytes())]
    big_endian = array.astype(">f4")  # same values, other byte order: the same digests (the wire's layout)
    assert Redactor("hash", KEY).apply(big_endian).tolist() == out.tolist()  # type: ignore[union-attr]
    assert Redactor("hash", b"other").apply(array).tolist() != out.tolist()  # type: ignore[union-attr]


def test_drop_writes_no_tensor_and_keep_writes_the_tensor() -> None:
    array = np.ones((3, 4), np.float32)
    drop = Redactor("drop", port="emb")
    assert drop.apply(array) is None and drop.encode("emb", array) == EMPTY
    assert decode_tensors(EMPTY) == {}
    assert drop.header == (H_REDACT, b"emb=drop")
    assert Redactor("keep").apply(array) is array
    hashed = decode_tensors(Redactor("hash", KEY, "emb").encode("emb", array))
    assert list(hashed) == ["emb"] and hashed["emb"].shape == (3,)
    assert b"\x00\x00\x80?" not in Redactor("hash", KEY).encode("emb", array)  # no float 1.0 left in the bytes


def test_the_key_never_shows_and_hash_needs_one() -> None:
    r = Redactor("hash", b"s3cret-value")
    assert "s3cret" not in repr(r) and "s3cret" not in str(r)
    with pytest.raises(SettingsError, match="port 'p' is hashed but has no key"):
        Redactor("hash", None, "p")


def test_key_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FS_TEST_REDACT_KEY", "from-env")
    assert load_key(KeySource(env="FS_TEST_REDACT_KEY")) == b"from-env"
    path = tmp_path / "key"
    path.write_bytes(b"from-file\n")
    assert load_key(KeySource(file=str(path))) == b"from-file"
    monkeypatch.setenv("FS_TEST_REDACT_KEY", "")
    with pytest.raises(SettingsError, match="environment variable FS_TEST_REDACT_KEY is unset or empty") as err:
        load_key(KeySource(env="FS_TEST_REDACT_KEY"))
    assert err.value.kind is ErrorKind.INVALID_SETTINGS
    with pytest.raises(SettingsError, match="cannot read the file") as err:
        load_key(KeySource(file=str(tmp_path / "missing")))
    path.write_text("the-secret-itself")
    monkeypatch.delenv("FS_TEST_REDACT_KEY")
    with pytest.raises(SettingsError) as err:
        load_key(KeySource(env="FS_TEST_REDACT_KEY"))
    assert "the-secret-itself" not in str(err.value)


SPEC = """
name: red
nodes:
  a: {component: fs_testkit:Split, inputs: {x: input.x}}
  b: {component: fs_testkit:AddOne, inputs: {x: a.lo}}
outputs: {y: b.x}
capture:
  ports: [a.hi]
  CAPTURE
"""


def _load(capture: str):  # noqa: ANN202
    return load_topology_text(SPEC.replace("CAPTURE", capture))


def test_a_valid_spec_gives_the_node_its_redactors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FS_TEST_REDACT_KEY", "k")
    topology = _load("redact: {a.hi: hash}\n  hash_key: {env: FS_TEST_REDACT_KEY}")
    assert topology.nodes["a"].capture_topics == {"hi": "fs.red.a.hi"}
    redactors = node_redactors(topology.spec, "a")
    assert list(redactors) == ["hi"] and redactors["hi"].mode == "hash"
    assert node_redactors(topology.spec, "b") == {}
    assert node_redactors(_load("redact: {a.hi: keep}").spec, "a") == {}


@pytest.mark.parametrize(("capture", "node", "message"), [
    ("redact: {a.lo: drop}", "a", "node 'a' port 'lo' feeds the pipeline through its edge topic"),
    ("redact: {b.x: drop}", "b", "port 'x' is not captured: add 'b.x' to capture.ports"),
    ("redact: {a.nope: drop}", "a", "node 'a' has no output port 'nope'"),
    ("redact: {zz.hi: drop}", "zz", "'zz.hi' must be 'node.port' with a known node"),
    ("redact: {a.hi: hash}", "a", "port 'hi' is hashed but no key is named"),
    ("redact: {a.hi: drop}\n  nodes: {a: {enabled: false}}", "a", "port 'hi' is not captured"),
])
def test_redact_of_a_port_capture_does_not_write_or_hash_without_key_is_invalid(capture: str, node: str | None,
                                                                                 message: str) -> None:
    with pytest.raises(TopologyError, match=message) as err:
        _load(capture)
    assert err.value.kind is ErrorKind.INVALID_TOPOLOGY
    assert err.value.node == node


@pytest.mark.parametrize(("capture", "message"), [
    ("redact: {a.hi: scramble}", "capture.redact.a.hi"),
    ("hash_key: {env: A, file: B}", "exactly one of 'env'"),
    ("hash_key: {}", "exactly one of 'env'"),
    ("hash_key: {key: s3cret}", "capture.hash_key.key"),
    ("retention_bytes: 0", "capture.retention_bytes"),
])
def test_malformed_redaction_settings_are_invalid(capture: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        _load(capture)


def test_retention_time_and_bytes_go_to_every_topic_capture_reads() -> None:
    topology = _load("retention_ms: 3600000\n  retention_bytes: 1048576")
    configs = topic_configs(topology)
    want = {"retention.ms": "3600000", "retention.bytes": "1048576"}
    assert configs["fs.red.a.hi"] == want and configs["fs.red.a.lo"] == want
    assert "fs.red.inputs" not in configs and "fs.red.outputs" not in configs
    assert topic_configs(_load("retention_bytes: 5"))["fs.red.a.hi"] == {"retention.bytes": "5"}
    assert "fs.red.a.hi" not in topic_configs(_load("sample: 1.0"))


def _record(headers: dict[str, str], tensors: dict[str, np.ndarray]) -> Decoded:
    return Decoded("fs.red.a.hi", 0, 7, 0, "r1", headers, tensors=tensors)


def test_inspect_shows_redacted_ports_as_such() -> None:
    dropped = _record({H_REDACT: "hi=drop"}, {})
    assert "  hi: <dropped>" in format_record(dropped).splitlines()
    assert to_json(dropped)["redacted"] == {"hi": "drop"}
    digests = Redactor("hash", KEY).apply(np.ones((2, 4), np.float32))
    assert digests is not None
    hashed = _record({H_REDACT: "hi=hmac-sha256"}, {"hi": digests})
    line = format_record(hashed).splitlines()[-1]
    assert line.startswith("  hi: <hmac-sha256> [2] [<hmac-sha256:") and digests[0].decode()[:12] in line
    assert to_json(hashed)["redacted"] == {"hi": "hmac-sha256"}
    assert "redacted" not in to_json(_record({}, {"hi": np.ones((1, 4), np.float32)}))
    assert parse_header("a=drop, b=hmac-sha256") == {"a": "drop", "b": "hmac-sha256"} and parse_header("") == {}
