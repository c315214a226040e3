"""``flowserve bench WORKLOAD``: the core CLI finds the bench through its entry point, each workload has only
its own flags, and without the distribution the command says how to install it."""

from __future__ import annotations

import argparse

import pytest

import flowserve.cli
from flowserve.cli import build_parser, main
from flowserve_bench import WORKLOADS


def _bench(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    commands = next(a for a in parser._subparsers._group_actions if a.dest == "command")  # noqa: SLF001
    bench = commands.choices["bench"]
    return next(a for a in bench._subparsers._group_actions if a.dest == "workload").choices  # noqa: SLF001


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}  # noqa: SLF001


def test_every_workload_is_a_subcommand() -> None:
    assert set(_bench(build_parser())) == set(WORKLOADS)


def test_a_workload_lists_only_its_own_flags() -> None:
    workloads = _bench(build_parser())
    common = {"-h", "--help", "--save", "--plot"}
    broker = {"--broker", "--broker-kind"}
    assert _flags(workloads["passthrough"]) == common | broker | {"--records"}
    assert _flags(workloads["tuner"]) == common | broker | {
        "--part", "--rate", "--trace-seconds", "--slo-ms", "--rule", "--sim-repeats", "--simulated", "--trace",
        "--pipelines", "--traces", "--contenders", "--deadline", "--start", "--pause", "--sim-seconds"}
    assert _flags(workloads["chaos"]) == common | {"--minutes", "--nodes", "--seed", "--rate", "--gateways",
                                                    "--fault-every", "--pause-broker", "--no-pause-broker"}
    assert _flags(workloads["learn-selection"]) == common | broker
    assert "--against" in _flags(workloads["gateway"]) and "--against" not in _flags(workloads["latency"])


def test_the_flags_parse_to_what_the_workload_reads() -> None:
    args = build_parser().parse_args(["bench", "parity", "--stage", "emulated", "--rounds", "2"])
    assert (args.workload, args.stage, args.rounds, args.slice_seconds, args.k) == ("parity", "emulated", 2, 4.0, 2)
    args = build_parser().parse_args(["bench", "tuner", "--simulated", "--pipelines", "social-media"])
    assert args.simulated and args.pipelines == ["social-media"] and callable(args.run)
    with pytest.raises(SystemExit):  # a chaos flag is no tuner flag
        build_parser().parse_args(["bench", "tuner", "--minutes", "2"])


def test_without_the_bench_distribution_the_command_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(flowserve.cli, "extensions", list)
    commands = next(a for a in build_parser()._subparsers._group_actions if a.dest == "command")  # noqa: SLF001
    assert "bench" not in commands.choices and "plan" in commands.choices
    assert main(["bench", "tuner", "--simulated"]) == 2
    err = capsys.readouterr().err
    assert "pip install -e ./benchmarks" in err and err.count("\n") == 1
