"""The many-model hook without a broker: it drives the scheduler through the component's lanes, answers each
request with the model it named, hands refusals and failures to the worker as failures of their kind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pytest

from flowserve.builtin import Identity
from flowserve.component import Batch
from flowserve.control.faust_host import handle_command
from flowserve.errors import ComponentError, ErrorKind, Failure
from flowserve.kafka.control import model_command
from flowserve.models import ModelHooks, ModelSpec, model_hooks
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import AnsweredInParts, StageContext
from flowserve.runtime.join import Ready
from flowserve.runtime.worker import StageWorker
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_DEADLINE, H_MODEL, H_SERVED_BY, now_ms
from flowserve_components.many_models import EmulatedModels, offset

ZOO = """
name: NAME
nodes:
  zoo:
    component: flowserve_components.many_models:EmulatedModels
    inputs: {x: input.x}
    models:
      names: [a, b, c, {name: slow, latency_ms: {1: 120000.0}}]
      kind: alexnet
      memory_mb: 500
outputs: {y: zoo.y}
"""


class Flaky(EmulatedModels):
    """Loading model ``b`` fails (a corrupt file, say)."""

    def load_model(self, spec: ModelSpec) -> None:
        if spec.name == "b":
            raise OSError("b.pt: truncated")
        super().load_model(spec)


def _hook(write_topology, component: EmulatedModels | None = None) -> tuple[ModelHooks, list[tuple]]:  # noqa: ANN001
    topology = load_topology(write_topology(ZOO))
    node = topology.nodes["zoo"]
    component = component or node.component  # type: ignore[assignment]
    (hook,) = model_hooks()(topology, node, component)  # type: ignore[arg-type]
    assert isinstance(hook, ModelHooks)
    sent: list[tuple] = []
    hook.start(StageContext(topology, node, component, lambda *record: sent.append(record),  # type: ignore[arg-type]
                            lambda r: topology.outputs_topic))
    return hook, sent


def _items(models: Sequence[str | None], timeout_ms: float = 60_000) -> list[Item]:
    out = []
    for i, model in enumerate(models):
        headers = {H_DEADLINE: str(int(now_ms() + timeout_ms)).encode()}
        if model is not None:
            headers[H_MODEL] = model.encode()
        out.append(Item(Ready(f"r{i}", {"x": np.full((1, 4), i, np.float32)}, headers, 0)))
    return out


async def test_each_request_is_answered_by_its_model_and_the_rest_refused_or_failed(write_topology) -> None:
    hook, sent = _hook(write_topology)
    items = _items(["a", "b", "a", "c", "slow", None, "zzz"])
    answer = hook.answer(items, [1] * len(items))
    assert isinstance(answer, AnsweredInParts) and answer.skip == [True] * len(items)
    parts = [part.requests async for part in answer.parts()]
    assert sorted(i for part in parts for i in part) == list(range(len(items)))  # each settled once
    hook.begin(items)
    outputs, mask, errors = answer.complete([1] * len(items), {}, {}, {})
    for i, model in enumerate(["a", "b", "a", "c"]):
        assert items[i].ready.headers[H_SERVED_BY] == model.encode()
        assert outputs["y"][i, 0] == i + offset(model)
    assert mask["y"].tolist() == [True] * 4 + [False] * 3 and not errors
    # the worker writes (and counts) the error results of the requests the hook failed
    assert {i: f.kind for i, f in answer.failures.items()} == {4: ErrorKind.DEADLINE, 5: ErrorKind.INVALID_INPUT,
                                                               6: ErrorKind.INVALID_INPUT}
    assert not sent
    counters = hook.counters()
    assert counters["model_answers"] == 4 and counters["model_refusals"] == 1 and counters["model_loads"] == 3
    assert counters["model/a/answers"] == 2 and counters["model/slow/refusals"] == 1
    hook.close()


async def test_an_answer_leaves_when_its_own_batch_ends_not_with_the_last_load(write_topology) -> None:
    """'a' is resident, 'b' must load first: 'a''s answer is a part of its own, before 'b''s load ends."""
    hook, _ = _hook(write_topology)
    assert hook.load("a")
    items = _items(["b", "a"])
    answer = hook.answer(items, [1, 1])
    parts = []
    async for part in answer.parts():
        parts.append(list(part.requests))
        outputs, _, _ = part.answer.complete([1] * len(part.requests), {}, {}, {})
        assert outputs["y"][:, 0].tolist() == [i + offset(_model_of(items[i])) for i in part.requests]
    assert parts == [[1], [0]]
    assert not answer.failures
    hook.close()


async def test_closed_early_the_answer_still_settles_its_requests(write_topology) -> None:
    """The worker gave up on a batch (a failed produce): the scheduler is left with nothing of it, so the
    next batch (the same request ids) is served whole."""
    hook, _ = _hook(write_topology)
    assert hook.load("a")
    answer = hook.answer(_items(["b", "a", "c"]), [1] * 3)
    parts = answer.parts()
    assert (await anext(parts)).requests == [1]
    await parts.aclose()
    assert all(s is not None for s in answer.served) and not hook.scheduler.loading
    assert not any(hook.scheduler.queues.values())
    again = hook.answer(_items(["c", "b", "a"]), [1] * 3)
    assert sorted(i for part in [p.requests async for p in again.parts()] for i in part) == [0, 1, 2]
    assert all(isinstance(s, dict) for s in again.served)
    hook.close()


def _model_of(item: Item) -> str:
    return item.ready.headers[H_MODEL].decode()


def test_a_failed_load_fails_its_requests_and_leaves_nothing_resident(write_topology) -> None:
    hook, _ = _hook(write_topology, Flaky())
    served = hook.serve(_items(["b", "a"]))
    assert isinstance(served[0], Failure) and served[0].kind is ErrorKind.COMPONENT_FAILURE
    assert "b.pt: truncated" in served[0].reason
    assert isinstance(served[1], dict)
    assert "b" not in hook.scheduler.memory and "b" not in hook.scheduler.ready
    hook.close()


def test_load_and_unload_between_batches(write_topology) -> None:
    hook, _ = _hook(write_topology)
    component = hook.component
    assert isinstance(component, EmulatedModels)
    assert hook.load("c") and not hook.load("c")  # resident already
    assert ("load", "c") in component.log and "c" in hook.scheduler.ready
    assert hook.unload("c") and not hook.unload("c")
    assert ("unload", "c") in component.log and "c" not in hook.scheduler.memory
    assert hook.per_model()["c"] == {"resident": 0, "loading": 0, "loads": 1, "evictions": 1, "refusals": 0,
                                     "answers": 0}
    hook.close()


def test_a_component_without_the_capability_is_refused_naming_the_node(write_topology) -> None:
    topology = load_topology(write_topology(ZOO))
    with pytest.raises(ComponentError, match="node 'zoo'.*cannot serve many models.*load_model"):
        model_hooks()(topology, topology.nodes["zoo"], Identity(node="zoo"))


def test_process_alone_says_the_hook_is_missing() -> None:
    with pytest.raises(Exception, match="needs the models hook"):
        EmulatedModels(node="zoo").process(Batch({"x": np.zeros((1, 4), np.float32)}, [1], ["r0"]))


def test_the_faust_host_leaves_model_commands_to_the_hook(caplog: pytest.LogCaptureFixture) -> None:
    worker = cast(StageWorker, None)  # the host must not touch the worker for a command that is not its own
    assert handle_command(worker, model_command("zoo", "a", "load")) == "a feature's command"
    assert handle_command(worker, {"command": "bogus"}) == "ignored"
    assert [r.getMessage()[:26] for r in caplog.records] == ["ignoring control message {"]


def test_a_snapshot_shows_the_resident_models_first(write_topology, monkeypatch: pytest.MonkeyPatch) -> None:
    hook, _ = _hook(write_topology)
    hook.serve(_items(["a", "a", "a", "b"]))
    hook.unload("a")  # the busiest, but no longer resident
    monkeypatch.setattr("flowserve.models.stage.PER_MODEL_SHOWN", 1)
    shown = {key.split("/")[1] for key in hook.counters() if key.startswith("model/")}
    assert shown == {"b"}
    hook.close()
