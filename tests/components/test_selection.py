"""Exp3 and Exp4 selection: updates against hand-computed weights, per-context isolation, routing masks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from flowserve.component import Batch
from flowserve.errors import ComponentError
from flowserve.selection import Joined
from flowserve_components.selection import Exp3Selector, Exp4Ensemble, probabilities

ANSWERS = ["a.label", "b.label", "c.label"]


def exp3(configure: Callable[..., Any], **params: Any) -> Exp3Selector:
    return configure(Exp3Selector, {"answers": ANSWERS, "gamma": 0.3, "eta": 0.1, "seed": 1, **params})


def joined(arm: int, p: float, answer: int, truth: int, context: str | None = None) -> Joined:
    return Joined(f"r{arm}", context, {"id": f"r{arm}", "arm": arm, "p": p, "answer": ANSWERS[arm]},
                  {"label": np.array([answer])}, {"label": np.array([truth])})


def test_exp3_starts_uniform_and_a_wrong_answer_lowers_its_arm_by_eta_over_p(configure: Callable[..., Any]) -> None:
    sel = exp3(configure)
    np.testing.assert_allclose(sel.probabilities(), [1 / 3, 1 / 3, 1 / 3])
    # arm 1 drawn with p = 0.25 answered wrong (reward 0, loss 1): log w1 -= 0.1 * 1 / 0.25 = 0.4, so
    # w = [1, e^-0.4, 1] and p_i = 0.7 * w_i / sum(w) + 0.3 / 3
    assert sel.learn([joined(1, 0.25, answer=2, truth=7)]) == {""}
    np.testing.assert_allclose(sel.probabilities(), [0.362141, 0.275718, 0.362141], atol=1e-6)
    # a right answer is loss 0: no change
    sel.learn([joined(0, 0.3, answer=7, truth=7)])
    np.testing.assert_allclose(sel.probabilities(), [0.362141, 0.275718, 0.362141], atol=1e-6)
    # a second wrong answer, arm 2 with p = 0.5: log w = [0, -0.4, -0.2]
    sel.learn([joined(2, 0.5, answer=1, truth=7)])
    w = np.exp([0.0, -0.4, -0.2])
    np.testing.assert_allclose(sel.probabilities(), 0.7 * w / w.sum() + 0.1, atol=1e-12)
    assert sel.rewards == 3


def test_exp3_skips_feedback_without_the_branch_answer(configure: Callable[..., Any]) -> None:
    sel = exp3(configure)
    missing = Joined("r", None, {"id": "r", "arm": 0, "p": 0.5, "answer": "a.label"}, {}, {"label": np.array([1])})
    assert sel.learn([missing]) == set()
    assert sel.unjoined == 1


def test_exp3_contexts_learn_apart(configure: Callable[..., Any]) -> None:
    sel = exp3(configure, context_header="X-User")
    sel.learn([joined(2, 0.2, answer=1, truth=5, context="ann")])
    assert sel.probabilities("ann")[2] < sel.probabilities("ann")[0]
    np.testing.assert_allclose(sel.probabilities("bob"), [1 / 3] * 3)
    np.testing.assert_allclose(sel.probabilities(None), [1 / 3] * 3)


def test_exp3_routes_each_request_whole_to_one_arm_and_records_it(configure: Callable[..., Any]) -> None:
    sel = exp3(configure, context_header="X-User")
    sel.weights.add("ann", 1, 50.0)  # ann's traffic goes (almost: gamma) to arm 1
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    batch = Batch({"x": x}, [2, 3], ["r0", "r1"], [{"x-user": b"ann"}, {"x-user": b"ann"}])
    result = sel.process(batch)
    decisions = sel.drain_decisions()
    assert [d["id"] for d in decisions] == ["r0", "r1"]
    for d, rows in zip(decisions, (slice(0, 2), slice(2, 5)), strict=True):
        assert d["context"] == "ann" and d["answer"] == ANSWERS[d["arm"]]
        assert result.mask[f"arm{d['arm']}"][rows].all()
        assert d["p"] == pytest.approx(sel.probabilities("ann")[d["arm"]])
    assert sum(m.astype(int) for m in result.mask.values()).tolist() == [1] * 5  # each row on exactly one arm
    assert sel.drain_decisions() == []


def test_exp3_draws_follow_the_probabilities(configure: Callable[..., Any]) -> None:
    sel = exp3(configure)
    sel.weights.add("", 0, np.log(8.0))  # w = [8, 1, 1]: p = 0.7 * [0.8, 0.1, 0.1] + 0.1
    arms, p = sel.choose([""] * 20_000)
    shares = np.bincount(arms, minlength=3) / len(arms)
    np.testing.assert_allclose(shares, [0.66, 0.17, 0.17], atol=0.02)
    np.testing.assert_allclose(p[arms == 0], 0.66)


def test_exp3_state_round_trips_and_ignores_a_different_arm_count(configure: Callable[..., Any]) -> None:
    sel = exp3(configure)
    sel.learn([joined(0, 0.25, answer=1, truth=2, context="t")])
    fresh = exp3(configure)
    fresh.restore_learned("t", sel.learned_state("t"))
    np.testing.assert_allclose(fresh.probabilities("t"), sel.probabilities("t"))
    fresh.restore_learned("u", {"log_weights": [0.0, 1.0]})
    np.testing.assert_allclose(fresh.probabilities("u"), [1 / 3] * 3)


def test_exp3_declares_one_port_per_answer_and_checks_them(configure: Callable[..., Any]) -> None:
    assert list(exp3(configure).outputs) == ["arm0", "arm1", "arm2"]
    with pytest.raises(ComponentError, match="node.port"):
        Exp3Selector.configure({"answers": ["a", "b.label"]})


def test_exp4_weights_members_by_their_probability_on_the_truth(configure: Callable[..., Any]) -> None:
    ens = configure(Exp4Ensemble, {"gamma": 0.1, "eta": 1.0})
    p0, p1, p2 = (np.array([[0.9, 0.1]], np.float32), np.array([[0.5, 0.5]], np.float32),
                  np.array([[0.2, 0.8]], np.float32))
    out = ens.process(Batch({"p0": p0, "p1": p1, "p2": p2}, [1], ["q"]))
    np.testing.assert_allclose(out["probs"], [[(0.9 + 0.5 + 0.2) / 3, (0.1 + 0.5 + 0.8) / 3]], rtol=1e-6)
    (decision,) = ens.drain_decisions()
    # truth 0: gains [0.9, 0.5, 0.2]; log w = gains - 0.9 = [0, -0.4, -0.7]; weights 0.9 * w / sum(w) + 0.1 / 3
    assert ens.learn([Joined("q", None, decision, {}, {"label": np.array([0])})]) == {""}
    np.testing.assert_allclose(ens.member_weights(), [0.448672, 0.311743, 0.239585], atol=1e-6)
    out = ens.process(Batch({"p0": p0, "p1": p1, "p2": p2}, [1], ["q2"]))
    w = ens.member_weights()
    np.testing.assert_allclose(out["probs"][0], w[0] * p0[0] + w[1] * p1[0] + w[2] * p2[0], rtol=1e-6)
    assert out["label"].tolist() == [0]


def test_exp4_contexts_learn_apart_and_bad_feedback_is_skipped(configure: Callable[..., Any]) -> None:
    ens = configure(Exp4Ensemble, {"context_header": "X-Tenant", "eta": 1.0})
    decision = {"id": "q", "context": "t1", "answer": None, "advice": [[[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]]}
    ens.learn([Joined("q", "t1", decision, {}, {"label": np.array([0])})])
    assert ens.member_weights("t1")[0] > ens.member_weights("t1")[1]
    np.testing.assert_allclose(ens.member_weights("t2"), [1 / 3] * 3)
    assert ens.learn([Joined("q", "t1", decision, {}, {"label": np.array([5])})]) == set()
    assert ens.unjoined == 1


def test_probabilities_mix_in_exploration() -> None:
    np.testing.assert_allclose(probabilities(np.log(np.array([[3.0, 1.0], [1.0, 1.0]])), 0.5),
                               [[0.625, 0.375], [0.5, 0.5]])
