"""The ``flowserve`` command line: a module per command (or family), each adding itself with ``register``.

Each ``register(sub)`` adds its subparsers to ``sub`` and sets their ``func``; :func:`build_parser` calls
them in turn, in the order ``flowserve --help`` lists the commands, then the ``register`` of each command
another installed distribution adds through the ``flowserve.commands`` entry point group
(``flowserve bench``: ``pip install -e ./benchmarks``).

A command module imports at its top what ``flowserve --help`` loads anyway (the topology layer, the
settings, the console) and small modules of its own; inside the command that needs it, whatever would
slow ``flowserve --help`` down (aiokafka, faust, the HTTP servers, torch, the planner's search).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from pydantic import ValidationError

import flowserve
from flowserve.cli import (
    acl,
    broker,
    capture,
    deploy,
    explain,
    gateway,
    health,
    importing,
    learning,
    measure,
    models,
    parity,
    planning,
    run,
    topologies,
    train,
    ui,
    worker,
)
from flowserve.cli.common import console
from flowserve.errors import FlowserveError, SettingsError

#: the entry point group of commands that other distributions add (``register(sub)``, like the modules here)
EXTENSIONS = "flowserve.commands"
#: commands of distributions this repository holds, with how to install each
OPTIONAL = {"bench": "`flowserve bench` comes with the flowserve-bench distribution: pip install -e ./benchmarks "
            "(from a flowserve checkout)"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowserve", description=(flowserve.__doc__ or "").strip())
    sub = parser.add_subparsers(dest="command", required=True)
    run.register(sub)  # run
    worker.register(sub)  # worker, control
    topologies.register(sub)  # validate, graph, topics
    train.register(sub)  # train
    broker.register(sub)  # broker
    deploy.register(sub)  # deploy render
    gateway.register(sub)  # gateway
    health.register(sub)  # health
    capture.register(sub)  # inspect, lineage, drift
    explain.register(sub)  # explain, explainer
    ui.register(sub)  # ui
    parity.register(sub)  # parity train
    acl.register(sub)  # acl: the least Kafka ACLs per stage, gateway, tuner, UI
    learning.register(sub)  # learn, shadow, versions, promote, rollback
    importing.register(sub)  # import: topologies from an MLServer or Triton model repository
    measure.register(sub)  # profile, stats
    models.register(sub)  # models list, load, unload
    planning.register(sub)  # trace, simulate, plan, tune
    for command in extensions():  # bench WORKLOAD, from flowserve-bench
        command.load()(sub)
    return parser


def extensions() -> list[EntryPoint]:
    """The commands installed distributions add: each entry point of the group names a ``register``."""
    return sorted(entry_points(group=EXTENSIONS), key=lambda ep: ep.name)


def _not_installed(argv: Sequence[str]) -> str | None:
    """What to install for ``argv``'s command when it comes from a distribution that is not installed."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in OPTIONAL and command not in {ep.name for ep in extensions()}:
        return OPTIONAL[command]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    missing = _not_installed(sys.argv[1:] if argv is None else argv)
    if missing:
        console.print(f"[red]error:[/] {missing}")
        return 2
    args = build_parser().parse_args(argv)
    # Components are referenced as module:Class; let modules beside the user resolve like `python -m` does.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return int(args.func(args) or 0)
    except FlowserveError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    except ValidationError as exc:  # settings built from flags: say which, not a traceback
        console.print(f"[red]error:[/] {SettingsError.from_validation(exc)}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
