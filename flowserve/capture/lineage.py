"""``flowserve lineage``: the whole path of one request, from its lineage records and its topics.

Each stage that runs with lineage on writes, per batch, one compact JSON record to
``<prefix>.<topology>.lineage`` (key = batch id), in the same Outbox batch as its outputs, so it is
acknowledged before the stage commits. It names the component (``describe()``), a hash of its
parameters, the model weights hash when there is one, the batch (id, size) and its timings once, and
per sampled request: its request id, index and rows in the batch, the input records read (topic,
partition, offset), the topics written, and the trace and span ids of its OpenTelemetry span.
:func:`expand` turns a batch record into per-request steps; ``lineage`` finds a request's records by
scanning the topic for values that hold its id (a byte search before any JSON is parsed); the request's
explanations (``flowserve.explain``, on ``<prefix>.<topology>.explanations`` by request id) are joined::

    flowserve lineage r1 --topology digits --broker localhost:9092
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from flowserve.capture.inspect import resolve_base, summarize
from flowserve.capture.reader import Decoded, Reader, tensor_json
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import names


@dataclass
class Step:
    """One node's work on the request: its lineage record and the input records read back from Kafka."""

    record: dict[str, Any]
    inputs: list[Decoded | None] = field(default_factory=list)

    @property
    def node(self) -> str:
        return str(self.record.get("node"))


def expand(body: dict[str, Any], request_id: str | None = None, *, prefix: bool = False) -> list[dict[str, Any]]:
    """The per-request lineage records in one stored record (all, or ``request_id``'s only; with
    ``prefix``, those of every request id that starts with ``request_id``).

    A stage's record (``"v": 3``: the batches gathered between two commits; ``"v": 2``: one batch)
    expands to one dict per sampled request, each with the keys ``request_id, topology, version, node,
    component, params_hash, weights_hash, model_version (the registered version, None: as configured),
    inputs, outputs, batch {id, size, index, rows}, timing
    {start_ms, batch_ms}, trace_id, span_id, error``; a per-request record (v1) is returned as it is.
    """
    version = body.get("v")
    if body.get("energy") == 1:  # flowserve.energy's per-batch record: joules and grams per sampled request
        return [{"kind": "energy", "request_id": rid, "node": body.get("node"),
                 "energy": {"joules": joules, "g_co2e": grams, "rows": rows, "batch_rows": b.get("rows"),
                            "busy_ms": b.get("busy_ms"), "meter": body.get("meter")}}
                for b in body.get("batches", []) for rid, rows, joules, grams in b.get("requests", [])
                if _matches(rid, request_id, prefix)]
    if version == 3:
        batches = [({"id": b.get("id"), "size": b.get("size")},
                    {"start_ms": b.get("start_ms"), "batch_ms": b.get("batch_ms")}, b.get("requests", []))
                   for b in body.get("batches", [])]
    elif version == 2:
        batches = [(body.get("batch", {}), dict(body.get("timing", {})), body.get("requests", []))]
    else:
        return [body] if _matches(body.get("request_id"), request_id, prefix) else []
    topics, out = body.get("topics", []), []
    for batch, timing, requests in batches:
        for rid, index, rows, partition, inputs, outputs, trace_id, span_id, error in requests:
            if not _matches(rid, request_id, prefix):
                continue
            out.append({
                "v": 1, "request_id": rid, "topology": body.get("topology"), "version": body.get("version"),
                "node": body.get("node"), "component": body.get("component"),
                "params_hash": body.get("params_hash"), "weights_hash": body.get("weights_hash"),
                "model_version": body.get("model_version"),
                "inputs": [[topics[t], p, o] for t, p, o in inputs],
                "outputs": [[topics[t], partition, port] for t, port in outputs],
                "batch": {"id": batch.get("id"), "size": batch.get("size"), "index": index, "rows": rows},
                "timing": dict(timing), "trace_id": trace_id, "span_id": span_id, "error": error,
            })
    return out


def _matches(rid: Any, wanted: str | None, prefix: bool) -> bool:
    if wanted is None:
        return True
    return isinstance(rid, str) and (rid.startswith(wanted) if prefix else rid == wanted)


class AmbiguousRequestId(FlowserveError):
    """A shortened request id that starts more than one sampled request's id."""


async def lineage(kafka: KafkaSettings, request_id: str, topology: str, *, prefix: str = "fs",
                  with_tensors: bool = True, timeout_s: float = 30.0) -> list[Step]:
    """The lineage steps of ``request_id`` in order of processing (redeliveries appear once per run).

    ``request_id`` may be shortened (``flowserve run --sample`` prints 12 characters): any request id
    that starts with it matches, and :class:`AmbiguousRequestId` is raised when several requests do.
    """
    base = resolve_base(topology, prefix)
    async with Reader(kafka, timeout_s=timeout_s) as reader:
        # no closing quote: the byte search also finds the ids that merely start with it
        needle = json.dumps(request_id)[:-1].encode()
        records = await reader.read([names.lineage_topic(base)], contains=needle)
        expanded = [rec for r in records if isinstance(r.body, dict)
                    for rec in expand(r.body, request_id, prefix=True) if rec.get("node")]
        steps = [Step(rec) for rec in expanded if rec.get("kind") != "energy"]
        ids = {str(s.record.get("request_id")) for s in steps}
        if request_id in ids:
            steps = [s for s in steps if s.record.get("request_id") == request_id]
        elif len(ids) > 1:
            shown = ", ".join(sorted(ids)[:5])
            raise AmbiguousRequestId(f"request id '{request_id}' is the start of {len(ids)} sampled requests' "
                                     f"ids ({shown}{', ...' if len(ids) > 5 else ''}); give more characters",
                                     kind=ErrorKind.INVALID_INPUT)
        steps.sort(key=lambda s: (s.record.get("timing", {}).get("start_ms", 0), s.node))
        _attach_energy(steps, [rec for rec in expanded if rec.get("kind") == "energy"])
        if with_tensors:
            wanted = [(str(t), int(p), int(o)) for s in steps for t, p, o in s.record.get("inputs", [])]
            found = await reader.read_at(wanted)
            for s in steps:
                s.inputs = [found.get((str(t), int(p), int(o))) for t, p, o in s.record.get("inputs", [])]
    return steps


def _attach_energy(steps: list[Step], energy: list[dict[str, Any]]) -> None:
    """Each hop's energy entry (written by flowserve.energy's hook beside capture's) into its step, in order
    per request and node."""
    pending: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for rec in energy:
        pending.setdefault((rec["request_id"], rec["node"]), []).append(rec["energy"])
    for s in steps:
        queue = pending.get((s.record.get("request_id"), s.record.get("node")))
        if queue:
            s.record["energy"] = queue.pop(0)


async def explanations(kafka: KafkaSettings, request_id: str, topology: str, *, prefix: str = "fs",
                       timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The explanation records of ``request_id`` (JSON, as ``flowserve.explain`` writes them to
    ``<base>.explanations``, keyed by request id), oldest first; none when the topology explains nothing."""
    async with Reader(kafka, timeout_s=timeout_s) as reader:
        records = await reader.read([names.explanations_topic(resolve_base(topology, prefix))], key=request_id)
    return [r.body for r in records if isinstance(r.body, dict) and r.body.get("explanation") == 1]


def explanation_line(body: dict[str, Any]) -> str:
    """One line for a person: what was attributed, by which method, and how complete the attributions are."""
    if body.get("error"):
        return f"explanation of {body.get('output')}: failed ({body.get('kind')}): {body['error']}"
    classes = ",".join(str(c) for c in body.get("classes", [])) or "-"
    f_x, f_b, delta = body.get("f_x", []), body.get("f_baseline", []), body.get("delta", [])
    rows = " ".join(f"f(x) {x:.4g} f(baseline) {b:.4g} gap {d:.2g}" for x, b, d in zip(f_x, f_b, delta, strict=False))
    inputs = ", ".join(f"{n} {a.get('shape')}" for n, a in body.get("attributions", {}).items())
    return f"explanation ({body.get('method')}) of {body.get('output')} at class {classes}: {rows}; over {inputs}"


def run_lineage(kafka: KafkaSettings, request_id: str, topology: str, *, fmt: str, prefix: str = "fs") -> int:
    steps = asyncio.run(lineage(kafka, request_id, topology, prefix=prefix))
    if not steps:
        raise FlowserveError(f"no lineage for request '{request_id}' in {resolve_base(topology, prefix)}.lineage; "
                             "is 'capture: {lineage: true}' set and was the request sampled?")
    full_id = str(steps[0].record.get("request_id") or request_id)
    explained = asyncio.run(explanations(kafka, full_id, topology, prefix=prefix))
    if fmt == "json":
        for s in steps:
            inputs = [None if d is None else {"topic": d.topic, "partition": d.partition, "offset": d.offset,
                                              "tensors": {n: tensor_json(a) for n, a in d.tensors.items()},
                                              "error": d.error}
                      for d in s.inputs]
            print(json.dumps({**s.record, "input_records": inputs}, separators=(",", ":")))
        for body in explained:
            print(json.dumps({"kind": "explanation", **body}, separators=(",", ":")))
        return 0
    traces = {str(s.record["trace_id"]) for s in steps if s.record.get("trace_id")}
    full = full_id
    print(f"request {full}: {len(steps)} step(s); trace {', '.join(sorted(traces)) or 'none'}")
    for s in steps:
        r = s.record
        batch, timing = r.get("batch", {}), r.get("timing", {})
        print(f"● {r['node']}  {r.get('component')}")
        weights = f"  weights {r['weights_hash'][:16]}" if r.get("weights_hash") else ""
        print(f"    params {r.get('params_hash')}{weights}  batch {batch.get('id')} "
              f"(#{batch.get('index')} of {batch.get('size')})  start {timing.get('start_ms')}  "
              f"batch {timing.get('batch_ms')} ms  span {r.get('span_id') or '-'}")
        for (topic, partition, offset), d in zip(r.get("inputs", []), s.inputs or [None] * len(r["inputs"]),
                                                 strict=False):
            print(f"    in  {topic} p{partition}@{offset}")
            if d is not None:
                for name, array in d.tensors.items():
                    print(f"        {summarize(name, array)}")
        for topic, partition, port in r.get("outputs", []):
            print(f"    out {topic} p{partition} ({port})")
        if r.get("energy"):
            e = r["energy"]
            print(f"    energy {e['joules']:.4g} J  {e['g_co2e']:.4g} g CO2e  ({e['rows']} of {e['batch_rows']} rows, "
                  f"{e['meter']})")
        if r.get("error"):
            print(f"    error: {r['error']}")
    total = [s.record["energy"] for s in steps if s.record.get("energy")]
    if total:
        print(f"energy {sum(e['joules'] for e in total):.4g} J  {sum(e['g_co2e'] for e in total):.4g} g CO2e "
              f"over {len(total)} hop(s)")
    for body in explained:
        print(explanation_line(body))
    return 0
