"""``flowserve drift``: the current state of a topology's drift detectors, per detector and context.

Detectors (``flowserve_components.drift``) write one JSON record per closed window to
``<prefix>.<topology>.drift``, keyed ``<detector>/<context>``. This reads them back and keeps, per key,
the latest window and the totals::

    flowserve drift digits-drift --broker localhost:9092
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from flowserve.capture.inspect import resolve_base
from flowserve.capture.reader import Reader
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import names


async def drift_state(kafka: KafkaSettings, topology: str, *, prefix: str = "fs", timeout_s: float = 30.0
                      ) -> dict[str, dict[str, Any]]:
    """Per ``detector/context``: the latest window's record plus ``windows`` and ``drift_windows`` seen."""
    base = resolve_base(topology, prefix)
    async with Reader(kafka, timeout_s=timeout_s) as reader:
        records = await reader.read([names.side_topic(base, "drift")])
    state: dict[str, dict[str, Any]] = {}
    for rec in records:
        body = rec.body
        if not isinstance(body, dict) or "detector" not in body:
            continue
        key = str(body.get("key") or rec.key)
        entry = state.setdefault(key, {"windows": 0, "drift_windows": 0})
        entry["windows"] += 1
        entry["drift_windows"] += int(bool(body.get("is_drift")))
        entry["latest"] = body
    return state


def run_drift(kafka: KafkaSettings, topology: str, *, fmt: str, prefix: str = "fs") -> int:
    state = asyncio.run(drift_state(kafka, topology, prefix=prefix))
    if fmt == "json":
        print(json.dumps(state, separators=(",", ":")))
        return 0
    if not state:
        print(f"no drift results yet in {resolve_base(topology, prefix)}.drift")
        return 0
    print(f"{'detector':<16} {'context':<12} {'method':<6} {'windows':>7} {'drifted':>7}  latest")
    for entry in state.values():
        b = entry["latest"]
        latest = (f"window {b.get('window')}: {'DRIFT' if b.get('is_drift') else 'ok'} "
                  f"p={b.get('p_val'):.3g} (threshold {b.get('threshold'):.3g}, {b.get('rows')} rows)")
        print(f"{b.get('detector', ''):<16} {str(b.get('context') or '-'):<12} {b.get('method', ''):<6} "
              f"{entry['windows']:>7} {entry['drift_windows']:>7}  {latest}")
    return 0
