"""``flowserve health``: exit 1 while a stage has no worker, 0 once one consumes, 2 without a broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from flowserve.cli import main
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration


def _until(argv: list[str], status: int, tries: int = 450) -> None:
    """Run the probe until it exits ``status`` (bounded polling; the assertion is on its exit status)."""
    got = None
    for _ in range(tries):
        if (got := main(argv)) == status:
            return
        time.sleep(0.2)
    raise AssertionError(f"flowserve {' '.join(argv)} still exits {got}, not {status}")


def test_health_follows_the_stage(broker: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "h" + uuid.uuid4().hex[:10]
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"""
name: {name}
nodes:
  a: {{component: flowserve.builtin:Identity, params: {{ports: {{x: {{datatype: FP32, shape: [-1]}}}}}},
      inputs: {{x: input.x}}}}
outputs: {{x: a.x}}
""")
    kafka = broker.settings()  # type: ignore[attr-defined]
    probe = ["health", str(spec), "--broker", kafka.bootstrap]
    topology = load_topology(spec)
    asyncio.run(create_topology_topics(topology, kafka))
    assert main(probe) == 1 and main([*probe, "--live"]) == 1
    assert "stage(s) a of" in capsys.readouterr().err
    host = ProcessHost(spec, topology, kafka)
    host.start_processes()
    try:
        _until(probe, 0)
        assert main([*probe, "--live", "--node", "a"]) == 0
        assert "ready: a" in capsys.readouterr().out
    finally:
        host.stop()
    if broker.name == "kafka":  # type: ignore[attr-defined]
        # The worker left its group on SIGTERM. The embedded broker (Tansu) kept the member listed for the
        # 90 s this waits: there a stage's readiness does not fall when its only worker stops.
        _until([*probe, "--live"], 1)


def test_health_without_a_broker_is_2(tmp_path: Path) -> None:
    spec = Path(__file__).resolve().parents[2] / "topologies" / "echo.yaml"
    assert main(["health", str(spec), "--broker", "127.0.0.1:1"]) == 2
    assert main(["health", str(spec), "--broker", "127.0.0.1:1", "--node", "nope"]) == 2
