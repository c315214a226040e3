"""``flowserve bench learn-selection``: Exp3 picks one of three digits models per request, learning from
feedback on every request; one model's input turns noisy mid-run.

Everything runs for real on the broker: a topology (normalise → Exp3 selector → three branches, the
degraded one behind an :class:`~flowserve_components.faults.InputNoise` node → any-join) in this process
with the selection hooks attached, requests through the request-reply engine, and feedback written to
``<base>.feedback`` with a plain Kafka producer (the asynchronous path). Which branch took each request is
read back from the selector's decisions topic.

The baseline is *always picking one branch*: each branch's own components run offline on the very same
requests (the same seeded noise after the change), and the best branch over the whole run is the one to
beat. The accuracy gap comes with a 95% interval (paired bootstrap over requests).

Accounting (:func:`account`, a pure function of the answers): a request whose decision was not read back
counts, in the share target, as if it went to the degraded branch (nothing shows it did not), and
``decisions_read_back`` (every request's decision read back) is a target of its own, so the share target
cannot pass on decisions it never saw. A request that failed counts as answered wrong.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.client import TopologyClient
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.component import Batch, import_library
from flowserve.kafka.clients import make_producer
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.host import InlineHost
from flowserve.selection import selection_hooks
from flowserve.topology.graph import Topology, load_topology_text
from flowserve.wire.feedback import encode_feedback
from flowserve_bench import graphs
from flowserve_bench.common import console, run_id

BRANCHES = {"mlp": "digits-mlp", "small": "digits-mlp-small", "cnn": "digits-cnn"}
DEGRADED = "mlp"
WINDOW = 250
#: the share target's window ends this many requests (feedback records) after the change
SHARE_WITHIN = 2000
#: the arm of a request whose decision was not read back from the decisions topic
NOT_READ = -1
#: the label of a request that failed (no digit is -1): never equal to the truth
NO_ANSWER = -1

def _offline(text: str, requests: list[dict[str, np.ndarray]], ids: list[str], change: int) -> dict[str, np.ndarray]:
    """Each branch's labels for every request, its components run here: the baseline of always picking it."""
    topology = load_topology_text(text)
    headers = [{"x-degrade": b"1"} if i >= change else {} for i in range(len(requests))]
    sizes = [1] * len(requests)

    def run(node: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        component = topology.nodes[node].component
        component.setup()
        out = component.process(Batch(tensors, sizes, ids, headers))
        assert isinstance(out, dict)
        return out

    x = run("pre", {"pixels": np.concatenate([r["pixels"] for r in requests])})["x"]
    labels = {}
    for branch in BRANCHES:
        inp = run("noise", {"x": x})["x"] if branch == DEGRADED else x
        logits = run(branch, {"x": inp})["logits"]
        labels[branch] = run(f"{branch}_label", {"logits": logits})["label"]
    return labels


async def _decisions(kafka: KafkaSettings, topology: Topology) -> dict[str, int]:
    """Request id -> arm, read back from the selector's decisions topic."""
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **kafka.client_kwargs())
    await consumer.start()
    try:
        tps = [TopicPartition(topology.decisions_topic("select"), p) for p in range(topology.spec.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        arms: dict[str, int] = {}
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for rec in records:
                    doc = json.loads(rec.value)
                    arms[doc["id"]] = doc["arm"]
        return arms
    finally:
        await consumer.stop()


def account(arms: np.ndarray, answered: np.ndarray, truth: np.ndarray, branch_correct: dict[str, np.ndarray],
            change: int) -> dict[str, Any]:
    """The figures and targets of a run, from per-request arrays: the arm each decision named
    (``NOT_READ`` where none was read back), the label answered (``NO_ANSWER`` where the request failed),
    the truth, and each branch's correctness when always picked.

    A decision not read back counts as on the degraded branch in every window's share (the pessimistic
    reading: nothing shows it went elsewhere); a failed request counts as wrong."""
    requests = len(arms)
    degraded_arm = list(BRANCHES).index(DEGRADED)
    not_degraded = (arms >= 0) & (arms != degraded_arm)
    windows = []
    for lo in range(0, requests, WINDOW):
        hi = min(lo + WINDOW, requests)
        windows.append({"from": lo - change, "to": hi - change,
                        "degraded_share": round(float(1 - not_degraded[lo:hi].mean()), 4),
                        "not_read_back": int((arms[lo:hi] == NOT_READ).sum()),
                        "accuracy": round(float((answered[lo:hi] == truth[lo:hi]).mean()), 4)})
    selector_correct = answered == truth
    accuracy = {b: round(float(c.mean()), 4) for b, c in branch_correct.items()}
    best = max(accuracy, key=lambda b: accuracy[b])
    gap, low, high = _paired_gap(selector_correct, branch_correct[best])
    # the window of 250 requests that ends 2,000 feedback records after the change; a run too short to
    # have it fails the share target rather than judging another window
    target_window = next((w for w in windows if w["to"] == SHARE_WITHIN), None)
    share = None if target_window is None else target_window["degraded_share"]
    read_back = int((arms != NOT_READ).sum())
    return {
        "branch_accuracy_before": {b: round(float(c[:change].mean()), 4) for b, c in branch_correct.items()},
        "branch_accuracy_after": {b: round(float(c[change:].mean()), 4) for b, c in branch_correct.items()},
        "branch_accuracy": accuracy, "best_branch": best,
        "selector_accuracy": round(float(selector_correct.mean()), 4),
        "gap_vs_best": [round(gap, 4), round(low, 4), round(high, 4)],
        "decisions_read_back": read_back, "failed_requests": int((answered == NO_ANSWER).sum()),
        "windows": windows, "degraded_share_window_ending_2000": share,
        "targets": {
            "decisions_read_back": read_back == requests,
            "degraded_share_lt_10pct_within_2000": share is not None and share < 0.10,
            "accuracy_within_2pts_of_best": low >= -0.02,
        },
    }


def _paired_gap(a: np.ndarray, b: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` (per-request correctness) with a 95% bootstrap interval."""
    diff = a.astype(float) - b.astype(float)
    rng = np.random.default_rng(seed)
    means = np.array([diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(resamples)])
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


async def learn_selection_bench(kafka: KafkaSettings, *, requests: int = 8000, change: int = 2000, wave: int = 32,
                                gamma: float = 0.03, eta: float = 0.1, sigma: float = 0.6,
                                seed: int = 0) -> dict[str, Any]:
    import_library("flowserve_components.selection")
    tag = run_id()
    text = graphs.text("learn-selection.yaml", f"sel{tag}", {
        "nodes.select.params.gamma": gamma, "nodes.select.params.eta": eta, "nodes.select.params.seed": seed,
        "nodes.noise.params.sigma": sigma})
    topology = load_topology_text(text)
    prepare_to_drive(topology)
    reqs, truth_list = topology.sampler()(requests, seed)
    truth = np.asarray(truth_list)
    ids = [f"{tag}-{i}" for i in range(requests)]
    console.print(f"baseline: each branch offline on the same {requests} requests (noise on '{DEGRADED}' "
                  f"from request {change})")
    branch_labels = _offline(text, reqs, ids, change)
    branch_correct = {b: labels == truth for b, labels in branch_labels.items()}
    answered = np.full(requests, NO_ANSWER, dtype=np.int64)
    host = InlineHost(topology, kafka, hooks=selection_hooks(kafka))
    producer = make_producer(kafka, WorkerSettings(), max_message_bytes=topology.spec.max_message_bytes)
    await host.start()
    await producer.start()
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, reqs[0], timeout_s=180)
            for start in range(0, requests, wave):
                batch = range(start, min(start + wave, requests))
                futures = [client.expect(ids[i], 120) for i in batch]
                for i in batch:
                    await client.queue(reqs[i], request_id=ids[i], timeout_ms=120_000,
                                       headers={"x-degrade": "1"} if i >= change else None)
                await client.flush()
                for i, reply in zip(batch, await asyncio.gather(*futures), strict=True):
                    if reply.error is None:  # a failure stays NO_ANSWER: counted wrong
                        answered[i] = int(reply.tensors["label"][0])
                # feedback on every request, by any Kafka client (the asynchronous path)
                for i in batch:
                    key, value, headers = encode_feedback(ids[i], {"label": np.array([truth[i]], np.int64)})
                    await producer.send(topology.feedback_topic, value, key=key, headers=headers)
                await producer.flush()
                if (start // wave) % 50 == 0:
                    console.print(f"  {start + len(batch)} of {requests} requests answered, feedback sent")
        arms_by_id = await _decisions(kafka, topology)
        selector = next(w for w in host.workers if w.node.id == "select")
        counters = {k: v for hook in selector.hooks for k, v in hook.counters().items()}
    finally:
        await producer.stop()
        await host.stop()
    arms = np.array([arms_by_id.get(i, NOT_READ) for i in ids])
    result = {
        "workload": "learn-selection", "simulated": False, "requests": requests, "change_at": change,
        "wave": wave, "gamma": gamma, "eta": eta, "sigma": sigma, "branches": BRANCHES, "degraded": DEGRADED,
        "selector_counters": {k: counters.get(k) for k in ("decisions", "feedback_learned", "feedback_expired",
                                                           "state_records")},
        **account(arms, answered, truth, branch_correct, change),
    }
    _print(result)
    return result


def _print(r: dict[str, Any]) -> None:
    console.print(f"\nExp3 over {', '.join(f'{b} ({m})' for b, m in r['branches'].items())}; "
                  f"'{r['degraded']}' gets input noise (sigma {r['sigma']}) from request {r['change_at']}")
    console.print("window (requests after the change)  share on degraded  selector accuracy")
    for w in r["windows"]:
        console.print(f"  [{w['from']:>6}, {w['to']:>6})                  {w['degraded_share']:>6.1%}"
                      f"             {w['accuracy']:.1%}")
    console.print("branch accuracy, always picking it (before / after the change / overall):")
    for b in r["branches"]:
        console.print(f"  {b:<6} {r['branch_accuracy_before'][b]:.1%} / {r['branch_accuracy_after'][b]:.1%} / "
                      f"{r['branch_accuracy'][b]:.1%}")
    gap = r["gap_vs_best"]
    console.print(f"selector {r['selector_accuracy']:.1%} vs best branch '{r['best_branch']}' "
                  f"{r['branch_accuracy'][r['best_branch']]:.1%}: gap {gap[0]:+.1%} (95% CI {gap[1]:+.1%} .. "
                  f"{gap[2]:+.1%})")
    console.print(f"decisions read back {r['decisions_read_back']} of {r['requests']} (an unread one counts as on "
                  f"'{r['degraded']}'); failed requests {r['failed_requests']} (counted wrong)")
