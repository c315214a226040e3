"""The page's data without a broker: the graph and its layout, and the figures folded from snapshots."""

from __future__ import annotations

from pathlib import Path

from flowserve.topology import load_topology, load_topology_text
from flowserve.ui import LiveState, graph_view
from flowserve.ui.graph import COLUMN_W
from flowserve.ui.live import LAG_WARN, STALE_S

REPO = Path(__file__).resolve().parents[2]


def _positions(graph: dict) -> dict[str, tuple[int, int]]:
    return {n["id"]: (n["x"], n["y"]) for n in graph["nodes"]}


def test_graph_has_every_node_port_topic_and_fused_and_side_kinds() -> None:
    graph = graph_view(load_topology(REPO / "topologies" / "digits-drift.yaml"))
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert nodes["input_drift"]["kind"] == "side" and nodes["model"]["kind"] == "stage"
    assert nodes["model"]["ports"] == {"in": ["x"], "out": ["logits"]}
    assert nodes["model"]["topics"] == {"logits": "fs.digits-drift.model.logits"}
    assert {(e["from"], e["to"], e["topic"]) for e in graph["edges"]} >= {
        ("pre", "model", "fs.digits-drift.pre.x"), ("pre", "input_drift", "fs.digits-drift.pre.x")}
    pos = _positions(graph)
    assert pos["input"][0] < pos["pre"][0] < pos["model"][0] < pos["post"][0] < pos["outputs"][0]
    assert pos["input_drift"][0] == pos["model"][0] and pos["input_drift"][1] > pos["model"][1]  # below the path

    fused = graph_view(load_topology(REPO / "topologies" / "digits-fused.yaml"))
    [chain] = [n for n in fused["nodes"] if n["kind"] == "fused"]
    assert len(chain["members"]) >= 2


def test_joins_are_marked_and_a_fan_in_sits_after_both_branches() -> None:
    graph = graph_view(load_topology(REPO / "topologies" / "ensemble.yaml"))
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert nodes["avg"]["join"] == "deadline"
    pos = _positions(graph)
    assert pos["avg"][0] > max(pos["cnn_probs"][0], pos["mlp_probs"][0])


def test_fifty_nodes_get_distinct_places_in_a_bounded_canvas() -> None:
    lines = ["name: wide", "nodes:", "  n0: {component: fs_testkit:AddOne, inputs: {x: input.x}}"]
    lines += [f"  n{i}: {{component: fs_testkit:AddOne, inputs: {{x: n{(i - 1) // 4}.x}}}}" for i in range(1, 50)]
    lines += ["outputs: {y: n0.x}"]
    graph = graph_view(load_topology_text("\n".join(lines)))
    pos = _positions(graph)
    assert len(pos) == 52 and len(set(pos.values())) == 52
    assert all(0 <= x < graph["width"] and 0 <= y < graph["height"] for x, y in pos.values())
    assert graph["width"] <= 6 * COLUMN_W + 40  # depth 4 plus the ends: six columns, not fifty


def _snap(node: str, worker: str, ts_ms: int, ok: int, *, lag: int = 0, dead: int = 0) -> dict:
    return {"node": node, "worker": worker, "ts_ms": ts_ms,
            "counters": {"requests_ok": ok, "dead_lettered": dead, "refused": 1},
            "metrics": {"lag": lag, "batch.size": {"count": 10, "mean": 4.0, "p99": 8},
                        "batch.exec_time": {"count": 10, "p50": 2.0, "p99": 5.0},
                        "queue.wait": {"count": 10, "p50": 1.0, "p99": 3.0}}}


def test_figures_sum_workers_rate_from_counters_and_health() -> None:
    live = LiveState(["a", "b", "c"])
    live.update([_snap("a", "w1", 1000, 100), _snap("a", "w2", 1000, 50), _snap("b", "w3", 1000, 10)], now_ms=1000)
    a = live.stats()["nodes"]["a"]
    assert (a["workers"], a["counters"]["requests_ok"], a["counters"]["refused"]) == (2, 150, 2)
    assert (a["batch_mean"], a["batch_p99"], a["exec_p99_ms"], a["wait_p99_ms"]) == (4.0, 8, 5.0, 3.0)
    assert a["health"] == "ok" and a["rate_rps"] == 0.0  # no earlier snapshot to take a rate from
    assert live.stats()["nodes"]["c"]["health"] == "unknown"

    live.update([_snap("a", "w1", 3000, 300), _snap("a", "w2", 3000, 50),
                 _snap("b", "w3", 3000, 12, dead=2)], now_ms=3000)
    stats = live.stats()["nodes"]
    assert stats["a"]["rate_rps"] == 100.0  # 200 more in 2 s
    assert stats["b"]["health"] == "failing"  # new dead letters

    live.update([_snap("a", "w1", 5000, 0, lag=LAG_WARN + 1), _snap("b", "w3", 5000, 12, dead=2)],
                now_ms=5000 + int(STALE_S * 1000) - 1)
    stats = live.stats()["nodes"]
    assert stats["a"]["rate_rps"] == 0.0 and stats["a"]["health"] == "lagging"  # a restart is no negative rate
    assert stats["b"]["health"] == "ok"
    live.update([_snap("b", "w3", 5000, 12, dead=2)], now_ms=5000 + int(STALE_S * 1000) + 1000)
    assert live.stats()["nodes"]["b"]["health"] == "down"
    assert [p["rate_rps"] for p in live.series()["a"]] == [0.0, 100.0, 0.0, 0.0]
    assert len(live.series(last=2)["a"]) == 2


def test_energy_counters_are_summed_where_a_node_meters_energy() -> None:
    live = LiveState(["a", "b"])
    metered = [{**_snap("a", w, 1000, 10), "counters": {**_snap("a", w, 1000, 10)["counters"], "energy_mj": mj,
                                                          "energy_idle_mj": 5, "co2e_ug": 40}}
               for w, mj in (("w1", 100), ("w2", 300))]
    live.update([*metered, _snap("b", "w3", 1000, 10)], now_ms=1000)
    nodes = live.stats()["nodes"]
    assert {k: nodes["a"]["counters"][k] for k in ("energy_mj", "energy_idle_mj", "co2e_ug")} == {
        "energy_mj": 400, "energy_idle_mj": 10, "co2e_ug": 80}
    assert "energy_mj" not in nodes["b"]["counters"]  # a node without energy shows none, not zero


async def test_endpoints_without_a_broker_serve_what_the_sources_give() -> None:
    import aiohttp

    from flowserve.ui import UiServer, UiSettings, UiSources

    topology = load_topology(REPO / "topologies" / "digits.yaml")
    polls = iter([[_snap("pre", "w1", 1000, 10)], [_snap("pre", "w1", 3000, 30)]])

    async def snapshots(_: object) -> list[dict]:
        return next(polls, [])

    ui = UiServer([topology], UiSources(snapshots=snapshots), UiSettings(port=0, poll_s=3600))
    async with ui, aiohttp.ClientSession() as http:  # the poller's first read happens at start
        await ui.poll_once()
        async with http.get(f"{ui.url}/api/digits/stats") as res:
            stats = await res.json()
        assert stats["nodes"]["pre"]["counters"]["requests_ok"] == 30
        assert stats["nodes"]["pre"]["rate_rps"] == 10.0
        assert stats["nodes"]["model"]["health"] == "unknown"
        assert stats["panels"] == {"drift": False, "lineage": False, "actions": False, "models": False}
        assert stats["drift"] == {} and stats["actions"] == [] and stats["error"] is None
        async with http.get(f"{ui.url}/api/digits/lineage?id=abcdef012345") as res:
            assert res.status == 404 and (await res.json())["error"] == "lineage is not available here"
        async with http.get(f"{ui.url}/api/digits/history") as res:
            history = await res.json()
        assert [p["rate_rps"] for p in history["nodes"]["pre"]][-1] == 10.0
