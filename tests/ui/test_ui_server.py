"""The page's JSON endpoints on a running digits deployment (both brokers), and shortened request ids."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr
from ui_deploy import running_digits, until

from flowserve.capture.lineage import AmbiguousRequestId, lineage
from flowserve.cli.ui import sources
from flowserve.control.faust_host import send_command
from flowserve.ui import UiServer, UiSettings

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"  # noqa: S105 - a test token


async def _get(http: aiohttp.ClientSession, url: str, *, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.get(url, headers=headers) as res:
        return res.status, await res.json(content_type=None)


async def test_endpoints_serve_live_figures_history_drift_and_lineage(kafka, unique_name) -> None:
    settings = UiSettings(port=0, poll_s=0.5, tokens=(SecretStr(TOKEN),))
    async with running_digits(kafka, unique_name) as deployment, \
            UiServer([deployment.topology], sources(kafka), settings) as ui, aiohttp.ClientSession() as http:
        api = f"{ui.url}/api"
        status, body = await _get(http, f"{api}/topologies", token=None)
        assert status == 401 and body == {"error": "missing or wrong bearer token"}
        assert (await _get(http, f"{api}/topologies", token="wrong"))[0] == 401
        async with http.get(f"{ui.url}/") as res:  # the page itself holds no data: no token needed
            assert res.status == 200 and "app.js" in await res.text()
        async with http.get(f"{ui.url}/static/app.js") as res:
            assert res.status == 200 and res.content_type == "text/javascript"
        for name in ("..%2Fserver.py", "graph.py"):
            async with http.get(f"{ui.url}/static/{name}") as res:
                assert res.status == 404

        status, body = await _get(http, f"{api}/topologies")
        assert status == 200
        [graph] = body["topologies"]
        kinds = {n["id"]: n["kind"] for n in graph["nodes"]}
        assert kinds == {"input": "input", "outputs": "outputs", "pre": "stage", "model": "stage", "post": "stage",
                         "input_drift": "side"}
        assert {(e["from"], e["to"]) for e in graph["edges"]} == {
            ("input", "pre"), ("pre", "model"), ("model", "post"), ("pre", "input_drift"), ("post", "outputs")}
        assert (await _get(http, f"{api}/nope/stats"))[0] == 404

        nodes = ["pre", "model", "post", "input_drift"]

        async def every_node_reports() -> bool:
            stats = (await _get(http, f"{api}/{unique_name}/stats"))[1]
            return all(stats["nodes"][n]["workers"] == 1 and stats["nodes"][n]["counters"]["requests_ok"] > 0
                       for n in nodes)

        await until(every_node_reports, what="a snapshot with requests from every node")
        await send_command(deployment.topology, kafka, "stats", node="model")  # an operator's action

        async def action_shown() -> bool:
            return bool((await _get(http, f"{api}/{unique_name}/stats"))[1]["actions"])

        await until(action_shown, what="the operator's command among the actions")
        first = (await _get(http, f"{api}/{unique_name}/stats"))[1]

        async def figures_moved() -> bool:
            stats = (await _get(http, f"{api}/{unique_name}/stats"))[1]
            return all(stats["nodes"][n]["counters"]["requests_ok"] > first["nodes"][n]["counters"]["requests_ok"]
                       for n in nodes) and bool(stats["drift"])

        await until(figures_moved, what="every node's figures to change, and a drift window")
        stats = (await _get(http, f"{api}/{unique_name}/stats"))[1]
        for n in nodes:
            figures = stats["nodes"][n]
            assert figures["health"] in ("ok", "lagging")
            assert figures["batch_mean"] >= 1 and figures["exec_p99_ms"] > 0
            assert figures["counters"]["dead_lettered"] == 0
        [(key, detector)] = stats["drift"].items()
        assert key.startswith("input_drift") and 0 <= detector["p_val"] <= 1 and detector["windows"] >= 1
        assert stats["panels"] == {"drift": True, "lineage": True, "actions": True, "models": False}
        [action] = stats["actions"]
        assert action["source"] == "control" and action["action"]["command"] == "stats"
        assert action["action"]["node"] == "model"

        status, history = await _get(http, f"{api}/{unique_name}/history?last=5")
        assert status == 200 and set(history["nodes"]) == set(nodes)
        assert all(1 <= len(points) <= 5 for points in history["nodes"].values())
        assert set(history["nodes"]["model"][-1]) == {"ts_ms", "rate_rps", "exec_p99_ms", "lag", "batch_mean"}
        assert list(history["drift"]) == [key]
        assert (await _get(http, f"{api}/{unique_name}/history?last=x"))[0] == 400

        rid = deployment.request_ids[0]
        status, found = await _get(http, f"{api}/{unique_name}/lineage?id={rid[:12]}")  # as `run --sample` shows
        assert status == 200, found
        assert found["request_id"] == rid
        assert {s["node"] for s in found["steps"]} == set(nodes)
        assert found["steps"][0]["node"] == "pre" and found["steps"][0]["offset_ms"] == 0
        pre_input = found["steps"][0]["inputs"][0]
        assert pre_input["topic"] == deployment.topology.inputs_topic
        assert pre_input["tensors"][0].startswith("pixels: FP32 [1, 64]")
        assert all(s["batch_ms"] is not None and s["batch_size"] >= 1 for s in found["steps"])
        status, missing = await _get(http, f"{api}/{unique_name}/lineage?id=ffffffffffffffff")
        assert status == 404 and "no lineage" in missing["error"]
        assert (await _get(http, f"{api}/{unique_name}/lineage?id=ab"))[0] == 400


async def test_lineage_accepts_a_unique_prefix_and_names_an_ambiguous_one(kafka, unique_name) -> None:
    async with running_digits(kafka, unique_name) as deployment:
        async def enough() -> bool:
            return len(deployment.request_ids) >= 40

        await until(enough, what="40 replies")
    rid = deployment.request_ids[0]
    steps = await lineage(kafka, rid[:12], unique_name, with_tensors=False)
    assert {s.record["request_id"] for s in steps} == {rid}
    assert {s.node for s in steps} == {"pre", "model", "post", "input_drift"}
    assert [s.record for s in await lineage(kafka, rid, unique_name, with_tensors=False)] == \
        [s.record for s in steps]
    # 40 hex ids, 16 first digits: some digit starts two or more of them
    firsts = [r[0] for r in deployment.request_ids]
    shared = next(c for c in "0123456789abcdef" if firsts.count(c) >= 2)
    with pytest.raises(AmbiguousRequestId, match=f"request id '{shared}' is the start of"):
        await lineage(kafka, shared, unique_name, with_tensors=False)
