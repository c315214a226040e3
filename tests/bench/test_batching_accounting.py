"""The accounting of ``flowserve bench batching``: which policies it deploys, and how its capacity probe turns
probes whose outcome is known into a capacity. Fake probes, no broker and no worker."""

from __future__ import annotations

from typing import Any

import pytest

from flowserve.runtime.batching import FixedPolicy, make_policy
from flowserve.topology import load_topology_text
from flowserve_bench.batching import CAPS, MAX_BATCH, POLICIES, STATICS, topology_text
from flowserve_bench.batching_capacity import REPEATS, keeps_up, median_p99, probe_rate, sustainable_rates

SLO = 100.0


def _probe_cell(sent: int, ok: int, p99_ms: float | None) -> dict[str, Any]:
    return {"sent": sent, "ok": ok, "errors": 0, "p99_ms": p99_ms}


GOOD, STALLED, LATE = _probe_cell(100, 100, 40.0), _probe_cell(100, 60, 900.0), _probe_cell(100, 100, 150.0)


def test_the_statics_span_adaptives_range_up_to_its_cap() -> None:
    assert f"static-{MAX_BATCH}" in STATICS
    assert CAPS["adaptive"] is None  # the component's own max_batch, 256
    assert CAPS[f"static-{MAX_BATCH}"] == MAX_BATCH
    label = f"static-{MAX_BATCH}"
    topology = load_topology_text(topology_text("s", POLICIES[label], CAPS[label]))
    assert topology.nodes["model"].max_batch == MAX_BATCH
    policy = make_policy(topology, "model")  # what its worker runs: batches of up to 256
    assert isinstance(policy, FixedPolicy) and policy.size == MAX_BATCH


def test_one_stalled_probe_of_three_does_not_decide_a_rate() -> None:
    assert keeps_up([GOOD, STALLED, GOOD], SLO)
    assert not keeps_up([GOOD, STALLED, LATE], SLO)
    assert not keeps_up([STALLED, GOOD], SLO)  # half is not a majority
    assert median_p99([GOOD, STALLED, LATE]) == 150.0
    assert median_p99([STALLED, _probe_cell(5, 0, None), _probe_cell(5, 0, None)]) is None


async def test_probes_repeat_per_rate_with_the_policies_taking_turns() -> None:
    calls: list[tuple[str, float, int]] = []

    async def probe(label: str, rate: float, seed: int) -> dict[str, Any]:
        calls.append((label, rate, seed))
        return GOOD

    cells = await probe_rate(probe, ["a", "b", "c"], 50.0, 500)
    assert {k: len(v) for k, v in cells.items()} == dict.fromkeys("abc", REPEATS)
    assert [label for label, _, _ in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # repeat r of every policy replays the same trace (seed + r)
    assert {label: [s for x, _, s in calls if x == label] for label in "abc"} == dict.fromkeys("abc", [500, 501, 502])


#: each fake policy's true capacity (req/s): it keeps up at or below it
TRUE = {"static-1": 40.0, "static-8": 210.0, "static-32": 400.0, "static-256": 520.0}


async def test_capacity_is_the_best_statics_over_repeated_probes() -> None:
    probes: dict[tuple[str, float], int] = {}

    async def probe(label: str, rate: float, seed: int) -> dict[str, Any]:
        k = probes[(label, rate)] = probes.get((label, rate), 0) + 1
        if label == "static-256" and k == 2:  # one stall of the machine in every rate's second probe
            return STALLED
        return GOOD if rate <= TRUE[label] else LATE

    rates = await sustainable_rates(probe, list(TRUE), SLO, start=100.0, ceiling=800.0)
    assert set(probes.values()) == {REPEATS}  # every policy at every rate it was probed at: three probes
    assert rates["static-1"] == 0.0  # fell behind at the first rate, probed there only
    assert {rate for label, rate in probes if label == "static-1"} == {100.0}
    for label in ("static-8", "static-32", "static-256"):
        assert TRUE[label] / 1.2 <= rates[label] <= TRUE[label], (label, rates[label])
    assert max(rates, key=rates.__getitem__) == "static-256"  # the capacity is the strongest static's


async def test_a_policy_that_stalls_in_most_probes_falls_behind() -> None:
    async def probe(label: str, rate: float, seed: int) -> dict[str, Any]:
        return STALLED if label == "b" and rate > 150 and seed % 10 else GOOD  # b: 2 stalls of 3 above 150/s

    rates = await sustainable_rates(probe, ["a", "b"], SLO, start=100.0, ceiling=300.0)
    assert 100.0 <= rates["b"] <= 150.0
    assert rates["a"] >= 300.0  # a keeps up to the ramp's end, 1.5x the drain rate


async def test_the_ramp_steps_down_while_no_policy_keeps_up() -> None:
    async def probe(label: str, rate: float, seed: int) -> dict[str, Any]:
        return GOOD if rate <= 30.0 else LATE

    rates = await sustainable_rates(probe, ["a"], SLO, start=100.0, ceiling=400.0)
    assert rates["a"] == pytest.approx(30.0, rel=0.2) and rates["a"] <= 30.0
