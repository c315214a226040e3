"""Offloading components run in a thread while their batches are slow, on the event loop when fast."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fs_testkit import WhereAmI

from flowserve.client import TopologyClient
from flowserve.kafka.settings import WorkerSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: NAME
nodes:
  a: {component: fs_testkit:WhereAmI, inputs: {x: input.x}}
outputs: {y: a.x}
"""


@pytest.mark.parametrize(("inline_below_ms", "inline"), [(60_000.0, True), (0.0, False)])
async def test_offload_goes_inline_only_below_the_threshold(kafka, write_topology, inline_below_ms: float,
                                                             inline: bool) -> None:
    topology = load_topology(write_topology(TOPOLOGY))
    WhereAmI.threads.clear()
    settings = WorkerSettings(inline_below_ms=inline_below_ms)
    async with InlineHost(topology, kafka, settings) as _, TopologyClient(topology, kafka) as client:
        for i in range(5):  # one at a time: five batches
            reply = await client.call({"x": np.full((1, 4), i, np.float32)}, timeout_ms=60_000)
            assert reply.error is None
            np.testing.assert_array_equal(reply.tensors["y"], np.full((1, 4), i, np.float32))
    main = threading.get_ident()
    assert len(WhereAmI.threads) >= 5
    assert WhereAmI.threads[0] != main  # nothing is known of the first batch: it runs in a thread
    assert all((t == main) == inline for t in WhereAmI.threads[1:])
