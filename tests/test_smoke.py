"""The README's first command, end to end, on each broker kind: the fast tier's one check that the worker
processes, the broker and the request/reply path work together (the rest: ``pytest -m integration``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = 50
RUN_TIMEOUT_S = 240  # a bound on a hung run, not a timing assertion


@pytest.mark.smoke
@pytest.mark.every_broker
def test_digits_answers_every_sample_request(broker: object) -> None:
    # As the README's command does, it trains the digits models into the user's cache on first use.
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    done = subprocess.run(
        [sys.executable, "-m", "flowserve", "run", str(REPO / "topologies" / "digits.yaml"),
         "--sample", str(SAMPLES), "--broker", bootstrap],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO,
        env={**os.environ, "COLUMNS": "200",
             "FLOWSERVE_FETCH_MAX_WAIT_MS": str(broker.settings().fetch_max_wait_ms)})  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["sent"], summary["ok"], summary["errors"], summary["timeouts"]) == (SAMPLES, SAMPLES, 0, 0)
    assert summary["accuracy"] >= 0.9  # the MLP scores ~0.98 on held-out digits
