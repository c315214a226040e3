"""The command line's one way to add a command: each module under flowserve/cli registers its own."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import subprocess
import sys

import flowserve.cli
from flowserve.cli import build_parser

#: the modules of flowserve/cli that add no command of their own
HELPERS = {"common"}

#: what ``flowserve --help`` must not import: each costs a noticeable part of a second
HEAVY = ("aiokafka", "faust", "torch", "opentelemetry.sdk", "matplotlib", "flowserve.runtime.worker",
         "flowserve.gateway.app", "flowserve.tuning.plan")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return dict(action.choices)


def _without_func(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The commands under ``parser`` (``path`` names it) that would run nothing: no ``func`` set."""
    nested = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
    if nested is None:
        return [] if parser.get_default("func") is not None else [path]
    return [m for name, sub in nested.choices.items() for m in _without_func(sub, f"{path} {name}")]


def _command_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(flowserve.cli.__path__) if m.name not in HELPERS)


def test_every_command_module_registers_its_commands_and_the_parser_has_them_all() -> None:
    registered: dict[str, str] = {}
    for name in _command_modules():
        module = importlib.import_module(f"flowserve.cli.{name}")
        parser = argparse.ArgumentParser()
        module.register(parser.add_subparsers(dest="command", required=True))
        for command, sub in _commands(parser).items():
            assert command not in registered, f"'{command}' is registered by {registered.get(command)} and {name}"
            assert not _without_func(sub, command), f"{name}: {_without_func(sub, command)} set no func"
            registered[command] = name
    for entry in flowserve.cli.extensions():  # commands of other installed distributions (flowserve bench)
        parser = argparse.ArgumentParser()
        entry.load()(parser.add_subparsers(dest="command", required=True))
        registered.update(dict.fromkeys(_commands(parser), entry.value))
    assert set(_commands(build_parser())) == set(registered)
    assert {"run", "worker", "gateway", "tune", "inspect", "deploy"} <= set(registered)


def test_a_command_parses_to_its_function() -> None:
    args = build_parser().parse_args(["gateway", "a.yaml", "--broker", "b:9092", "--processes", "2"])
    assert (args.func.__module__, args.func.__name__) == ("flowserve.cli.gateway", "cmd_gateway")
    assert (args.topology, args.processes) == (["a.yaml"], 2)


def test_building_the_parser_imports_nothing_heavy() -> None:
    code = ("import json, sys\nfrom flowserve.cli import build_parser\nbuild_parser()\n"
            "print(json.dumps(sorted(sys.modules)))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           check=True).stdout))
    assert not [m for m in HEAVY if m in loaded]
