"""``flowserve bench models --real``: the many-model node with REAL models, live on a broker: 100 variants of
the digits MLP (:mod:`flowserve_components.digit_variants`, fine-tuned on shifted digits and read from the
version registry) on one :class:`~flowserve_components.torch_models.TorchModels` worker with room for ten.

Once the node has answered one warm-up request through the gateway (not counted: the gateway refuses while
the node's consumer group forms), requests go out in a shuffled order, ``per_model`` held-out images for
every variant, most on the async Kafka path (``fs-model`` header) and ``via_gateway`` per variant through
``POST /v2/models/<variant>/infer``.
Every answer is checked against the variant it named run alone in this process, one row at a time, from
the same registry: **equal** (within float32 rounding: a batch of many rows may sum in another order than a
batch of one) and ``fs-served-by`` the variant named; **wrong variant** where the served-by header names
another, or the logits are another variant's; **mismatched** where they are nobody's. Variants differ by far
more than rounding (the run reports the smallest gap), so equal means this variant's output. The target
``real_model_answers_equal_own_variant`` holds when there are answers, all are equal, none is from a wrong
variant and nothing is lost; refusals (kind ``deadline``) are counted apart.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.models import Catalogue, ModelHooks, model_hooks
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology_text
from flowserve.wire.envelope import H_MODEL, H_SERVED_BY
from flowserve_bench import graphs
from flowserve_bench.common import run_id
from flowserve_components.digit_variants import outputs, produce
from flowserve_components.digits import PIXEL_MAX, load_split

TOPOLOGY = graphs.EXAMPLES / "many-models-digits.yaml"
#: equal within float32 rounding of logits of magnitude ~10 (a batch's sums may run in another order)
RTOL, ATOL = 1e-5, 1e-4
TARGET = "real_model_answers_equal_own_variant"


@dataclass(frozen=True, slots=True)
class Answer:
    """One request of the run: the variant it named, and what came back."""

    model: str
    #: the answer's logits, None for an error or nothing
    logits: np.ndarray | None
    served_by: str | None = None
    #: the error's kind (``deadline``: refused early), None for an answer
    error: str | None = None
    lost: bool = False


def account(answers: Sequence[Answer], own: Sequence[np.ndarray], every: Sequence[Mapping[str, np.ndarray]]
            ) -> dict[str, Any]:
    """The counts and the target: ``own[i]`` is request ``i``'s variant run alone on its input, ``every[i]``
    every variant's output on it (to name the variant a wrong answer came from)."""
    counts = dict.fromkeys(("sent", "answered", "equal", "wrong_variant", "mismatched", "refused", "failed",
                            "lost"), 0)
    worst = 0.0
    for answer, mine, others in zip(answers, own, every, strict=True):
        counts["sent"] += 1
        if answer.lost:
            counts["lost"] += 1
            continue
        if answer.logits is None:
            counts["refused" if answer.error == ErrorKind.DEADLINE.value else "failed"] += 1
            continue
        counts["answered"] += 1
        close = answer.logits.shape == mine.shape and np.allclose(answer.logits, mine, rtol=RTOL, atol=ATOL)
        if close and answer.served_by == answer.model:
            counts["equal"] += 1
            worst = max(worst, float(np.max(np.abs(answer.logits - mine))))
        elif answer.served_by != answer.model or any(
                name != answer.model and out.shape == answer.logits.shape
                and np.allclose(answer.logits, out, rtol=RTOL, atol=ATOL) for name, out in others.items()):
            counts["wrong_variant"] += 1
        else:
            counts["mismatched"] += 1
    ok = (counts["answered"] > 0 and counts["equal"] == counts["answered"] and counts["wrong_variant"] == 0
          and counts["lost"] == 0 and counts["failed"] == 0)
    return {"counts": counts, "max_abs_diff_equal": worst, "targets": {TARGET: ok}}


def closest(logits: np.ndarray) -> float:
    """Over every pair of variants and every request, the smallest of the largest differences between the
    two variants' logits (``logits``: [variants, requests, classes]): how close a wrong answer could come."""
    gap = np.inf
    for a in range(len(logits) - 1):
        gap = min(gap, float(np.abs(logits[a + 1:] - logits[a]).max(axis=2).min()))
    return gap


def _inputs(names: Sequence[str], per_model: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """``per_model`` held-out images (pixels / 16) for each variant, shuffled into one order."""
    x, _ = load_split("test")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(x), size=len(names) * per_model, replace=len(names) * per_model > len(x))
    pairs = [(names[k % len(names)], (x[i:i + 1] / np.float32(PIXEL_MAX)).astype(np.float32))
             for k, i in enumerate(picks)]
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order]


async def _send(kafka: KafkaSettings, text: str, requests: Sequence[tuple[str, np.ndarray]], via_gateway: set[int],
                timeout_ms: int) -> tuple[list[Answer], dict[str, int], list[str], float]:
    """The run on the broker: the node in this process (the hooks ``flowserve worker`` attaches), the
    gateway beside it; every request's answer, the node's counters, the variants resident at the end and
    the seconds from the first request (after the warm-up) to the last answer."""
    topology = load_topology_text(text, source="bench")
    wait = {"x-timeout-ms": str(timeout_ms)}  # the gateway's deadline, as the Kafka requests' timeout_ms
    async with InlineHost(topology, kafka, hooks=model_hooks(kafka)) as host, \
            TopologyClient(topology, kafka) as client, \
            Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, AsyncHttpClient(gateway.url) as http:
        (hook,) = [h for h in host.workers[0].hooks if isinstance(h, ModelHooks)]
        # the gateway refuses (503) while the node's consumer group forms: wait for one answer, not counted
        loop = asyncio.get_running_loop()
        ready_by = loop.time() + timeout_ms / 1000
        while (await http.infer(requests[0][0], {"x": requests[0][1]}, headers=wait)).status != 200:
            if loop.time() > ready_by:
                raise FlowserveError(f"the many-model node answered nothing within {timeout_ms} ms",
                                     kind=ErrorKind.DEADLINE)
            await asyncio.sleep(0.2)
        started = time.perf_counter()
        waits: dict[int, Any] = {}
        for i, (model, x) in enumerate(requests):
            if i in via_gateway:
                continue
            rid = f"r{i}-{uuid.uuid4().hex[:8]}"
            waits[i] = client.expect(rid)
            await client.queue({"x": x}, request_id=rid, headers={H_MODEL: model}, timeout_ms=timeout_ms)
        await client.flush()

        retried = 0

        async def over_http(i: int) -> Answer:
            # a 503 is the gateway saying the node's group is rebalancing (the coordinator moved, as on a
            # loaded machine): a client retries it until its deadline, as HTTP clients retry a 503
            nonlocal retried
            model, x = requests[i]
            give_up = loop.time() + timeout_ms / 1000
            response = await http.infer(model, {"x": x}, headers=wait)
            while response.status == 503 and loop.time() < give_up:
                retried += 1
                await asyncio.sleep(0.2)
                response = await http.infer(model, {"x": x}, headers=wait)
            body = response.json()
            if response.status != 200:
                return Answer(model, None, error=str(body.get("kind", "unknown")))
            return Answer(model, response.outputs()["logits"], served_by=body.get("model_name"))

        gateway_answers = await asyncio.gather(*(over_http(i) for i in sorted(via_gateway)))
        replies = await asyncio.gather(*(asyncio.wait_for(w, timeout_ms / 1000) for w in waits.values()),
                                       return_exceptions=True)
        answers: dict[int, Answer] = dict(zip(sorted(via_gateway), gateway_answers, strict=True))
        for i, reply in zip(waits, replies, strict=True):
            model = requests[i][0]
            if isinstance(reply, BaseException):
                answers[i] = Answer(model, None, lost=True)
            elif reply.error is not None:
                answers[i] = Answer(model, None, error=(reply.error_kind or ErrorKind.UNKNOWN).value)
            else:
                served = reply.headers.get(H_SERVED_BY)
                answers[i] = Answer(model, reply.tensors["logits"], served.decode() if served else None)
        seconds = time.perf_counter() - started
        counters = dict(hook.counters())
        counters["gateway_retries_503"] = retried
        resident = sorted(hook.scheduler.memory.resident)
    return [answers[i] for i in range(len(requests))], counters, resident, seconds


async def real_bench(kafka: KafkaSettings, *, per_model: int = 4, via_gateway: int = 1, seed: int = 0,
                     timeout_ms: int = 60_000, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """The run (see the module's doc); its result with counts, the node's loads and evictions, and targets."""
    wall = time.perf_counter()
    text = graphs.text(TOPOLOGY, f"mmd{run_id()}")
    topology = load_topology_text(text, source="bench")
    spec = topology.nodes["zoo"].models
    assert spec is not None
    catalogue = Catalogue.declared(spec)
    names = [s.name for s in catalogue]
    made = produce(len(names), prefix=spec.prefix)
    if log:
        log(f"{len(names)} variants in the registry ({made.trained} trained now, {made.seconds:.1f}s)")
    requests = _inputs(names, per_model, seed)
    rng = np.random.default_rng(seed + 1)
    gateway = {int(i) for name in names for i in rng.permutation(
        [k for k, (m, _) in enumerate(requests) if m == name])[:via_gateway]}
    answers, counters, resident, served_s = await _send(kafka, text, requests, gateway, timeout_ms)
    # the reference: each variant run alone here, one row at a time, and every variant on every input
    alone = {name: outputs([name], np.concatenate([x for m, x in requests if m == name]))[name] for name in names}
    seen: dict[str, int] = dict.fromkeys(names, 0)
    own = []
    for model, _ in requests:
        own.append(alone[model][seen[model]:seen[model] + 1])
        seen[model] += 1
    all_out = outputs(names, np.concatenate([x for _, x in requests]), alone=False)
    every = [{name: out[i:i + 1] for name, out in all_out.items()} for i in range(len(requests))]
    result = account(answers, own, every)
    gap = closest(np.stack([all_out[name] for name in names]))
    counts = result["counts"]
    if log:
        log(f"{counts['sent']} requests for {len(names)} variants ({len(gateway)} through the gateway) in "
            f"{served_s:.1f}s: answered {counts['answered']}, equal to their own variant {counts['equal']}, "
            f"wrong variant {counts['wrong_variant']}, mismatched {counts['mismatched']}, refused "
            f"{counts['refused']}, failed {counts['failed']}, lost {counts['lost']}; loads "
            f"{counters.get('model_loads')}, evictions {counters.get('model_evictions')}, resident at the end "
            f"{len(resident)}; largest difference of an equal answer {result['max_abs_diff_equal']:.2g}, "
            f"smallest between two variants' answers to one request {gap:.2g}")
    return {"workload": "models", "real": True, "variants": len(names), "per_model": per_model,
            "via_gateway": len(gateway), **counts, "max_abs_diff_equal": result["max_abs_diff_equal"],
            "min_gap_between_variants": gap, "model_loads": counters.get("model_loads"),
            "model_evictions": counters.get("model_evictions"), "models_resident": len(resident),
            "gateway_retries_503": counters.get("gateway_retries_503", 0),
            "memory_mb": spec.memory_mb, "served_s": served_s, "wall_s": time.perf_counter() - wall,
            "targets": result["targets"]}
