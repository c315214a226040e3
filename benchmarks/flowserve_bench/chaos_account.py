"""The chaos run's accounting: what each caller saw and what the topics hold, turned into figures and targets.

:func:`account` is pure (no broker, no clock): a test feeds it a run whose answers it knows. What it
counts, each figure on its own:

- HTTP calls by outcome: ``ok``; ``error`` (an error result with its status); ``refused`` (no gateway
  listened on the port: the connection was refused while one restarted); ``cut`` (the gateway holding the
  connection died during the call); ``timeout``. ``failed`` is the last three together. A failed call is
  never counted as answered.
- Async requests (:class:`~flowserve.client.TopologyClient` over Kafka) by outcome: ``ok``, ``error``,
  ``send_failed`` (the client was told its send failed: counted, not raised), ``lost`` (sent, and no reply
  by the end).
- Answers that reached a caller, by the request id they carry: an id answered twice at its caller is a
  duplicate that reached it. Duplicates the client dropped (at-least-once redelivery after a kill) and
  duplicate answers on the topics are figures of their own: expected after a kill, and hidden from callers.
- The topics: every request id on the inputs topic must be answered on the outputs topic or a gateway's
  reply topic.

Targets: every input id answered (``every_input_id_answered``, and ``lost_zero``, which also needs every
value right), no duplicate reaching a caller, lag back to zero, memory bounded, and, when two or more
gateways share the port (restarted one at a time, as a user runs them in production), no HTTP call refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from flowserve.kafka.replies import Reply
from flowserve_bench.chaos_audit import TopicAudit
from flowserve_bench.common import console

#: how a failed HTTP call is told apart, by the outcome's prefix
HTTP_FAILURES = ("refused", "cut", "timeout")


@dataclass
class Callers:
    """What the callers saw, by request id."""

    #: rid -> "ok" | "error: ..." | "refused: ..." | "cut: ..." | "timeout: ..."
    http: dict[str, str] = field(default_factory=dict)
    http_sent: int = 0
    #: async rid -> its reply, the exception its send ended with, or None (no reply by the end)
    async_outcomes: dict[str, Reply | BaseException | None] = field(default_factory=dict)
    #: async rids whose flush failed (the caller was told), with why
    async_send_errors: dict[str, str] = field(default_factory=dict)
    #: request id -> answers that reached a caller (an HTTP response by the id it carries, an async reply)
    deliveries: Counter[str] = field(default_factory=Counter)
    wrong_values: list[str] = field(default_factory=list)


def expected_row(rid: str) -> np.ndarray:
    """The value request ``rid`` (``h<i>`` or ``a<i>``) sends, hence the one its answer must carry."""
    return np.full((1, 4), float(int(rid[1:]) % 100_000), np.float32)


def account(callers: Callers, audit: TopicAudit, lag: dict[str, int], memory: dict[str, dict[str, Any]], *,
            client_dropped: int, gateways: int) -> dict[str, Any]:
    """The figures and targets of a chaos run (without its fault log and settings: the caller adds those)."""
    http = Counter(v.split(":", 1)[0] for v in callers.http.values())
    reasons = Counter(v for v in callers.http.values() if v != "ok")
    outcomes: Counter[str] = Counter()
    lost: list[str] = []
    wrong = list(callers.wrong_values)
    for rid, outcome in callers.async_outcomes.items():
        if isinstance(outcome, Reply):
            if outcome.error is None:
                outcomes["ok"] += 1
                if "y" not in outcome.tensors or not np.array_equal(outcome.tensors["y"], expected_row(rid)):
                    wrong.append(rid)
            else:
                outcomes["error"] += 1
                reasons[outcome.error[:70]] += 1
        elif isinstance(outcome, BaseException) or rid in callers.async_send_errors:
            outcomes["send_failed"] += 1
            why = callers.async_send_errors.get(rid) or f"{type(outcome).__name__}: {outcome}"
            reasons[f"send failed: {why}"[:80]] += 1
        else:
            lost.append(rid)
    http_failed = sum(http[k] for k in HTTP_FAILURES)
    http_unrecorded = callers.http_sent - len(callers.http)
    unanswered = audit.unanswered
    reaching = sum(n - 1 for n in callers.deliveries.values() if n > 1)
    targets = {
        "every_input_id_answered": not unanswered and not lost and http_unrecorded == 0,
        "lost_zero": not lost and not unanswered and not wrong,
        "caller_duplicates_zero": reaching == 0,
        "lag_zero": bool(lag) and all(v == 0 for v in lag.values()),
        "memory_bounded": bool(memory) and all(bool(m["bounded"]) for m in memory.values()),
    }
    if gateways >= 2:  # one gateway restarting alone leaves nobody on the port: refusals are then expected
        targets["http_refused_zero"] = http["refused"] == 0
    return {
        "gateways": gateways,
        "http": {"sent": callers.http_sent, "ok": http["ok"], "error": http["error"], "failed": http_failed,
                 **{k: http[k] for k in HTTP_FAILURES}, "unanswered": http_unrecorded},
        "async": {"sent": len(callers.async_outcomes), "ok": outcomes["ok"], "error": outcomes["error"],
                  "send_failed": outcomes["send_failed"], "lost": len(lost), "duplicates_dropped": client_dropped},
        "reasons": dict(reasons.most_common(8)),
        "lost": len(lost) + len(unanswered), "lost_ids": (lost + unanswered)[:20], "wrong_values": len(wrong),
        "duplicates_reaching_callers": reaching,
        "topics": {"inputs_ids": len(audit.inputs), "unanswered_ids": len(unanswered),
                   "duplicate_answers": audit.duplicate_answers, "per_topic": audit.per_topic},
        "lag": lag,
        "memory_mib": {role: {k: round(v, 1) if isinstance(v, float) else v for k, v in m.items()}
                       for role, m in memory.items()},
        "targets": targets,
    }


def print_result(result: dict[str, Any]) -> None:
    """The fault log, the accounting per caller, the topics and the memory, as tables."""
    table = Table(title="chaos: faults")
    for col in ("time (s)", "fault", "target", ""):
        table.add_column(col)
    for f in result["faults"]:
        table.add_row(f"{f['at_s']:.1f}", f["kind"], f["target"], f["note"])
    console.print(table)
    acc = Table(title="chaos: accounting")
    for col in ("caller", "sent", "ok", "error result", "refused", "cut", "timeout", "send failed", "lost",
                "duplicates dropped"):
        acc.add_column(col, justify="right")
    h, a = result["http"], result["async"]
    acc.add_row(f"HTTP ({result['gateways']} gateway(s), one port)", *map(str, (
        h["sent"], h["ok"], h["error"], h["refused"], h["cut"], h["timeout"], "-", h["unanswered"], "-")))
    acc.add_row("async (Kafka client)", *map(str, (a["sent"], a["ok"], a["error"], "-", "-", "-", a["send_failed"],
                                                   a["lost"], a["duplicates_dropped"])))
    console.print(acc)
    for reason, n in result["reasons"].items():
        console.print(f"  {n:6d} × {reason}")
    topics = Table(title="chaos: topics (records / distinct request ids)")
    for col in ("topic", "records", "distinct ids"):
        topics.add_column(col, justify="left" if col == "topic" else "right")
    for name, (records, distinct) in result["topics"]["per_topic"].items():
        topics.add_row(name, str(records), str(distinct))
    console.print(topics)
    t = result["topics"]
    console.print(f"inputs answered on some reply topic: {t['inputs_ids'] - t['unanswered_ids']} of {t['inputs_ids']}; "
                  f"lost {result['lost_ids'][:5]}; duplicate answers on the topics {t['duplicate_answers']}; "
                  f"duplicates reaching a caller {result['duplicates_reaching_callers']}; lag {result['lag']}; "
                  f"worker restarts {result['worker_restarts']}; gateway restarts {result['gateway_restarts']}")
    mt = Table(title="chaos: resident memory (MiB)")
    for col in ("process", "max", "middle third", "last third", "bounded"):
        mt.add_column(col, justify="right")
    for role, m in sorted(result["memory_mib"].items()):
        mt.add_row(role, f"{m['max_mib']:.0f}", f"{m['middle_mib']:.0f}", f"{m['last_mib']:.0f}", str(m["bounded"]))
    console.print(mt)
