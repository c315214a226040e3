"""Write docs/benchmarks.md from benchmarks/method.md and the saved results in benchmarks/results/*.json.

    python benchmarks/render.py            # rewrite docs/benchmarks.md
    python benchmarks/render.py --check    # exit 1 if docs/benchmarks.md is not what this would write (CI)

A result file is what ``flowserve bench WORKLOAD ... --save benchmarks/results/NAME.json`` wrote: the
command, the date, the machine and the bench's own JSON. The page is never edited by hand; the history of
each figure is the history of its file in git.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flowserve_bench import WORKLOADS

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "benchmarks.md"
#: rows of one table at most: a bench's full rows stay in its JSON file (the tuner's summary is every
#: pipeline x trace, each a target's row)
MAX_ROWS = 12
ROWS = {"tuner-simulated": 20, "plan-objectives": 12}
#: one table per bench (the page keeps under 400 lines; the rest is in the JSON file): the first the result
#: holds, or the one named here
MAIN = {"broker": "throughput_over_kafka", "tuner-simulated": "summary", "chaos": "memory_mib"}
#: per result file, what stays in the JSON alone
LEAVE_OUT = {"chaos": {"faults", "lost_ids", "reasons"}, "parity": {"notes"}, "parity-emulated": {"notes"},
             "tuner-simulated": {"timelines", "rates_per_minute"}, "hop-cpu": {"loads"}}
#: columns of one table at most (the first ones in the bench's own order)
MAX_COLS = 9

Scalar = str | int | float | bool | None


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _is_interval(v: Any) -> bool:
    return isinstance(v, list) and len(v) in (2, 3) and all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in v)


def fmt(v: Any) -> str:
    """A figure as a person reads it: 3 significant digits, booleans as yes/no, intervals as lo-hi."""
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):
        if v != v:
            return "n/a"
        if v.is_integer() and 10_000 <= abs(v) < 1e12:  # a count that went through a median
            return f"{int(v):,}"
        if v == 0 or 0.01 <= abs(v) < 10_000:
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return f"{v:.2e}"
    if v is None:
        return ""
    if _is_interval(v):  # [low, high], or [point, low, high] as the benches return a ratio
        body = f"{fmt(float(v[-2]))}-{fmt(float(v[-1]))}"
        return body if len(v) == 2 else f"{fmt(float(v[0]))} ({body})"
    text = str(v).replace("|", "/").replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def flat(d: dict[str, Any], prefix: str = "", depth: int = 2) -> dict[str, Any]:
    """Scalars (and 2-number intervals) of a dict, nested dicts flattened to ``a.b`` up to ``depth``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if _is_scalar(v) or _is_interval(v):
            out[key] = v
        elif isinstance(v, dict) and depth > 1:
            out.update(flat(v, key + ".", depth - 1))
    return out


def table(rows: list[dict[str, Any]], label: str | None = None, max_rows: int = MAX_ROWS) -> list[str]:
    cols: list[str] = []
    for row in rows:
        cols += [c for c in row if c not in cols and c != "_label"]
    # a column with one value in every row is said once, above the table
    same = {c: rows[0].get(c) for c in cols if len(rows) > 2 and all(r.get(c) == rows[0].get(c) for r in rows)}
    cols = [c for c in cols if c not in same][:MAX_COLS]
    if not cols:
        return []
    lines = ["In every row: " + ", ".join(f"{c} {fmt(v)}" for c, v in same.items()) + ".", ""] if same else []
    head = ([label] if label is not None else []) + cols
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows[:max_rows]:
        cells = ([fmt(row.get("_label"))] if label is not None else []) + [fmt(row.get(c)) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    if len(rows) > max_rows:
        lines.append(f"\n({len(rows) - max_rows} more rows in the JSON file)")
    return lines


def tables_of(result: dict[str, Any], leave_out: set[str] | frozenset[str] = frozenset(),
              main: str | None = None, max_rows: int = MAX_ROWS) -> list[str]:
    """The result's main table (``main``, else its first list of records or record of records) and its
    scalars in one line."""
    out: list[str] = []
    shown = {"targets", *leave_out}
    for key, value in result.items():
        if key in shown:
            continue
        is_table = isinstance(value, list | dict) and bool(value) and all(
            isinstance(r, dict) for r in (value if isinstance(value, list) else value.values()))
        if is_table and (out or (main is not None and key != main)):  # one table: the others stay in the JSON
            shown.add(key)
            continue
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            rows = [flat(r) for r in value]
            if any(rows):
                out += ["", f"`{key}`:", "", *table(rows, max_rows=max_rows)]
                shown.add(key)
        elif isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()):
            rows, rest = [], []
            for k, r in value.items():
                inner = [(k2, v2) for k2, v2 in r.items() if isinstance(v2, dict)]
                if len(inner) >= 2 and all(any(_is_scalar(x) for x in v2.values()) for _, v2 in inner):
                    # records of records of records (scenario -> contender -> figures): a row per pair, and
                    # the record's own figures (its ratios) in a table of their own
                    rows += [{"_label": f"{k} / {k2}", **flat(v2, depth=1)} for k2, v2 in inner]
                    own = flat({k2: v2 for k2, v2 in r.items() if not isinstance(v2, dict)})
                    if own:
                        rest.append({"_label": k, **own})
                else:
                    rows.append({"_label": k, **flat(r)})
            if any(len(r) > 1 for r in rows):
                out += ["", f"`{key}`:", "", *table(rows, label="", max_rows=max_rows)]
                if rest:
                    out += ["", *table(rest, label="")]
                shown.add(key)
        elif key in shown:
            continue
    scalars = flat({k: v for k, v in result.items() if k not in shown})
    if scalars:
        out += ["", "Figures: " + "; ".join(f"{k} {fmt(v)}" for k, v in list(scalars.items())[:24]) + "."]
    return out


def section(doc: dict[str, Any], name: str) -> list[str]:
    m = doc.get("machine", {})
    where = f"{m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB, {m.get('processor', '?')}"
    result = doc["result"]
    lines = [f"### {name}", "", f"`{doc['command']}` — {doc['date']}, {where}."]
    targets = result.get("targets") or {}
    if targets:
        met = sum(bool(v) for v in targets.values())
        lines += ["", f"Targets met: {met} of {len(targets)}: "
                  + "; ".join(f"`{k}` {fmt(bool(v))}" for k, v in targets.items()) + "."]
    if result.get("workload") == "gateway-against":
        lines += ["", "Throughput, flowserve / the other server (95% interval), the p99 ratio and flowserve's "
                  "worker CPU per request per stage, per level:", "",
                  *table(against_rows(result), label="broker / topology")]
    if result.get("workload") == "hop-cpu":
        lines += ["", "Worker CPU per record per hop (µs, from /proc), this code / the earlier commit's (95% "
                  "interval), and the floors, relays that only pass records on (`floor_*`):", "",
                  *table(hop_rows(result))]
    lines += tables_of(result, LEAVE_OUT.get(name, set()), MAIN.get(name), ROWS.get(name, MAX_ROWS))
    return lines + [""]


def hop_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``flowserve bench hop-cpu``: a row per level: the CPU and throughput ratios, each side's CPU per record
    per hop, and each floor's."""
    rows = []
    for load in result.get("loads") or []:
        row = {"load": load["load"], "cpu now / before": load["cpu_ratio"],
               "throughput now / before": load["throughput_ratio"]}
        for key, figures in load.items():
            if isinstance(figures, dict) and "cpu_us_per_record_per_hop" in figures:
                row[key] = figures["cpu_us_per_record_per_hop"]
        rows.append(row)
    return rows


def against_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``flowserve bench gateway --against``: a row per broker and topology, a column per load: the
    throughput ratio, the p99 ratio, and flowserve's worker CPU per request per stage (µs, from /proc)."""
    rows = []
    for broker, runs in (result.get("brokers") or {}).items():
        for run in runs:
            row: dict[str, Any] = {"_label": f"{broker} / {run['topology']}"}
            for load in run["loads"]:
                p99 = load.get("p99_ratio") or [None]
                workers = [v for k, v in load.get("flowserve", {}).get("cpu_us_per_request", {}).items()
                           if k.startswith("worker:")]
                hop = f"; {sum(workers) / len(workers):.0f} µs/hop" if workers else ""
                row[load["load"]] = f"{fmt(load['throughput_ratio'])}; p99 {fmt(p99[0])}{hop}"
            rows.append(row)
    return rows


def render(results_dir: Path = HERE / "results", method: Path = HERE / "method.md") -> str:
    lines = [method.read_text().rstrip(), "", "## Figures", "",
             "Generated by `python benchmarks/render.py` from `benchmarks/results/*.json` (each written by the",
             "command shown with `--save`); the history of a figure is its file's history in git.", ""]
    files = sorted(results_dir.glob("*.json"))
    if not files:
        lines += ["No saved result yet.", ""]
    docs = [(path.stem, json.loads(path.read_text())) for path in files]
    for name, doc in docs:
        lines += section(doc, name)
    ran = {doc.get("bench") for _, doc in docs}
    missing = [w for w in WORKLOADS if w not in ran and w not in ("simulate", "learn")]  # parts of others
    if missing:
        lines += ["### Not yet saved", "",
                  "No saved result yet (their figures before this page was generated are in its git history): "
                  + ", ".join(f"`{w}`" for w in missing) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--check", action="store_true", help="exit 1 when docs/benchmarks.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if DOC.read_text() != text:
            print(f"{DOC} is not what benchmarks/render.py writes: run python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
