"""Reading a broker's JIT compiler time from /proc (the gateway bench warms up until it is quiet)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from flowserve_bench.procs import jit_cpu, listener_pids

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_process_that_is_not_a_jvm_compiles_nothing() -> None:
    assert jit_cpu([os.getpid()]) == 0.0
    assert jit_cpu([2**22 + 1]) == 0.0  # no such process: nothing, not an error


def test_a_jvm_broker_shows_its_compiler_threads(broker: Any) -> None:
    pids = listener_pids(int(broker.settings().bootstrap.rsplit(":", 1)[1]))
    assert pids
    if not any("java" in os.readlink(f"/proc/{pid}/exe") for pid in pids):
        pytest.skip("the broker is not a JVM")
    assert jit_cpu(pids) > 0  # a started JVM has compiled its start-up paths
