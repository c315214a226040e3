"""``flowserve import DIR``: a topology YAML per model of an MLServer or Triton model repository.

Prints each topology written, then what it could not map (each with why) and what it mapped with a
difference. Exit status 0 when everything was mapped, 1 when something was not, 2 when DIR is not a
model repository.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from flowserve.console import make_console

console = make_console(stderr=True)
out = make_console()


def register(sub: Any) -> None:
    p = sub.add_parser("import", help="write topologies for an MLServer or Triton model repository (per model, "
                                      "per ensemble), printing what it could not map")
    p.add_argument("repository", metavar="DIR", help="the repository: folders with model-settings.json (MLServer) "
                                                      "or config.pbtxt (Triton)")
    p.add_argument("--out", default=".", metavar="DIR", help="where to write the topologies (default: here)")
    p.add_argument("--name", action="append", metavar="NAME", help="import only this model or ensemble "
                                                                   "(repeatable; default: every one)")
    p.add_argument("--force", action="store_true", help="overwrite topology files that exist")
    p.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from flowserve.imports import RepositoryError, import_repository

    try:
        with console.status(f"reading {args.repository}…"):
            report = import_repository(args.repository, args.out, names=args.name, force=args.force)
    except RepositoryError as exc:
        console.print(f"[red]✗[/] {escape(str(exc))}")
        return 2
    for name, path in report.written.items():
        out.print(f"[green]✓[/] {escape(name)}: {escape(str(path))}")
    if report.notes:
        out.print("mapped with a difference:")
        for note in report.notes:
            out.print(f"  [yellow]•[/] {escape(str(note))}")
    if report.unmapped:
        out.print("could not map:")
        for item in report.unmapped:
            out.print(f"  [red]✗[/] {escape(str(item))}")
    if report.written:
        first = next(iter(report.written.values()))
        out.print(f"run one: flowserve run {escape(str(first))}; serve them over HTTP: flowserve gateway FILES "
                  "--broker ADDRESS")
    return 1 if report.unmapped else 0
