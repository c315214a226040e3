"""The version registry: register, list, load with the hash checked, promote, rollback (no broker)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from flowserve.component import Component, Port, require
from flowserve.errors import ComponentError, ErrorKind
from flowserve.learning import BASE, Registry, RegistryError, Retrainable, join_training_set, score
from flowserve.topology import names
from flowserve.wire.feedback import Feedback


def test_register_list_and_load(tmp_path: Path) -> None:
    reg = Registry("digits", "model", root=tmp_path)
    assert reg.versions() == [] and reg.live() == BASE
    first = reg.register(b"weights-1", parent=BASE, training_size=10, metrics={"loss_after": 0.5})
    second = reg.register(b"weights-2", parent="v1", training_size=20)
    assert [m.version for m in reg.versions()] == ["v1", "v2"]
    assert first.weights_sha256 == hashlib.sha256(b"weights-1").hexdigest()
    assert reg.manifest("v2") == second and second.parent == "v1" and second.training_size == 20
    assert reg.weights("v1") == b"weights-1"
    doc = json.loads((tmp_path / "digits" / "model" / "v1" / "manifest.json").read_text())
    assert doc["metrics"] == {"loss_after": 0.5} and doc["parent"] == BASE


def test_weights_that_fail_their_hash_are_refused(tmp_path: Path) -> None:
    reg = Registry("digits", "model", root=tmp_path)
    reg.register(b"good", parent=BASE, training_size=1)
    (tmp_path / "digits" / "model" / "v1" / "weights.bin").write_bytes(b"evil")
    with pytest.raises(RegistryError, match="do not match their manifest"):
        reg.weights("v1")


def test_unknown_version_says_what_exists(tmp_path: Path) -> None:
    reg = Registry("digits", "model", root=tmp_path)
    reg.register(b"w", parent=BASE, training_size=1)
    with pytest.raises(RegistryError, match=r"no version 'v7' \(registered: v1"):
        reg.weights("v7")
    with pytest.raises(RegistryError, match="no version"):
        reg.promote("../v1")


def test_promote_and_rollback_keep_a_history(tmp_path: Path) -> None:
    reg = Registry("digits", "model", root=tmp_path)
    for i in range(2):
        reg.register(f"w{i}".encode(), parent=BASE, training_size=1)
    assert reg.promote("v1") == BASE
    assert reg.promote("v2") == "v1"
    assert (reg.live(), reg.history()) == ("v2", [BASE, "v1"])
    assert reg.rollback() == ("v2", "v1")
    assert reg.rollback() == ("v1", BASE)
    with pytest.raises(RegistryError, match="nothing to roll back to"):
        reg.rollback()


def test_registry_lives_under_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWSERVE_CACHE", str(tmp_path))
    assert Registry("digits", "model").dir == tmp_path / "models" / "digits" / "model"
    with pytest.raises(RegistryError, match="cannot name a directory"):
        Registry("digits", "../x")


def test_shadow_names() -> None:
    assert names.shadow_node("model") == "model-shadow"
    assert names.shadow_topic("fs.digits", "model", "logits") == "fs.digits.model.shadow.logits"


def test_training_set_joins_latest_feedback_with_inputs() -> None:
    fb = [Feedback("a", {"label": np.array([1])}, ts_ms=1), Feedback("b", {"label": np.array([2])}, ts_ms=1),
          Feedback("a", {"label": np.array([3])}, ts_ms=2), Feedback("zz", {"label": np.array([4])}, ts_ms=1)]
    inputs = {"a": {"x": np.full((1, 2), 1.0)}, "b": {"x": np.full((1, 2), 2.0)}}
    data = join_training_set(fb, inputs)
    assert data.request_ids == ["a", "b"] and data.missing == 1 and data.feedback == 4
    assert data.targets["label"].tolist() == [3, 2]
    assert data.inputs["x"].tolist() == [[1.0, 1.0], [2.0, 2.0]]


class _Plain(Component):
    inputs = {"x": Port("FP32", [-1, 1])}
    outputs = {"label": Port("INT64", [-1])}


def test_a_missing_capability_is_named_with_its_kind_and_outputs_are_scored_by_name() -> None:
    c = _Plain(node="m")
    assert not c.retrainable and c.model_version is None and not isinstance(c, Retrainable)
    with pytest.raises(ComponentError, match="node 'm': _Plain cannot retrain: it lacks retrain, load_weights") as info:
        require(c, Retrainable, "retrain")
    assert info.value.kind == ErrorKind.INVALID_TOPOLOGY
    right = score(c, {"label": np.array([1, 2, 3])}, {"label": np.array([1, 0, 3])})
    assert right.tolist() == [True, False, True]
