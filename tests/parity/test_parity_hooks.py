"""The encoder and decoder hooks and the decoder loop's record handling, without a broker (records built by hand)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from flowserve.kafka.settings import KafkaSettings
from flowserve.parity.groups import Member
from flowserve.parity.hooks import DecoderHooks, DecoderLoop, EncoderHooks, decode_members, targets_of
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import BatchOutcome
from flowserve.runtime.join import Ready
from flowserve.topology import load_topology_text
from flowserve.wire.envelope import H_ERROR, H_ID, H_PARITY_MEMBERS, H_RECONSTRUCTED
from flowserve.wire.tensors import decode_tensors, encode_tensors

TOPOLOGY = """
name: hk
partitions: 4
nodes:
  pre: {component: fs_testkit:AddOne, inputs: {x: input.x}}
  model: {component: fs_testkit:Affine, params: {mul: 3.0}, inputs: {x: pre.x}, parity: {k: 2, wait_ms: 50}}
  post: {component: fs_testkit:AddOne, inputs: {x: model.x}}
outputs: {y: post.x}
"""


@dataclass
class Rec:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    offset: int = 0


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


def test_the_encoder_hook_queues_one_parity_query_per_group_with_its_members() -> None:
    t = load_topology_text(TOPOLOGY)
    (target,) = targets_of(t, t.nodes["pre"])
    assert (target.node, target.out_port, target.in_port, target.topic) == ("model", "x", "x", "fs.hk.model.parity")
    assert targets_of(t, t.nodes["model"]) == []
    hook = EncoderHooks([target], partitions=4)
    sent: list[tuple] = []
    hook._emit = lambda *record: sent.append(record)  # what StageContext.emit would queue
    items = [Item(Ready(f"r{i}", {}, {"fs-deadline": b"99"}, partition)) for i, partition in enumerate([0, 1, 2])]
    token = hook.begin(items)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    hook.end(token, BatchOutcome([1, 1, 1], {"x": x}, {}, {}))
    # r0 (stripe 0) and r1 (stripe 0) cannot share a group; r2 (stripe 1) completes r0's
    assert len(sent) == 1
    topic, partition, key, value, headers = sent[0]
    assert (topic, partition, key) == ("fs.hk.model.parity", 0, b"r0~p2")
    np.testing.assert_array_equal(decode_tensors(value)["x"], x[0:1] + x[2:3])
    members = decode_members(dict(headers)[H_PARITY_MEMBERS])
    assert [(m.request_id, m.partition, m.headers) for m in members] == [("r0", 0, {"fs-deadline": b"99"}),
                                                                         ("r2", 2, {"fs-deadline": b"99"})]
    assert hook.counters() == {"parity_groups": 1, "parity_queries": 1, "parity_abandoned": 0}


def test_the_encoder_hook_uses_the_declared_encoder() -> None:
    t = load_topology_text(TOPOLOGY.replace("wait_ms: 50}", "wait_ms: 50, encoder: concat}"))
    (target,) = targets_of(t, t.nodes["pre"])
    hook = EncoderHooks([target], partitions=4)
    sent: list[tuple] = []
    hook._emit = lambda *record: sent.append(record)
    token = hook.begin([Item(Ready(f"r{i}", {}, {}, partition)) for i, partition in enumerate([0, 2])])
    x = np.array([[1, 3, 5, 7], [2, 4, 6, 8]], np.float32)  # two 2x2 images
    hook.end(token, BatchOutcome([1, 1], {"x": x}, {}, {}))
    ((_, _, _, value, _),) = sent
    # each image halved in width (pixel pairs averaged), side by side: [[2, 3], [6, 7]]
    np.testing.assert_array_equal(decode_tensors(value)["x"], np.array([[2, 3, 6, 7]], np.float32))


def test_a_parity_output_completing_a_group_queues_the_rebuilt_output_in_the_outbox_with_lineage_and_action(
) -> None:
    t = load_topology_text(TOPOLOGY)
    loop = DecoderLoop(t, "model", KafkaSettings())
    hook = DecoderHooks(loop)
    sent: list[tuple] = []
    hook._emit = lambda *record: sent.append(record)  # what StageContext.emit would queue
    members = json.dumps([["a", 1, {"fs-deadline": "99"}], ["b", 3, {}]]).encode()
    real_a = Rec("fs.hk.model.x", 1, b"a", encode_tensors({"x": np.full((1, 4), 3, np.float32)}))
    error_b = Rec("fs.hk.model.x", 3, b"b", encode_tensors({}), [(H_ERROR, b"boom")])
    assert loop.step({TP(r.topic, r.partition): [r] for r in (real_a, error_b)}) == []
    # the parity worker's batch: a parity query (its members in the header) and one that failed
    token = hook.begin([Item(Ready("a~p2", {}, {H_PARITY_MEMBERS: members}, 1)),
                        Item(Ready("c~p2", {}, {H_PARITY_MEMBERS: b"[]"}, 0))])
    hook.end(token, BatchOutcome([1, 1], {"x": np.full((2, 4), 7, np.float32)}, {}, {1: "boom"}))
    assert [(topic, partition, key) for topic, partition, key, _, _ in sent] == [
        ("fs.hk.model.x", 3, b"b"), (t.lineage_topic, 3, b"b"), (t.actions_topic, 3, b"b")]
    _, _, _, value, headers = sent[0]
    np.testing.assert_array_equal(decode_tensors(value)["x"], np.full((1, 4), 4, np.float32))
    assert dict(headers)[H_RECONSTRUCTED] == b"a~p2" and dict(headers)[H_ID] == b"b"
    lineage = json.loads(sent[1][3])
    assert lineage["request_id"] == "b" and lineage["reconstructed"] == {"group": "a~p2", "members": ["a", "b"]}
    action = json.loads(sent[2][3])  # what flowserve ui lists among recent actions
    assert (action["source"], action["node"]) == ("parity", "model")
    assert action["action"] == {"reconstructed": "b", "group": "a~p2", "members": ["a", "b"]}
    # its own echo is not a late real output; the real one that comes later is
    echo = Rec("fs.hk.model.x", 3, b"b", value, list(headers))
    late = Rec("fs.hk.model.x", 3, b"b", encode_tensors({"x": np.full((1, 4), 4, np.float32)}))
    assert loop.step({TP(echo.topic, 3): [echo, late]}) == []
    assert hook.counters() == {"parity_outputs": 1, "reconstructed": 1, "parity_late_real": 1,
                               "parity_lost_groups": 0}


def test_a_real_output_completing_a_group_is_rebuilt_by_the_decoder_loop() -> None:
    t = load_topology_text(TOPOLOGY)
    loop = DecoderLoop(t, "model", KafkaSettings())
    members = [Member("a", 1), Member("b", 3)]
    assert loop.parity("a~p2", members, {"x": np.full((1, 4), 7, np.float32)}) == []  # nothing arrived yet
    real_b = Rec("fs.hk.model.x", 3, b"b", encode_tensors({"x": np.full((1, 4), 5, np.float32)}))
    out = loop.step({TP(real_b.topic, 3): [real_b]})
    assert [(topic, key, partition) for topic, key, _, partition, _ in out] == [
        ("fs.hk.model.x", b"a", 1), (t.lineage_topic, b"a", 1), (t.actions_topic, b"a", 1)]
    np.testing.assert_array_equal(decode_tensors(out[0][2])["x"], np.full((1, 4), 2, np.float32))
