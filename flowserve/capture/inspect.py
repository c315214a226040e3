"""``flowserve inspect``: print the records of any edge of a topology, decoded.

Targets: ``TOPOLOGY`` (every topic of the topology), ``TOPOLOGY.NODE`` (the node's output and capture
topics), ``TOPOLOGY.NODE.PORT`` (one edge), or ``TOPOLOGY.inputs|outputs|deadletter|lineage|drift``.
TOPOLOGY is a topology name (topics ``<prefix>.<name>...``) or a YAML file::

    flowserve inspect digits.model.logits --request-id r1 --broker localhost:9092
    flowserve inspect digits --last 5 --format json --broker localhost:9092
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.capture.reader import Decoded, Reader, tensor_json
from flowserve.capture.redact import H_REDACT, LABELS, parse_header
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import names
from flowserve.topology.spec import load_spec

SPECIAL = (names.INPUTS, names.OUTPUTS, names.DEADLETTER, names.LINEAGE, names.ACTIONS, "drift")
#: topics of a topology that are not edges: skipped by ``inspect TOPOLOGY`` (name them to read them).
HIDDEN = names.SERVICE_TOPICS
_FIRST = 6


def resolve_base(topology: str, prefix: str = "fs") -> str:
    """``<prefix>.<name>`` of a topology given by name or by YAML file."""
    if topology.endswith((".yaml", ".yml")) or Path(topology).is_file():
        spec = load_spec(topology)
        return names.base(spec.prefix, spec.name)
    return names.base(prefix, topology)


def split_target(target: str) -> tuple[str, list[str]]:
    """(topology part, remaining dotted parts); a YAML path keeps its own dots."""
    for ext in (".yaml", ".yml"):
        at = target.find(ext)
        if at != -1:
            head, tail = target[: at + len(ext)], target[at + len(ext):]
            return head, [p for p in tail.split(".") if p]
    first, *parts = target.split(".")
    return first, parts


async def target_topics(reader: Reader, target: str, prefix: str = "fs") -> list[str]:
    topology, rest = split_target(target)
    base = resolve_base(topology, prefix)
    if len(rest) > 3:
        raise FlowserveError(f"inspect target '{target}' must be TOPOLOGY[.NODE[.PORT]] (or a fused chain's side "
                             "topic TOPOLOGY.CHAIN.MEMBER.PORT)")
    existing = await reader.topics(base + ".")
    hidden = {f"{base}.{name}" for name in HIDDEN}
    if not rest:
        # Reply routes, worker metrics snapshots and operator commands are not edges of the graph.
        topics = [t for t in existing if not t.startswith(names.replies_prefix(base)) and t not in hidden]
    elif len(rest) == 1 and rest[0] in (*SPECIAL, *HIDDEN):
        topics = [f"{base}.{rest[0]}"] if f"{base}.{rest[0]}" in existing else []
    elif len(rest) == 1:
        topics = [t for t in existing if t.startswith(f"{base}.{rest[0]}.")]
    else:  # NODE.PORT, or a fused chain's side topic CHAIN.MEMBER.PORT
        topics = [t for t in existing if t == f"{base}.{'.'.join(rest)}"]
    if not topics:
        raise FlowserveError(f"no topic on the broker matches '{target}' (topics of {base}: "
                             f"{', '.join(t[len(base) + 1:] for t in existing) or 'none'}); "
                             "is the topology running, and is capture on for unread ports?")
    return topics


async def inspect_records(kafka: KafkaSettings, target: str, *, request_id: str | None = None,
                          last: int | None = None, prefix: str = "fs", timeout_s: float = 30.0) -> list[Decoded]:
    """The decoded records of ``target`` (see the module docstring), oldest first."""
    async with Reader(kafka, timeout_s=timeout_s) as reader:
        topics = await target_topics(reader, target, prefix)
        return await reader.read(topics, key=request_id, last=last)


def summarize(name: str, array: np.ndarray) -> str:
    """One line for a person: name, datatype, shape, min/max/mean, first values."""
    s = tensor_json(array, full=False)
    stats = ""
    if "min" in s:
        stats = f" min {s['min']:.4g} max {s['max']:.4g} mean {s['mean']:.4g}"
    flat = array.ravel()[:_FIRST]
    values = [f"{v:.4g}" for v in flat] if array.dtype.kind == "f" else [str(v) for v in flat.tolist()]
    first = ", ".join(values)
    more = ", …" if array.size > _FIRST else ""
    return f"{name}: {s['datatype']} {list(array.shape)}{stats} [{first}{more}]"


def redacted_line(name: str, label: str, array: np.ndarray) -> str:
    """One line for a redacted (hashed) port: its digests shortened, marked as such, never taken for data."""
    flat = array.ravel()[:_FIRST]
    shown = [f"<{label}:{v.decode('ascii', 'replace')[:12] if isinstance(v, bytes) else str(v)[:12]}…>"
             for v in flat]
    more = ", …" if array.size > _FIRST else ""
    return f"{name}: <{label}> {list(array.shape)} [{', '.join(shown)}{more}]"


def to_json(rec: Decoded) -> dict[str, Any]:
    """A record as JSON for ``--format json``; redacted ports are listed under ``redacted`` (port: how)."""
    out = rec.to_dict(full=True)
    redacted = parse_header(rec.headers.get(H_REDACT, ""))
    if redacted:
        out["redacted"] = redacted
    return out


def format_record(rec: Decoded) -> str:
    lines = [f"{rec.topic} p{rec.partition}@{rec.offset}  key={rec.key}  ts={rec.timestamp_ms}  {rec.size} B"]
    shown = {k: v for k, v in rec.headers.items() if k.startswith(("fs-", "x-", "X-")) or k == "traceparent"}
    if shown:
        lines.append("  headers: " + "  ".join(f"{k}={v}" for k, v in shown.items()))
    redacted = parse_header(rec.headers.get(H_REDACT, ""))
    for name, array in rec.tensors.items():
        label = redacted.get(name)
        lines.append("  " + (summarize(name, array) if label is None else redacted_line(name, label, array)))
    lines.extend(f"  {name}: <dropped>" for name, label in redacted.items() if label == LABELS["drop"])
    if rec.body is not None and not rec.tensors:
        text = json.dumps(rec.body, separators=(",", ":"))
        lines.append("  json: " + (text if len(text) <= 400 else text[:400] + "…"))
    if rec.error is not None:
        lines.append(f"  undecodable: {rec.error}")
    return "\n".join(lines)


def run_inspect(kafka: KafkaSettings, target: str, *, request_id: str | None, last: int | None,
                fmt: str, prefix: str = "fs") -> int:
    if request_id is None and last is None:
        last = 10
    records = asyncio.run(inspect_records(kafka, target, request_id=request_id, last=last, prefix=prefix))
    if fmt == "json":
        for rec in records:
            print(json.dumps(to_json(rec), separators=(",", ":")))
    else:
        for rec in records:
            print(format_record(rec))
        print(f"{len(records)} record(s)")
    return 0
