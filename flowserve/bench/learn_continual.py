"""``flowserve bench learn-continual``: drift drops accuracy; feedback → learn → shadow → promote brings it back.

The digits topology (MLP) runs in this process with capture on, version hooks in its workers. Phases:

1. ``pre-drift``: the 450 held-out digits, as they are: the accuracy to get back to.
2. ``drift``: the same 450 digits brightened (``brightness`` shift of ``flowserve run --shift``, the drift
   issue's shift; +6 of 16 by default): the live model's accuracy drops. This is the baseline: the
   topology without continual learning on the drifted stream.
3. ``feedback``: drifted digits from the *training* split flow through the live model, and the truth for
   each is written to ``<base>.feedback`` (as a labelling process would).
4. ``learn``: ``flowserve learn``'s code path: feedback joined with the captured ``pre.x`` of the same
   requests, the live weights fine-tuned, version v1 registered.
5. ``shadow``: v1 runs as a shadow (a side branch with its own consumer group) on a copy of the live
   traffic: the drifted held-out digits again; live (base) and shadow (v1) are scored on the same requests.
6. ``promote``: v1 is promoted when the shadow beat the live version; traffic keeps flowing while the
   workers switch between batches (every request answered once: counted).
7. ``post-promote``: the drifted held-out digits once more, answered by v1.

Target ``recovers_within_3pts``: post-promote accuracy within 3 points of pre-drift accuracy. Accuracies
carry Wilson 95% intervals; the gap (pre-drift minus post-promote, paired by image) a bootstrap interval.
The held-out digits are never trained on (feedback comes from the training split).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.bench.common import console, run_id
from flowserve.capture import capture_hooks
from flowserve.capture.reader import Reader
from flowserve.client import TopologyClient
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.component import import_library
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.settings import KafkaSettings
from flowserve.learning import (
    BASE,
    Registry,
    retrain,
    send_version,
    shadow_topics,
    shadow_worker,
    training_set,
    version_hooks,
)
from flowserve.runtime.hooks import chain
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology_text, names
from flowserve.wire.envelope import H_MODEL_VERSION
from flowserve.wire.feedback import encode_feedback

TOPOLOGY = """
name: {name}
partitions: 2
deadline_ms: 120000
nodes:
  pre: {{component: flowserve_components.digits:Normalize, inputs: {{pixels: input.pixels}}}}
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {{model: digits-mlp, threads: 1}}
    inputs: {{x: pre.x}}
  post: {{component: flowserve_components.postprocess:ArgMax, inputs: {{logits: model.logits}}}}
outputs: {{label: post.label, probs: post.probs}}
capture: {{sample: 1.0, lineage: false, tracing: false}}
"""
WAVE = 50  # requests in flight at once


@dataclass
class Phase:
    name: str
    ids: list[str] = field(default_factory=list)
    right: list[bool] = field(default_factory=list)
    versions: set[str] = field(default_factory=set)
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    note: str = ""

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.right)) if self.right else float("nan")

    def row(self) -> dict[str, Any]:
        lo, hi = wilson(sum(self.right), len(self.right))
        return {"phase": self.name, "requests": len(self.ids), "errors": self.errors,
                "accuracy": round(self.accuracy, 4) if self.right else None,
                "accuracy_ci95": [round(lo, 4), round(hi, 4)] if self.right else None,
                "version_live": "/".join(sorted(self.versions)) or "-",
                "p50_ms": round(float(np.percentile(self.latencies_ms, 50)), 1) if self.latencies_ms else None,
                "note": self.note}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


async def _drive(client: TopologyClient, phase: Phase, pixels: np.ndarray, labels: np.ndarray, prefix: str
                 ) -> dict[str, int]:
    """Send ``pixels`` (raw, [n, 64]) in waves; score the replies into ``phase``; returns labels by id."""
    truth: dict[str, int] = {}
    for start in range(0, len(pixels), WAVE):
        ids = [f"{prefix}{i}" for i in range(start, min(start + WAVE, len(pixels)))]
        futures = [client.expect(rid, 120) for rid in ids]
        sent = time.time() * 1000
        for offset, rid in enumerate(ids):
            await client.queue({"pixels": pixels[start + offset : start + offset + 1]}, request_id=rid)
        await client.flush()
        for offset, (rid, reply) in enumerate(zip(ids, await asyncio.gather(*futures), strict=True)):
            label = int(labels[start + offset])
            truth[rid] = label
            phase.ids.append(rid)
            if reply.error is not None:
                phase.errors += 1
                continue
            phase.right.append(int(reply.tensors["label"].reshape(-1)[0]) == label)
            phase.versions.add(reply.headers.get(H_MODEL_VERSION, b"=?").decode().partition("=")[2])
            phase.latencies_ms.append(reply.received_ms - sent)
    return truth


async def _feedback(kafka: KafkaSettings, topic: str, truth: dict[str, int]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        for rid, label in truth.items():
            key, value, headers = encode_feedback(rid, {"label": np.array([label], np.int64)})
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def _shadow_scores(kafka: KafkaSettings, topics: list[str], truth: dict[str, int]) -> list[bool]:
    """The shadow's logits for ``truth``'s requests, scored; waits (bounded) until all are there."""
    got: dict[str, bool] = {}
    async with Reader(kafka) as reader:
        for _ in range(600):
            for rec in await reader.read(topics):
                if rec.key in truth and "logits" in rec.tensors:
                    got[rec.key] = int(rec.tensors["logits"].argmax()) == truth[rec.key]
            if len(got) == len(truth):
                break
    return [got[rid] for rid in truth if rid in got]


def _gap_interval(before: list[bool], after: list[bool], resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap 95% interval of mean(before) - mean(after), resampling images (paired)."""
    a, b = np.asarray(before, float), np.asarray(after, float)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(a), size=(resamples, len(a)))
    gaps = a[picks].mean(axis=1) - b[picks].mean(axis=1)
    return float(np.percentile(gaps, 2.5)), float(np.percentile(gaps, 97.5))


async def learn_continual_bench(kafka: KafkaSettings, *, amount: float = 6.0, feedback_n: int = 600) -> dict[str, Any]:
    digits = import_library("flowserve_components.digits")
    topology = load_topology_text(TOPOLOGY.format(name=f"bench-learn-{run_id()}"), "<bench learn-continual>")
    prepare_to_drive(topology)
    x_test, y_test = digits.load_split("test")
    order = np.random.default_rng(1).permutation(len(x_test))  # one order for every held-out phase: paired
    clean = np.ascontiguousarray(x_test[order], dtype=np.float32)
    labels = np.asarray(y_test[order])
    drifted = digits.apply_shift(clean, "brightness", amount, np.random.default_rng(2))
    train_req, train_labels = digits.sample(feedback_n, seed=3, split="train", shift="brightness", amount=amount)
    train_pixels = np.concatenate([r["pixels"] for r in train_req])
    registry = Registry(topology.name, "model")
    phases: list[Phase] = []
    feedback_topic = names.feedback_topic(topology.base)
    await ensure_topics(kafka, [feedback_topic, *shadow_topics(topology, "model")], topology.spec.partitions)
    console.print(f"bench learn-continual: topology {topology.name}, brightness shift +{amount}, "
                  f"{feedback_n} feedback records")
    hooks = chain(capture_hooks, version_hooks(kafka))
    async with InlineHost(topology, kafka, hooks=hooks), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"pixels": clean[:1]})
        phases.append(Phase("pre-drift", note="held-out digits as they are"))
        await _drive(client, phases[-1], clean, labels, "pre-")
        phases.append(Phase("drift", note=f"same digits, brightness +{amount}: baseline (no learning)"))
        await _drive(client, phases[-1], drifted, labels, "drift-")
        phases.append(Phase("feedback", note="drifted training-split digits; truth to <base>.feedback"))
        truth = await _drive(client, phases[-1], train_pixels, np.asarray(train_labels), "fb-")
        await _feedback(kafka, feedback_topic, truth)

        learn = Phase("learn")
        t0 = time.perf_counter()
        async with Reader(kafka) as reader:
            data = await training_set(topology, "model", reader)
        manifest = await asyncio.to_thread(retrain, topology, "model", data)
        learn.note = (f"{manifest.version} from {data.size} examples (feedback ⋈ captured pre.x) in "
                      f"{time.perf_counter() - t0:.1f} s; fit accuracy {manifest.metrics['fit_accuracy_before']:.3f}"
                      f" -> {manifest.metrics['fit_accuracy_after']:.3f}")
        learn.versions = {BASE}
        phases.append(learn)

        shadow = shadow_worker(topology, "model", manifest.version, kafka)
        await shadow.start()
        task = asyncio.create_task(shadow.run())
        try:
            live = Phase("shadow", note="drifted held-out digits; live answers, shadow runs on a copy")
            shadow_truth = await _drive(client, live, drifted, labels, "shadow-")
            scored = await _shadow_scores(kafka, shadow_topics(topology, "model"), shadow_truth)
        finally:
            shadow.stop()
            await task
        shadow_acc = float(np.mean(scored)) if scored else float("nan")
        live.note += f"; shadow {manifest.version}: accuracy {shadow_acc:.3f} on {len(scored)}"
        phases.append(live)
        promoted = bool(scored) and shadow_acc > live.accuracy
        switch = Phase("promote", note="traffic flows while workers switch between batches")
        if promoted:
            registry.promote(manifest.version)
            await send_version(topology, kafka, "model", manifest.version)
            for round_ in range(200):
                await _drive(client, switch, drifted[:20], labels[:20], f"switch{round_}-")
                if manifest.version in switch.versions:
                    break
        else:
            switch.note = f"not promoted: shadow {shadow_acc:.3f} did not beat live {live.accuracy:.3f}"
        phases.append(switch)
        phases.append(Phase("post-promote", note="drifted held-out digits again"))
        await _drive(client, phases[-1], drifted, labels, "post-")
        duplicates = client.duplicates
    with contextlib.suppress(OSError):  # leave the shared model cache as it was: this run's versions go
        import shutil

        shutil.rmtree(registry.dir)
    pre, drift, post = phases[0], phases[1], phases[-1]
    gap = pre.accuracy - post.accuracy
    gap_ci = _gap_interval(pre.right, post.right)
    rows = [p.row() for p in phases]
    _print(rows)
    answered = sum(len(p.ids) for p in phases)
    errors = sum(p.errors for p in phases)
    console.print(f"pre-drift {pre.accuracy:.3f}, drifted {drift.accuracy:.3f} (baseline: no learning), "
                  f"after promote {post.accuracy:.3f}: gap {gap * 100:+.1f} pts [95% CI {gap_ci[0] * 100:+.1f}, "
                  f"{gap_ci[1] * 100:+.1f}]; {answered} requests, {errors} errors, {duplicates} duplicate replies")
    return {"workload": "learn-continual", "shift": {"kind": "brightness", "amount": amount},
            "timeline": rows, "pre_drift_accuracy": pre.accuracy, "drifted_accuracy": drift.accuracy,
            "shadow_accuracy": shadow_acc, "recovered_accuracy": post.accuracy, "gap_pts": round(gap * 100, 2),
            "gap_pts_ci95": [round(gap_ci[0] * 100, 2), round(gap_ci[1] * 100, 2)], "promoted": promoted,
            "requests": answered, "errors": errors, "duplicate_replies": duplicates,
            "training": {"examples": data.size, **manifest.metrics},
            "targets": {"recovers_within_3pts": promoted and gap <= 0.03}}


def _print(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from flowserve.console import make_console

    table = Table(title="continual learning: timeline")
    for column in ("phase", "requests", "accuracy [95% CI]", "version live", "p50 ms", "what happened"):
        table.add_column(column)
    for r in rows:
        acc = "-" if r["accuracy"] is None else (f"{r['accuracy']:.3f} [{r['accuracy_ci95'][0]:.3f}, "
                                                 f"{r['accuracy_ci95'][1]:.3f}]")
        table.add_row(r["phase"], str(r["requests"]), acc, r["version_live"],
                      "-" if r["p50_ms"] is None else f"{r['p50_ms']:.0f}", r["note"])
    make_console().print(table)
