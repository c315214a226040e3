"""The chaos bench's accounting, fed runs whose answers are known: each defect the targets must catch fails them."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from flowserve.errors import BrokerError
from flowserve.kafka.replies import Reply
from flowserve_bench.chaos import async_outcomes
from flowserve_bench.chaos_account import Callers, account, expected_row
from flowserve_bench.chaos_audit import TopicAudit

BOUNDED = {"worker model[0]": {"max_mib": 80.0, "middle_mib": 80.0, "last_mib": 80.0, "samples": 9, "bounded": True}}


def _reply(rid: str, error: str | None = None) -> Reply:
    return Reply(rid, {} if error else {"y": expected_row(rid)}, error, {}, 0)


def _clean() -> tuple[Callers, TopicAudit]:
    """Two HTTP calls and two async requests, each answered once, everywhere."""
    callers = Callers(http={"h0": "ok", "h1": "ok"}, http_sent=2,
                      async_outcomes={"a0": _reply("a0"), "a1": _reply("a1")},
                      deliveries=Counter({"h0": 1, "h1": 1, "a0": 1, "a1": 1}))
    ids = Counter({"h0": 1, "h1": 1, "a0": 1, "a1": 1})
    return callers, TopicAudit(inputs=Counter(ids), answers=Counter(ids), per_topic={})


def _account(callers: Callers, audit: TopicAudit, gateways: int = 2) -> dict[str, object]:
    return account(callers, audit, {"pre": 0, "model": 0}, BOUNDED, client_dropped=0, gateways=gateways)


def test_a_clean_run_meets_every_target() -> None:
    result = _account(*_clean())
    assert all(result["targets"].values()), result["targets"]
    assert set(result["targets"]) == {"every_input_id_answered", "lost_zero", "caller_duplicates_zero", "lag_zero",
                                      "memory_bounded", "http_refused_zero"}


def test_a_dropped_reply_fails_the_answered_targets() -> None:
    callers, audit = _clean()
    callers.async_outcomes["a1"] = None  # sent, never answered at its caller
    del audit.answers["a1"]  # nor on any reply topic
    result = _account(callers, audit)
    assert not result["targets"]["every_input_id_answered"] and not result["targets"]["lost_zero"]
    assert result["async"]["lost"] == 1 and result["lost"] == 2 and "a1" in result["lost_ids"]


def test_an_input_unanswered_on_the_topics_fails_though_no_caller_waited() -> None:
    callers, audit = _clean()
    audit.inputs["h2"] += 1  # an HTTP call whose gateway died after producing it
    result = _account(callers, audit)
    assert not result["targets"]["every_input_id_answered"]
    assert result["topics"]["unanswered_ids"] == 1


def test_a_duplicate_that_reaches_a_caller_fails_the_duplicates_target() -> None:
    callers, audit = _clean()
    callers.deliveries["a0"] += 1
    result = _account(callers, audit)
    assert not result["targets"]["caller_duplicates_zero"]
    assert result["duplicates_reaching_callers"] == 1


def test_duplicates_hidden_from_callers_are_figures_not_failures() -> None:
    callers, audit = _clean()
    audit.answers["a0"] += 2  # redelivered after a kill; the client dropped them
    result = account(callers, audit, {"pre": 0}, BOUNDED, client_dropped=2, gateways=2)
    assert result["targets"]["caller_duplicates_zero"]
    assert result["topics"]["duplicate_answers"] == 2 and result["async"]["duplicates_dropped"] == 2


def test_a_failed_http_call_is_not_answered_and_a_refused_one_fails_with_two_gateways() -> None:
    callers, audit = _clean()
    callers.http.update({"h2": "refused: ConnectionRefusedError", "h3": "cut: IncompleteReadError"})
    callers.http_sent += 3  # h4 never recorded an outcome
    result = _account(callers, audit)
    assert result["http"] == {"sent": 5, "ok": 2, "error": 0, "failed": 2, "refused": 1, "cut": 1, "timeout": 0,
                                   "unanswered": 1}
    assert not result["targets"]["every_input_id_answered"]
    assert not result["targets"]["http_refused_zero"]
    # one gateway restarting leaves the port empty: refusals are reported, not a target
    assert "http_refused_zero" not in _account(callers, audit, gateways=1)["targets"]


async def test_a_failed_send_is_counted_not_raised() -> None:
    loop = asyncio.get_running_loop()
    sent, failed, pending = loop.create_future(), loop.create_future(), loop.create_future()
    reply = _reply("a0")
    sent.set_result(reply)
    failed.set_exception(BrokerError("the produce failed"))
    futures = {"a0": sent, "a1": failed, "a2": pending}
    outcomes = async_outcomes(futures)
    assert outcomes["a0"] is reply and isinstance(outcomes["a1"], BrokerError) and outcomes["a2"] is None
    callers, audit = _clean()
    callers.async_outcomes = outcomes
    callers.async_send_errors["a2"] = "KafkaTimeoutError: flush"
    result = _account(callers, audit)
    assert result["async"] == {"sent": 3, "ok": 1, "error": 0, "send_failed": 2, "lost": 0,
                                    "duplicates_dropped": 0}


@pytest.mark.parametrize("error", [None, "deadline exceeded"])
def test_a_wrong_value_fails_lost_zero_and_an_error_result_is_counted(error: str | None) -> None:
    callers, audit = _clean()
    if error:
        callers.async_outcomes["a1"] = _reply("a1", error)
    else:
        callers.async_outcomes["a1"] = Reply("a1", {"y": np.zeros((1, 4), np.float32) + 7}, None, {}, 0)
    result = _account(callers, audit)
    assert result["targets"]["lost_zero"] == bool(error)
    assert result["async"]["error"] == int(bool(error)) and result["wrong_values"] == int(not error)
