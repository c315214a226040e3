"""docs/benchmarks.md is generated from the saved results, never edited by hand, and shows a missed target."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _render_module():  # noqa: ANN202 - a script beside the results, loaded by path
    spec = importlib.util.spec_from_file_location("benchmarks_render", REPO / "benchmarks" / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_the_results_render_to() -> None:
    render = _render_module()
    assert (REPO / "docs" / "benchmarks.md").read_text() == render.render(), (
        "docs/benchmarks.md is out of date: run python benchmarks/render.py")


def test_the_page_stays_under_580_lines() -> None:
    # 27 result files at about 20 lines each: a table each, its full rows in the JSON file
    assert (REPO / "docs" / "benchmarks.md").read_text().count("\n") < 580


def test_a_missed_target_and_the_tables_show(tmp_path: Path) -> None:
    render = _render_module()
    results = tmp_path / "results"
    results.mkdir()
    (results / "demo.json").write_text(json.dumps({
        "bench": "demo", "command": "flowserve bench demo --rounds 2", "date": "2026-12-03 08:00 UTC",
        "machine": {"cores": 2, "memory_gib": 23.4, "processor": "x86_64"},
        "result": {"rate": 50.0, "levels": [{"level": 1, "rps": 812.25, "p99_ms": 3.5},
                                            {"level": 8, "rps": 2400.0, "p99_ms": 9.75}],
                   "ratio": {"point": 0.93, "low": 0.81, "high": 1.04},
                   "targets": {"ratio_ge_1": False, "lost_zero": True}}}))
    method = tmp_path / "method.md"
    method.write_text("# Benchmarks\n")
    page = render.render(results, method)
    assert "`flowserve bench demo --rounds 2` — 2026-12-03 08:00 UTC, 2 cores" in page
    assert "Targets met: 1 of 2: `ratio_ge_1` **no**; `lost_zero` yes." in page
    assert "| 8 | 2400 | 9.75 |" in page
    assert "ratio.low 0.81" in page
