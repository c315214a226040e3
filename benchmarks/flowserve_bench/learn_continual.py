"""``flowserve bench learn-continual``: drift drops accuracy; feedback → learn → shadow → promote brings it back.

The digits topology (MLP) runs in this process with capture on, version hooks in its workers. The 450
held-out digits are split once, by a seeded permutation, into two disjoint sets: ``select_n`` (100) that
decide promotion, and the rest (350), the evaluation set that scores the run. Phases:

1. ``pre-drift``: the evaluation digits, as they are: the accuracy to get back to.
2. ``drift``: the same digits brightened (``brightness`` shift of ``flowserve run --shift``, the drift
   issue's shift; +6 of 16 by default): the live model's accuracy drops. This is the baseline: the
   topology without continual learning on the drifted stream.
3. ``feedback``: drifted digits from the *training* split flow through the live model, and the truth for
   each is written to ``<base>.feedback`` (as a labelling process would).
4. ``learn``: ``flowserve learn``'s code path: feedback joined with the captured ``pre.x`` of the same
   requests, the live weights fine-tuned, version v1 registered.
5. ``shadow``: v1 runs as a shadow (a side branch with its own consumer group) on a copy of the live
   traffic: the drifted *selection* digits; live (base) and shadow (v1) are scored on the same requests.
6. ``promote``: v1 is promoted when the shadow beat the live version there; traffic (selection digits)
   keeps flowing while the workers switch between batches.
7. ``post-promote``: the drifted evaluation digits once more, answered by v1.

Accounting (pure functions: :func:`paired_gap`, :func:`shadow_decision`): a request that failed, and a
shadow answer never read back, count as wrong, never drop out of an accuracy. Accuracies carry Wilson
95% intervals; the gap (pre-drift minus post-promote) a bootstrap interval over images, paired by image
id. Target ``recovers_within_3pts``: promoted, and the gap's interval's upper end within 3 points. The
promotion never sees the images that score it, and no held-out digit is trained on (feedback comes from
the training split).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer

from flowserve.capture import capture_hooks
from flowserve.capture.reader import Reader
from flowserve.client import TopologyClient
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.component import import_library
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.replies import Reply
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
from flowserve.topology import names
from flowserve.wire.envelope import H_MODEL_VERSION
from flowserve.wire.feedback import encode_feedback
from flowserve_bench import graphs
from flowserve_bench.attainment import Tally, difference
from flowserve_bench.common import console, run_id

WAVE = 50  # requests in flight at once


@dataclass
class Phase:
    """One phase's requests: per request its id, its image's id and whether it was answered right (a
    failed request: wrong)."""

    name: str
    ids: list[str] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    right: list[bool] = field(default_factory=list)
    versions: set[str] = field(default_factory=set)
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    note: str = ""

    def score(self, rid: str, image: int, label: int, reply: Reply, sent_ms: float) -> None:
        """Count one reply: right when it answered ``label``; a failed request is counted, as wrong."""
        self.ids.append(rid)
        self.images.append(image)
        if reply.error is not None:
            self.errors += 1
            self.right.append(False)
            return
        self.right.append(int(reply.tensors["label"].reshape(-1)[0]) == label)
        self.versions.add(reply.headers.get(H_MODEL_VERSION, b"=?").decode().partition("=")[2])
        self.latencies_ms.append(reply.received_ms - sent_ms)

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.right)) if self.right else float("nan")

    def by_image(self) -> dict[int, bool]:
        """Image id -> answered right (the last answer where an image was sent more than once)."""
        return dict(zip(self.images, self.right, strict=True))

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


async def _drive(client: TopologyClient, phase: Phase, pixels: np.ndarray, labels: np.ndarray,
                 images: np.ndarray, prefix: str) -> dict[str, int]:
    """Send ``pixels`` (raw, [n, 64]; ``images``: each row's image id) in waves, request id ``prefix`` +
    image id; score the replies into ``phase`` (a failure: wrong); returns labels by request id."""
    truth: dict[str, int] = {}
    for start in range(0, len(pixels), WAVE):
        rows = range(start, min(start + WAVE, len(pixels)))
        ids = [f"{prefix}{int(images[i])}" for i in rows]
        futures = [client.expect(rid, 120) for rid in ids]
        sent = time.time() * 1000
        for i, rid in zip(rows, ids, strict=True):
            await client.queue({"pixels": pixels[i : i + 1]}, request_id=rid)
        await client.flush()
        for i, rid, reply in zip(rows, ids, await asyncio.gather(*futures), strict=True):
            truth[rid] = int(labels[i])
            phase.score(rid, int(images[i]), truth[rid], reply, sent)
    return truth


async def _feedback(kafka: KafkaSettings, topic: str, truth: dict[str, int]) -> None:
    producer = AIOKafkaProducer(**kafka.client_kwargs())
    await producer.start()
    try:
        for rid, label in truth.items():
            key, value, headers = encode_feedback(rid, {"label": np.array([label], np.int64)})
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def _shadow_scores(kafka: KafkaSettings, topics: list[str], truth: dict[str, int]) -> dict[str, bool]:
    """Request id -> the shadow's logits right, for ``truth``'s requests; waits (bounded) until all are
    there (a missing one is left out here and counted wrong by :func:`shadow_decision`)."""
    got: dict[str, bool] = {}
    async with Reader(kafka) as reader:
        for _ in range(600):
            for rec in await reader.read(topics):
                if rec.key in truth and "logits" in rec.tensors:
                    got[rec.key] = int(rec.tensors["logits"].argmax()) == truth[rec.key]
            if len(got) == len(truth):
                break
    return got


def shadow_decision(live: Phase, shadow: Mapping[str, bool]) -> tuple[float, bool]:
    """The shadow's accuracy on the live phase's requests (one it never answered: wrong), and whether it
    beat the live version's accuracy on them (which counts a failed request wrong too)."""
    if not live.ids:
        return float("nan"), False
    accuracy = float(np.mean([shadow.get(rid, False) for rid in live.ids]))
    return accuracy, accuracy > live.accuracy


def paired_gap(before: Mapping[int, bool], after: Mapping[int, bool], resamples: int = 2000,
               seed: int = 0) -> tuple[float, float, float]:
    """mean(before) - mean(after) over the images of either (image id -> answered right; an image missing
    from one side counts wrong there), and its bootstrap 95% interval resampling images, each image's
    two answers kept together."""
    images = sorted(set(before) | set(after))
    if not images:
        return float("nan"), float("nan"), float("nan")
    # each image is a paired "slice" of one request: attainment.difference resamples them, pairs together
    return difference([Tally(1, int(before.get(i, False))) for i in images],
                      [Tally(1, int(after.get(i, False))) for i in images], resamples=resamples, seed=seed)


def holdout_split(n: int, select_n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Image ids ``0 .. n-1`` split by a seeded permutation into the ones that decide promotion
    (``select_n``) and the evaluation set (the rest): disjoint, together all of them."""
    if not 0 < select_n < n:
        raise ValueError(f"select_n must leave both sets non-empty: 0 < select_n < {n}, not {select_n}")
    order = np.random.default_rng(seed).permutation(n)
    return order[:select_n], order[select_n:]


async def learn_continual_bench(kafka: KafkaSettings, *, amount: float = 6.0, feedback_n: int = 600,
                                select_n: int = 100) -> dict[str, Any]:
    digits = import_library("flowserve_components.digits")
    topology = graphs.load("learn-continual.yaml", f"bench-learn-{run_id()}")
    prepare_to_drive(topology)
    x_test, y_test = digits.load_split("test")
    # image id: the index in the held-out split; one seeded order for every phase, pairs kept by id
    select_ids, eval_ids = holdout_split(len(x_test), select_n)
    clean = {name: np.ascontiguousarray(x_test[ids], dtype=np.float32)
             for name, ids in (("select", select_ids), ("eval", eval_ids))}
    labels = {"select": np.asarray(y_test[select_ids]), "eval": np.asarray(y_test[eval_ids])}
    rng = np.random.default_rng(2)
    drifted = {name: digits.apply_shift(x, "brightness", amount, rng) for name, x in clean.items()}
    train_req, train_labels = digits.sample(feedback_n, seed=3, split="train", shift="brightness", amount=amount)
    train_pixels = np.concatenate([r["pixels"] for r in train_req])
    registry = Registry(topology.name, "model")
    phases: list[Phase] = []
    feedback_topic = names.feedback_topic(topology.base)
    await ensure_topics(kafka, [feedback_topic, *shadow_topics(topology, "model")], topology.spec.partitions)
    console.print(f"bench learn-continual: topology {topology.name}, brightness shift +{amount}, "
                  f"{feedback_n} feedback records; {len(select_ids)} held-out digits decide promotion, "
                  f"{len(eval_ids)} others score the run")
    hooks = chain(capture_hooks, version_hooks(kafka))
    async with InlineHost(topology, kafka, hooks=hooks), TopologyClient(topology, kafka) as client:
        await wait_ready(client, {"pixels": clean["eval"][:1]})
        phases.append(Phase("pre-drift", note="evaluation digits as they are"))
        await _drive(client, phases[-1], clean["eval"], labels["eval"], eval_ids, "pre-")
        phases.append(Phase("drift", note=f"same digits, brightness +{amount}: baseline (no learning)"))
        await _drive(client, phases[-1], drifted["eval"], labels["eval"], eval_ids, "drift-")
        phases.append(Phase("feedback", note="drifted training-split digits; truth to <base>.feedback"))
        truth = await _drive(client, phases[-1], train_pixels, np.asarray(train_labels), np.arange(feedback_n),
                             "fb-")
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
            live = Phase("shadow", note="drifted selection digits; live answers, shadow runs on a copy")
            shadow_truth = await _drive(client, live, drifted["select"], labels["select"], select_ids, "shadow-")
            scored = await _shadow_scores(kafka, shadow_topics(topology, "model"), shadow_truth)
        finally:
            shadow.stop()
            await task
        shadow_acc, promoted = shadow_decision(live, scored)
        live.note += (f"; shadow {manifest.version}: accuracy {shadow_acc:.3f} on {len(live.ids)} "
                      f"({len(live.ids) - len(scored)} never read back, counted wrong)")
        phases.append(live)
        switch = Phase("promote", note="selection digits flow while workers switch between batches")
        if promoted:
            registry.promote(manifest.version)
            await send_version(topology, kafka, "model", manifest.version)
            for round_ in range(200):
                await _drive(client, switch, drifted["select"][:20], labels["select"][:20], select_ids[:20],
                             f"switch{round_}-")
                if manifest.version in switch.versions:
                    break
        else:
            switch.note = f"not promoted: shadow {shadow_acc:.3f} did not beat live {live.accuracy:.3f}"
        phases.append(switch)
        phases.append(Phase("post-promote", note="drifted evaluation digits again"))
        await _drive(client, phases[-1], drifted["eval"], labels["eval"], eval_ids, "post-")
        duplicates = client.duplicates
    with contextlib.suppress(OSError):  # leave the shared model cache as it was: this run's versions go
        shutil.rmtree(registry.dir)
    pre, drift, post = phases[0], phases[1], phases[-1]
    gap, *gap_ci = paired_gap(pre.by_image(), post.by_image())
    rows = [p.row() for p in phases]
    _print(rows)
    answered = sum(len(p.ids) for p in phases)
    errors = sum(p.errors for p in phases)
    console.print(f"pre-drift {pre.accuracy:.3f}, drifted {drift.accuracy:.3f} (baseline: no learning), "
                  f"after promote {post.accuracy:.3f}: gap {gap * 100:+.1f} pts [95% CI {gap_ci[0] * 100:+.1f}, "
                  f"{gap_ci[1] * 100:+.1f}] on {len(eval_ids)} evaluation digits; {answered} requests, {errors} "
                  f"errors (counted wrong), {duplicates} duplicate replies")
    return {"workload": "learn-continual", "shift": {"kind": "brightness", "amount": amount},
            "selection_images": len(select_ids), "evaluation_images": len(eval_ids),
            "timeline": rows, "pre_drift_accuracy": pre.accuracy, "drifted_accuracy": drift.accuracy,
            "shadow_accuracy": shadow_acc, "live_accuracy_at_selection": live.accuracy,
            "recovered_accuracy": post.accuracy, "gap_pts": round(gap * 100, 2),
            "gap_pts_ci95": [round(gap_ci[0] * 100, 2), round(gap_ci[1] * 100, 2)], "promoted": promoted,
            "requests": answered, "errors": errors, "duplicate_replies": duplicates,
            "training": {"examples": data.size, **manifest.metrics},
            "targets": {"recovers_within_3pts": recovered(promoted, gap_ci[1])}}


def recovered(promoted: bool, gap_high: float, within: float = 0.03) -> bool:
    """The target: the new version was promoted, and the gap's interval's upper end is within ``within``."""
    return promoted and gap_high <= within


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
