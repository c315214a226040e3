"""The explain side branch on a real broker: digits with ``explain: {sample: 1.0}``, requests answered by the
pipeline, and their explanations read back from the explanations topic by request id, complete within 1%."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from flowserve.capture import capture_hooks
from flowserve.capture.lineage import explanations, lineage, run_lineage
from flowserve.cli import main
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.explain import Explanation
from flowserve.explain.service import Explainer
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology_text

pytest.importorskip("captum")
pytest.importorskip("flowserve_components")
pytestmark = pytest.mark.integration

DIGITS = """
name: NAME
partitions: 2
nodes:
  pre:
    component: flowserve_components.digits:Normalize
    inputs: {pixels: input.pixels}
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {model: digits-mlp, threads: 1}
    inputs: {x: pre.x}
  post:
    component: flowserve_components.postprocess:ArgMax
    inputs: {logits: model.logits}
outputs: {label: post.label, probs: post.probs}
explain: {sample: SAMPLE}
capture: {sample: 1.0, lineage: true, tracing: false}
"""


async def _read(kafka, topic: str, wanted: set[str], timeout_s: float = 120.0) -> dict[str, dict]:  # noqa: ANN001
    """The explanation records of ``wanted`` request ids, read as they arrive."""
    consumer = AIOKafkaConsumer(topic, group_id=None, auto_offset_reset="earliest", **kafka.client_kwargs())
    await consumer.start()
    found: dict[str, dict] = {}
    try:
        async with asyncio.timeout(timeout_s):
            while not wanted <= set(found):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for rec in records:
                        found[rec.key.decode()] = json.loads(rec.value)
    finally:
        await consumer.stop()
    return found


async def test_sampled_requests_are_explained_on_the_explanations_topic_by_request_id(
        kafka, unique_name, write_topology, capsys) -> None:  # noqa: ANN001
    from flowserve_components.digits import sample

    path = write_topology(DIGITS.replace("SAMPLE", "1.0"))
    topology = load_topology_text(path.read_text())
    requests, _ = sample(6, seed=7)
    ids = [f"x-{i}" for i in range(len(requests))]
    explainer = Explainer(topology, kafka)
    async with InlineHost(topology, kafka, hooks=capture_hooks), TopologyClient(topology, kafka) as client:
        task = asyncio.create_task(explainer.run())
        try:
            await wait_ready(client, requests[0])
            futures = [client.expect(rid) for rid in ids]
            for rid, request in zip(ids, requests, strict=True):
                await client.queue(request, request_id=rid)
            await client.flush()
            replies = await asyncio.wait_for(asyncio.gather(*futures), 60)
            assert [r.error for r in replies] == [None] * len(ids)
            found = await _read(kafka, topology.explanations_topic, set(ids))
        finally:
            explainer.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
    for rid, reply in zip(ids, replies, strict=True):
        body = found[rid]
        assert "error" not in body, body
        e = Explanation.from_json(body)
        assert e.request_id == rid and e.method == "integrated_gradients" and e.output == "probs"
        # the explained class is the label the pipeline answered, its probability the one it answered
        assert e.classes == [int(np.asarray(reply.tensors["label"]).ravel()[0])]
        assert e.f_x[0] == pytest.approx(float(np.asarray(reply.tensors["probs"]).max()), rel=1e-4)
        gap = e.f_x[0] - e.f_baseline[0]
        assert abs(e.sums[0] - gap) <= 0.01 * abs(gap)
    assert explainer.failed == 0 and explainer.explained >= len(ids)

    # from a request id through lineage: its hops, and the explanation joined to them
    steps = await lineage(kafka, ids[0], unique_name, with_tensors=False)
    assert [s.node for s in steps] == ["pre", "model", "post"]
    (joined,) = await explanations(kafka, ids[0], unique_name)
    assert joined == found[ids[0]]
    capsys.readouterr()
    assert await asyncio.to_thread(run_lineage, kafka, ids[0], unique_name, fmt="text") == 0
    shown = capsys.readouterr().out
    assert f"request {ids[0]}: 3 step(s)" in shown and "explanation (integrated_gradients) of probs" in shown

    # on demand, from the request's inputs on the topic: the same attributions the side branch wrote
    argv = ["explain", str(path), ids[1], "--broker", kafka.bootstrap, "--format", "json"]
    assert await asyncio.to_thread(main, argv) == 0
    again = Explanation.from_json(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    side = Explanation.from_json(found[ids[1]])
    assert again.classes == side.classes
    np.testing.assert_allclose(again.attributions["pixels"], side.attributions["pixels"], rtol=1e-4, atol=1e-6)
    assert await asyncio.to_thread(main, argv[:-2]) == 0  # text: the figures and the 8x8 heat map
    text = capsys.readouterr().out
    assert f"request {ids[1]}: integrated_gradients of probs" in text and "completeness gap" in text
    assert sum(1 for line in text.splitlines() if line.startswith("    ") and len(line) == 20) == 8


def _children(pid: int, word: bytes) -> list[int]:
    """The child processes of ``pid`` whose command line holds ``word`` (from /proc, Linux)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in map(int, (task / "children").read_text().split()):
            with contextlib.suppress(FileNotFoundError):
                if word in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                    out.append(child)
    return out


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
async def test_flowserve_run_starts_the_explainer_and_stops_it(kafka, write_topology) -> None:  # noqa: ANN001
    from flowserve_components.digits import sample

    path = write_topology(DIGITS.replace("SAMPLE", "1.0"))
    topology = load_topology_text(path.read_text())
    proc = subprocess.Popen([sys.executable, "-m", "flowserve", "run", str(path), "--broker", kafka.bootstrap],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "400",
                                 "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms)})
    explainers: list[int] = []
    try:
        assert proc.stderr is not None
        seen = ""
        while "running" not in seen:  # printed once the topics exist and the processes are started
            line = await asyncio.to_thread(proc.stderr.readline)
            assert line, seen
            seen += line
        # Keep reading: the workers and the explainer inherit this pipe, and one that fills (64 KiB of logs
        # nobody reads) blocks them on a write, so that they can neither serve nor stop.
        rest: list[str] = []
        threading.Thread(target=lambda: rest.extend(proc.stderr or ()), daemon=True).start()
        explainers = _children(proc.pid, b"explainer")
        assert len(explainers) == 1, seen
        requests, _ = sample(3, seed=11)
        ids = [f"run-{i}" for i in range(len(requests))]
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, requests[0])
            calls = (client.call(r, request_id=rid) for rid, r in zip(ids, requests, strict=True))
            replies = await asyncio.gather(*calls)
        assert [r.error for r in replies] == [None] * len(ids)
        found = await _read(kafka, topology.explanations_topic, set(ids))
        assert all("error" not in found[rid] and found[rid]["method"] == "integrated_gradients" for rid in ids)
        # SIGTERM, the signal a container stop sends: SIGINT would be ignored where the test run itself was
        # started in the background of a non-interactive shell (it then ignores SIGINT, and so does every
        # process it starts; Python installs no KeyboardInterrupt handler for a signal ignored at start)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0, "".join(rest)[-3000:]
        assert not any(_alive(pid) for pid in explainers)  # run stopped its explainer too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in explainers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
