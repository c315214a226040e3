"""The house's size rules (STYLE.md, issue 37), checked so that no change drifts past them unseen: no module
over 450 lines in any of the three distributions, no package of ``flowserve`` over 15% of its lines, and
every package of ``flowserve`` placed in import-linter's layers contract (one left out could import
anything, as the contract only orders the packages it names)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "flowserve", ROOT / "components" / "flowserve_components", ROOT / "benchmarks" / "flowserve_bench")
MAX_LINES = 450
MAX_PACKAGE_SHARE = 0.15
#: top-level modules outside the layers contract, each with its reason (checked below where it can be)
OUTSIDE = {"flowserve.console": "the shared Rich consoles: a leaf that imports nothing of flowserve"}


def _lines(path: Path) -> int:
    return path.read_text().count("\n")


def test_no_module_is_over_450_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for src in SOURCES for p in src.rglob("*.py") if (n := _lines(p)) > MAX_LINES}
    assert not long, f"split these by concept: {long}"


def test_no_package_holds_over_15_percent_of_the_core() -> None:
    core = ROOT / "flowserve"
    total = sum(_lines(p) for p in core.rglob("*.py"))
    shares = {d.name: sum(_lines(p) for p in d.rglob("*.py")) / total for d in core.iterdir() if d.is_dir()
              and (d / "__init__.py").exists()}
    assert max(shares.values()) < MAX_PACKAGE_SHARE, sorted(shares.items(), key=lambda kv: -kv[1])[:3]


def test_every_core_package_has_its_place_in_the_layers() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["type"] == "layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    packages = {f"flowserve.{d.name}" for d in (ROOT / "flowserve").iterdir() if (d / "__init__.py").exists()}
    modules = {f"flowserve.{p.stem}" for p in (ROOT / "flowserve").glob("*.py")
               if p.stem not in ("__init__", "__main__")}
    assert packages - placed == set(), "add these packages to the layers contract in pyproject.toml"
    # top-level modules too (errors, component, builtin, console...), or say why one stays outside
    assert modules - placed <= set(OUTSIDE), f"place these modules in the layers contract: {modules - placed}"
    lines = (ROOT / "flowserve" / "console.py").read_text().splitlines()
    assert not [line for line in lines if line.startswith(("from flowserve", "import flowserve"))]



def test_every_test_module_has_its_own_name() -> None:
    # tests/ has no __init__.py: pytest imports each test module by its basename, so two of one name in
    # different folders stop the whole run at collection ("import file mismatch")
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
