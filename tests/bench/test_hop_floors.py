"""hop-cpu's floors on a real broker: every kind of relay passes records on whole (value, key, headers), and
the native one says what it lacks where it cannot be built."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowserve_bench import hop_native
from flowserve_bench.hop_floor import CLIENTS, Floor, unavailable

pytest.importorskip("confluent_kafka")


def test_the_native_relay_says_what_it_lacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FLOWSERVE_RDKAFKA_INCLUDE", raising=False)
    monkeypatch.setattr(hop_native, "INCLUDE_DIRS", (str(tmp_path),))
    with pytest.raises(hop_native.NativeUnavailable, match=r"rdkafka\.h.*librdkafka-dev"):
        hop_native.build()
    assert "librdkafka-dev" in (unavailable("native") or "")  # the bench prints this and runs the other floors
    assert unavailable("plane-aiokafka") is None


@pytest.mark.parametrize("client", CLIENTS)
def test_a_relay_chain_passes_records_on_whole(kafka: object, client: str) -> None:
    if why := unavailable(client):
        pytest.skip(f"no {client} relay here: {why}")
    headers = [("fs-id", b"r-1"), ("fs-topology", b"t"), ("fs-traceparent", b"\x00\xffbinary")]
    floor = Floor(kafka, client, stages=2, partitions=2, value=b"v" * 300, headers=headers)  # type: ignore[arg-type]
    try:
        floor.ready()
        floor.producer.produce(floor.topics[0], b"marked", b"k-1", partition=1, headers=headers)
        floor.producer.flush(10)
        end, seen = time.monotonic() + 60, None
        while seen is None and time.monotonic() < end:
            m = floor.consumer.poll(0.5)
            if m is not None and m.error() is None and m.value() == b"marked":
                seen = m
        assert seen is not None, f"the marked record did not come through two {client} relays"
        assert (seen.key(), seen.partition(), seen.headers()) == (b"k-1", 1, headers)
        done, seconds, cpu_s = floor.slice(4, 1.0)
        assert done > 0 and seconds > 0 and cpu_s > 0
    finally:
        floor.close()
