"""The broker bench's report: ratios to the baseline with intervals, and its target (flowserve_bench.default_broker)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowserve.kafka.brokers import Broker, EmbeddedBroker
from flowserve_bench.default_broker import KINDS, _report, _Side
from flowserve_bench.paired import Slice

LEVELS = (1, 8)


@pytest.fixture(scope="module")
def real_broker() -> Iterator[Broker]:
    started = EmbeddedBroker.start()  # a real process, so the report's CPU and memory readings have one
    yield started
    started.stop()


def _side(broker: Broker, rate: float) -> _Side:
    side = _Side(broker, start_s=1.0, start_cpu_s=0.5)
    for level in LEVELS:
        side.slices[level] = [Slice(int(rate * level * 2), 2.0, [5.0] * int(rate * level * 2)) for _ in range(4)]
        side.cpu[level] = 0.1
        side.failed[level] = 0
    return side


@pytest.mark.integration
@pytest.mark.parametrize(("default_rate", "met"), [(90.0, True), (70.0, False)])
def test_target_is_the_default_at_0_8x_kafka_at_every_level(real_broker: Broker, default_rate: float,
                                                             met: bool) -> None:
    rates = {"default": default_rate, "kafka": 100.0, "tansu": 50.0}
    sides = {label: _side(real_broker, rates[label]) for label in KINDS}
    out = _report(sides, LEVELS, slice_s=2.0, rounds=4)
    assert out["targets"] == {"default_ge_0_8x_kafka": met}
    point, low, high = out["throughput_over_kafka"]["default"]["8"]
    assert point == pytest.approx(default_rate / 100.0, rel=0.01)
    assert low <= point <= high
    assert out["brokers"]["tansu"]["levels"]["1"]["broker_cpu_us_per_request"] == round(0.1 / 400 * 1e6)
    assert out["brokers"]["kafka"]["rss_mb_at_end"] > 0
