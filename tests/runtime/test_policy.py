"""Batch policies: how many queued records a stage takes at once."""

from __future__ import annotations

import pytest

from flowserve.runtime.batching import BatchPolicy, FixedPolicy, LagPolicy


@pytest.mark.parametrize(("lag", "size"), [(1, 1), (2, 2), (7, 7), (1024, 1024)])
def test_lag_policy_takes_what_is_queued(lag: int, size: int) -> None:
    assert LagPolicy().next_size(lag) == size


def test_lag_policy_is_batch_one_under_light_load() -> None:
    policy = LagPolicy(max_batch=64)
    assert [policy.next_size(1) for _ in range(3)] == [1, 1, 1]


@pytest.mark.parametrize("lag", [65, 1000, 10**9])
def test_lag_policy_is_capped_at_max_batch_under_backlog(lag: int) -> None:
    assert LagPolicy(max_batch=64).next_size(lag) == 64


@pytest.mark.parametrize("lag", [0, -5])
def test_lag_policy_with_nothing_known_queued_allows_a_full_batch(lag: int) -> None:
    # no lag reported (e.g. before the first fetch): take whatever arrives, up to the cap
    assert LagPolicy(max_batch=16).next_size(lag) == 16


def test_lag_policy_ignores_feedback() -> None:
    policy = LagPolicy(max_batch=8)
    policy.observe(8, 12.5)
    assert policy.next_size(100) == 8 and policy.next_size(3) == 3


@pytest.mark.parametrize("lag", [0, 1, 5, 10_000])
def test_fixed_policy_ignores_lag(lag: int) -> None:
    policy = FixedPolicy(size=32)
    policy.observe(32, 0.1)
    assert policy.next_size(lag) == 32


def test_policies_satisfy_the_protocol() -> None:
    policies: list[BatchPolicy] = [LagPolicy(), FixedPolicy(4)]
    assert [p.next_size(2) for p in policies] == [2, 4]
