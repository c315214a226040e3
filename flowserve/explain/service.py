"""The explain side branch: a consumer of the topology's requests that explains a sampled share of them.

The :class:`Explainer` reads ``<base>.inputs`` in a consumer group of its own (``<base>.explanations``),
beside the topology's nodes, so it never sits between a caller and its answer: the first node reads the
same records in its own group, whatever the explainer does. For each request whose id falls under an
``explain:`` section's ``sample`` (the hash capture uses, so an explained request is a captured one where
capture samples at least as many), it runs the section's chain on its own copies of the components and
writes the :class:`~flowserve.explain.attribute.Explanation` as JSON (and for every request whose ``fs-explain``
header is ``1``: the gateway's ``POST /v2/models/{name}/explain``) to ``<base>.explanations``, keyed by
the request id. One request at a time, in a thread, so a burst grows the explainer's lag, never the
caller's latency; ``flowserve run`` starts it in a niced process of its own (``flowserve explainer``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence

import numpy as np
from aiokafka.structs import ConsumerRecord

from flowserve.errors import ErrorKind, FlowserveError, WireError
from flowserve.explain.attribute import explain
from flowserve.explain.chain import Chain, targets
from flowserve.kafka.clients import make_consumer, make_producer, start_client
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.kafka.shutdown import stop_client
from flowserve.topology import names
from flowserve.topology.capture import sample_point
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import H_EXPLAIN, H_ID, decode_record

log = logging.getLogger("flowserve.explain")

#: requests fetched per poll; each is explained in turn before the next poll
FETCH_RECORDS = 16


def sampled(request_id: str, share: float) -> bool:
    """Whether the explain side branch explains ``request_id`` at sampling ``share`` (a stable hash)."""
    return share >= 1.0 or (share > 0.0 and sample_point(request_id) < share)


def explanation_record(chain: Chain, request_id: str, tensors: Mapping[str, np.ndarray]) -> bytes:
    """The JSON value written for one request: its explanation, or why none could be computed."""
    try:
        body = explain(chain, tensors, request_id=request_id).to_json()
    except FlowserveError as exc:
        body = _failed(chain, request_id, str(exc), str(exc.kind))
    except Exception as exc:  # noqa: BLE001 - a component's torch_forward or process failed: the side branch goes on
        body = _failed(chain, request_id, f"{type(exc).__name__}: {exc}", str(ErrorKind.COMPONENT_FAILURE))
    return json.dumps(body, separators=(",", ":")).encode()


def _failed(chain: Chain, request_id: str, error: str, kind: str) -> dict[str, object]:
    return {"explanation": 1, "request_id": request_id, "topology": chain.topology.name, "output": chain.target.name,
            "error": error, "kind": kind}


class Explainer:
    """Explains the sampled requests of ``topology``'s ``explain:`` sections as they arrive."""

    def __init__(self, topology: Topology, kafka: KafkaSettings, settings: WorkerSettings | None = None) -> None:
        self.topology = topology
        self.kafka = kafka
        self.settings = settings or WorkerSettings()
        self.chains = [Chain(topology, t) for t in targets(topology)]
        if not self.chains:
            raise FlowserveError(f"topology '{topology.name}' has no explain: section")
        self.explained = 0
        self.failed = 0
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Set up the chains' components, then explain until :meth:`stop`."""
        for chain in self.chains:
            await asyncio.to_thread(chain.setup)
        limit = self.topology.spec.max_message_bytes
        base = self.topology.base
        consumer = make_consumer(self.kafka, self.settings, group_id=names.explain_group(base), max_message_bytes=limit)
        producer = make_producer(self.kafka, self.settings, max_message_bytes=limit)
        await start_client(consumer, self.kafka)
        try:
            await start_client(producer, self.kafka)
            consumer.subscribe([self.topology.inputs_topic])
            while not self._stopping.is_set():
                fetched = await consumer.getmany(timeout_ms=200, max_records=FETCH_RECORDS)
                for records in fetched.values():
                    await self._explain(producer, records)
                if fetched:
                    await consumer.commit()
        finally:
            await stop_client(producer, "the explainer's producer")
            await stop_client(consumer, "the explainer's consumer")
            for chain in self.chains:
                chain.close()

    async def _explain(self, producer: object, records: Sequence[ConsumerRecord]) -> None:
        topic = self.topology.explanations_topic
        for rec in records:
            try:
                env = decode_record(rec.key, rec.value, rec.headers, accept_json=True)
            except WireError:
                continue  # the first node dead-letters it with the reason
            if env.error is not None:
                continue
            asked = env.headers.get(H_EXPLAIN) == b"1"  # POST /v2/models/{name}/explain: whatever the sample
            for chain in self.chains:
                if not asked and not sampled(env.request_id, chain.target.spec.sample):
                    continue
                value = await asyncio.to_thread(explanation_record, chain, env.request_id, env.tensors)
                self.explained += 1
                self.failed += value.find(b'"error":') >= 0
                await producer.send_and_wait(topic, value, key=env.request_id.encode(),  # type: ignore[attr-defined]
                                             headers=[(H_ID, env.request_id.encode())])
