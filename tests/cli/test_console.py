"""The command line's consoles: a line printed to a pipe or a log stays one line."""

from __future__ import annotations

import pytest

from flowserve.console import make_console


@pytest.mark.parametrize("stderr", [False, True])
def test_a_long_line_to_a_pipe_is_not_wrapped(capsys: pytest.CaptureFixture[str], stderr: bool) -> None:
    line = "p99 " + " ".join(f"figure{i}" for i in range(60))  # ~500 characters, spaces where a wrap would fall
    make_console(stderr=stderr).print(line)
    captured = capsys.readouterr()
    assert (captured.err if stderr else captured.out) == line + "\n"


def test_tables_in_a_pipe_take_the_width_they_need(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.table import Table

    table = Table()
    for name in ("node", "a rather long column heading", "another rather long column heading", "p99 ms"):
        table.add_column(name)
    table.add_row("model", "1", "2", "3.456")
    make_console().print(table)
    out = capsys.readouterr().out
    assert "another rather long column heading" in out and "3.456" in out
