"""``flowserve run --plan`` with a plan whose planner fused digits' three stages: every sample request is
answered correctly by the one fused worker, and capture still writes the chain's inner edges (side topics)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from fs_topics import read_to_end

from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology
from flowserve.tuning.fusion_plan import make_fused_plan
from flowserve.tuning.plan import save_plan
from flowserve.tuning.traces import generate
from flowserve.wire.tensors import decode_tensors

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 40
RUN_TIMEOUT_S = 240  # a bound on a hung run, not a timing assertion


def test_run_with_a_fused_plan_answers_digits(broker: object, kafka: KafkaSettings, unique_name: str,
                                              tmp_path: Path) -> None:
    text = (REPO / "topologies" / "digits.yaml").read_text().replace("name: digits", f"name: {unique_name}")
    path = tmp_path / f"{unique_name}.yaml"
    path.write_text(text + "capture: {sample: 1.0, lineage: false, tracing: false}\n")
    plan = make_fused_plan(load_topology(path), generate("poisson", rate=50, seconds=10, seed=1).arrivals, 200,
                           hop_ms=5, overhead_ms=5)
    assert plan.fuse == {"pre-model-post": ["pre", "model", "post"]}
    plan_path = save_plan(plan, tmp_path / "digits.plan.json")

    done = subprocess.run(
        [sys.executable, "-m", "flowserve", "run", str(path), "--plan", str(plan_path), "--sample", str(SAMPLES),
         "--broker", broker.bootstrap],  # type: ignore[attr-defined]
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO,
        env={**os.environ, "COLUMNS": "200", "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 worker process(es)" in done.stderr  # the chain's one worker, not three
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["sent"], summary["ok"], summary["errors"], summary["timeouts"]) == (SAMPLES, SAMPLES, 0, 0)
    assert summary["accuracy"] >= 0.9  # the MLP scores ~0.98 on held-out digits

    # the inner edges, tapped: every request answered (the samples and the readiness probes) on both
    base = f"fs.{unique_name}.pre-model-post"
    pre = asyncio.run(read_to_end(kafka, f"{base}.pre.x", plan.partitions))
    logits = asyncio.run(read_to_end(kafka, f"{base}.model.logits", plan.partitions))
    assert len(pre) == len(logits) >= SAMPLES + 1
    assert {r.key for r in pre} == {r.key for r in logits}
    for record in pre:
        tensors = decode_tensors(record.value)
        assert list(tensors) == ["pre.x"] and tensors["pre.x"].shape == (1, 64)
        assert tensors["pre.x"].dtype == np.float32
    for record in logits:
        tensors = decode_tensors(record.value)
        assert list(tensors) == ["model.logits"] and tensors["model.logits"].shape == (1, 10)
