"""The passthrough bench's accounting (flowserve_bench.passthrough.account): figures from known rates and
CPU seconds, and a run where the identity node falls short of the raw librdkafka batch loop fails the target."""

from __future__ import annotations

from flowserve_bench.passthrough import TARGET_OVER_E, account

RATES = {"a_raw_send": 20_000.0, "b_raw_batch": 50_000.0, "d_rd_poll": 30_000.0, "e_rd_batch": 100_000.0,
         "c_flowserve": 80_000.0, "c2_flowserve_other": 40_000.0}
CPU_S = {key: 2.0 for key in RATES}
TARGET = f"identity_over_librdkafka_batch_ge_{TARGET_OVER_E}"


def test_librdkafka_passthrough_accounting_passes_a_good_run() -> None:
    result = account(RATES, CPU_S, 100_000)
    assert result["c_over_e"] == 0.8 and result["c_over_b"] == 1.6 and result["c2_over_c"] == 0.5
    assert result["cpu_us_per_record"]["c_flowserve"] == 20.0
    assert result["targets"] == {TARGET: True}


def test_librdkafka_passthrough_accounting_fails_a_slow_identity_node() -> None:
    result = account({**RATES, "c_flowserve": 69_000.0}, CPU_S, 100_000)
    assert result["c_over_e"] == 0.69
    assert result["targets"] == {TARGET: False}
