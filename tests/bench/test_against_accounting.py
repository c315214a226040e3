"""The accounting of ``flowserve bench gateway --against``: fake slices whose answers are known go in, the
figures and targets that come out are checked. No server and no broker: the bench itself runs end to end
in tests/bench/test_against.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from flowserve.topology import load_topology
from flowserve.wire.v2 import parse_infer
from flowserve_bench.against import FS, OTHER, arrivals, comparison_row, contenders, measure_load
from flowserve_bench.against_targets import targets
from flowserve_bench.load import Request, poisson_slice, request_body
from flowserve_bench.paired import Slice

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _slice(requests: int, seconds: float = 2.0, latency_ms: float = 5.0) -> Slice:
    return Slice(requests, seconds, [latency_ms] * requests)


def _row(fs: list[Slice], other: list[Slice]) -> dict[str, Any]:
    return comparison_row("c8", {FS: fs, OTHER: other}, {FS: 0, OTHER: 0}, {FS: {}, OTHER: {}})


def test_equal_sides_have_ratio_one() -> None:
    row = _row([_slice(200)] * 4, [_slice(200)] * 4)
    assert row["throughput_ratio"] == [1.0, 1.0, 1.0]
    assert row["paired_slices"] == 4


def test_an_empty_slice_drags_the_ratio_down_instead_of_vanishing() -> None:
    # flowserve answered nothing in one of four slices (a stall); the other side answered in all four
    row = _row([_slice(200), _slice(0), _slice(200), _slice(200)], [_slice(200)] * 4)
    ratio, low, high = row["throughput_ratio"]
    assert ratio == pytest.approx(0.75)
    assert low < 1.0 and high <= 1.0
    assert row["paired_slices"] == 4
    assert row[FS]["empty_slices"] == 1 and row[OTHER]["empty_slices"] == 0
    assert row[FS]["throughput_rps"] == pytest.approx(75.0)


def test_an_empty_slice_on_the_other_side_raises_the_ratio() -> None:
    row = _row([_slice(200)] * 4, [_slice(200), _slice(200), _slice(0), _slice(200)])
    assert row["throughput_ratio"][0] == round(4 / 3, 3)


def test_a_side_that_answered_nothing_at_all_has_no_bounded_ratio() -> None:
    row = _row([_slice(200)] * 2, [_slice(0)] * 2)
    assert row["throughput_ratio"] == [None, None, None]  # flowserve / 0: unbounded, written as null
    assert row[OTHER]["throughput_rps"] == 0.0


Ratio = list[float | None]
ISSUE_16 = {"fused_ge_1x_mlserver_all_levels_both_brokers", "fused_p99_at_8_le_1_5x_mlserver",
            "three_stage_ge_1x_at_32_and_up"}


def _loads(ratio: Ratio, p99: Ratio, **at: tuple[Ratio, Ratio]) -> list[dict[str, Any]]:
    """Rows at c1/8/32/128 with ``ratio`` and ``p99``, except the levels named in ``at``."""
    rows = []
    for c in (1, 8, 32, 128):
        r, q = at.get(f"c{c}", (ratio, p99))
        rows.append({"load": f"c{c}", "throughput_ratio": r, "p99_ratio": q})
    return rows


def _runs(ratio: Ratio, p99: Ratio, kinds: tuple[str, ...] = ("embedded", "kafka"),
          **topologies: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs of digits-fused and digits (every level ``ratio``, ``p99``), and of each of ``topologies``."""
    loads = _loads(ratio, p99)
    runs = [{"topology": "digits-fused", "loads": loads}, {"topology": "digits", "loads": loads}]
    runs += [{"topology": name.replace("_", "-"), "plan": {"fuse": {"pre-model-post": ["pre", "model", "post"]}},
              "loads": rows} for name, rows in topologies.items()]
    return {kind: runs for kind in kinds}


def test_targets_read_the_conservative_end_of_each_interval() -> None:
    met = targets(_runs([1.3, 1.05, 1.6], [0.9, 0.7, 1.4]))
    assert {k for k, v in met.items() if v} == ISSUE_16 | {"three_stage_ge_1x_all_levels"}
    # the point estimates still pass, the intervals do not: throughput's low end under 1, p99's high end over 1.5
    missed = targets(_runs([1.3, 0.95, 1.6], [0.9, 0.7, 1.6]))
    assert not any(missed.values()), missed


def test_a_stall_fails_the_throughput_target() -> None:
    stalled = _row([_slice(300), _slice(0), _slice(300), _slice(300)], [_slice(200)] * 4)  # 1.125x on the point
    met = targets(_runs(stalled["throughput_ratio"], [1.0, 1.0, 1.0]))
    assert not met["fused_ge_1x_mlserver_all_levels_both_brokers"]
    assert not targets(_runs([1.3, None, 1.6], [1.0, 1.0, 1.0]))["three_stage_ge_1x_at_32_and_up"]


def test_issue_35_targets_on_a_good_run() -> None:
    good = _runs([1.6, 1.35, 1.9], [0.8, 0.6, 1.1], digits_planned=_loads([1.6, 1.35, 1.9], [0.8, 0.6, 1.1]))
    met = targets(good)
    assert set(met) == ISSUE_16 | {"three_stage_ge_1x_all_levels", "planned_ge_1_3x_all_levels",
                                   "fused_ge_1_2x_all_levels", "fused_p99_at_8_le_1_2x"}
    assert all(met.values()), met


def test_issue_35_targets_fail_a_known_bad_run() -> None:
    # Every point estimate passes every target; the intervals' conservative ends do not: the planned
    # pipeline's low end at c32 is 1.25 (< 1.3), fused's p99 high end at c8 1.3 (> 1.2, within issue 16's
    # 1.5), fused's throughput low end 1.15 (< 1.2, >= issue 16's 1.0), the 3-stage's low end at c1 0.98.
    planned = _loads([1.6, 1.4, 1.9], [0.8, 0.6, 1.1], c32=([1.5, 1.25, 1.8], [0.8, 0.6, 1.1]))
    runs = _runs([1.5, 1.15, 1.9], [0.9, 0.7, 1.3], digits_planned=planned)
    runs = {kind: [*rows[:1], {"topology": "digits", "loads": _loads([1.5, 1.15, 1.9], [0.9, 0.7, 1.3],
                                                                    c1=([1.1, 0.98, 1.2], [0.9, 0.7, 1.3]))},
                   *rows[2:]] for kind, rows in runs.items()}
    met = targets(runs)
    assert met == {"fused_ge_1x_mlserver_all_levels_both_brokers": True, "fused_p99_at_8_le_1_5x_mlserver": True,
                   "three_stage_ge_1x_at_32_and_up": True, "three_stage_ge_1x_all_levels": False,
                   "planned_ge_1_3x_all_levels": False, "fused_ge_1_2x_all_levels": False,
                   "fused_p99_at_8_le_1_2x": False}


def test_the_planned_target_needs_a_plan_that_fused() -> None:
    runs = _runs([1.6, 1.4, 1.9], [0.8, 0.6, 1.1], digits_planned=_loads([1.6, 1.4, 1.9], [0.8, 0.6, 1.1]))
    assert targets(runs)["planned_ge_1_3x_all_levels"]
    for run in runs["kafka"]:
        if run["topology"] == "digits-planned":
            run["plan"] = {"fuse": {}}  # the planner kept every stage apart: not the pipeline the target is about
    assert not targets(runs)["planned_ge_1_3x_all_levels"]


def test_a_level_not_run_fails_its_target() -> None:
    runs = _runs([1.6, 1.4, 1.9], [0.8, 0.6, 1.1], kinds=("given",))
    for run in runs["given"]:
        run["loads"] = [row for row in run["loads"] if row["load"] != "c128"]
    met = targets(runs)
    assert not met["fused_ge_1_2x_all_levels"] and not met["three_stage_ge_1x_all_levels"]
    assert met["fused_p99_at_8_le_1_2x"]


def test_the_image_target_is_decided_where_the_image_topology_ran() -> None:
    image = {"given": [{"topology": "image-classifier-fused", "loads": _loads([1.2, 1.02, 1.4], [0.9, 0.8, 1.0])}]}
    assert targets(image) == {"image_fused_ge_1x_all_levels": True}
    image["given"][0]["loads"][2]["throughput_ratio"] = [1.1, 0.97, 1.3]  # c32's low end under 1
    assert targets(image) == {"image_fused_ge_1x_all_levels": False}
    assert "image_fused_ge_1x_all_levels" not in targets(_runs([2.0, 1.9, 2.1], [0.5, 0.4, 0.6]))


def test_topology_and_plan_arguments() -> None:
    assert contenders(["a.yaml", "b.yaml:b.plan.json", "c.yaml:auto"]) == [
        (Path("a.yaml"), None), (Path("b.yaml"), "b.plan.json"), (Path("c.yaml"), "auto")]
    assert [(p.name, plan) for p, plan in contenders(None)] == [
        ("digits-fused.yaml", None), ("digits.yaml", None), ("digits-planned.yaml", "auto")]


def test_binary_bytes_reach_each_side_intact() -> None:
    png = bytes(range(256)) * 2  # every byte value, as in an image file; not UTF-8
    tensors = {"image": np.array([png], dtype=object)}
    body, headers = request_body(tensors, "base64")
    spec = json.loads(body)["inputs"][0]
    assert spec["parameters"] == {"content_type": "base64"} and spec["shape"] == [1]
    assert base64.b64decode(spec["data"][0]) == png
    assert headers == {"Content-Type": "application/json"}
    assert parse_infer(body, None).tensors["image"][0] == png  # flowserve's gateway reads MLServer's codec
    body, headers = request_body(tensors, "binary")
    assert parse_infer(body, headers["Inference-Header-Content-Length"]).tensors["image"][0] == png
    # numbers are the same V2 JSON in either JSON form
    x = {"pixels": np.arange(4, dtype=np.float32).reshape(1, 4)}
    assert request_body(x, "base64")[0] == request_body(x, "json")[0]


def _dues(rng: np.random.Generator, rate: float, seconds: float) -> list[float]:
    """The arrival times ``poisson_slice`` draws from ``rng`` (its loop, without sending anything)."""
    due, out = 0.0, []
    while (due := due + float(rng.exponential(1.0 / rate))) < seconds:
        out.append(due)
    return out


async def test_both_sides_of_a_pair_get_the_same_arrival_times() -> None:
    turns: list[tuple[str, list[float]]] = []  # (side, its arrival times), in the order the slices ran

    async def drive(side: str, seconds: float, rng: np.random.Generator) -> tuple[Slice, int]:
        turns.append((side, _dues(rng, 100.0, seconds)))
        return _slice(len(turns[-1][1])), 0

    comparison = await measure_load("poisson100", 3, drive, rounds=4, slice_s=1.0, cpu=dict)
    assert [side for side, _ in turns] == [FS, OTHER, OTHER, FS, FS, OTHER, OTHER, FS]
    pairs = [(turns[2 * k][1], turns[2 * k + 1][1]) for k in range(4)]
    for first, second in pairs:
        assert first == second and len(first) > 50
    assert pairs[0][0] != pairs[1][0]  # pairs differ from one another
    assert [len(comparison.slices[s]) for s in (FS, OTHER)] == [4, 4]


class _Counting:
    """A fake V2 target that answers every call at once and counts them."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, request: Request) -> bool:
        self.calls += 1
        return True


async def test_the_load_generator_replays_a_pairs_arrivals_on_each_side() -> None:
    sides = [_Counting(), _Counting()]
    for side in sides:
        piece, errors = await poisson_slice(side, [(b"{}", {})], 4000.0, 0.05, arrivals(0, 2))  # type: ignore[arg-type]
        assert errors == 0 and piece.requests == side.calls
    assert sides[0].calls == sides[1].calls == len(_dues(arrivals(0, 2), 4000.0, 0.05))


@pytest.mark.parametrize(("variant", "original", "fuse"), [
    ("digits-planned", "digits", {}),
    ("image-classifier-fused", "image-classifier", {"classify": ["pre", "model", "post"]}),
])
def test_the_bench_variants_are_their_originals_graphs(variant: str, original: str, fuse: dict[str, Any]) -> None:
    """The planned and fused contenders run what their originals run, under their own names (own topics)."""
    a, b = (yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text()) for name in (variant, original))
    assert a["name"] == variant and load_topology(TOPOLOGIES / f"{variant}.yaml").name == variant
    assert {k: a[k] for k in ("nodes", "outputs", "sample")} == {k: b[k] for k in ("nodes", "outputs", "sample")}
    assert a.get("fuse", {}) == fuse and "fuse" not in b
