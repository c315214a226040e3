"""The real-model run's accounting: an answer counts as equal only when it is its own variant's output and
says so; one from another variant (by its header or by its logits) fails the target, as does a lost one."""

from __future__ import annotations

import numpy as np

from flowserve_bench.models_real import TARGET, Answer, account, closest

A = np.array([[1.0, 2.0, 3.0]], np.float32)
B = np.array([[1.5, 2.0, 2.0]], np.float32)
EVERY = {"a": A, "b": B}


def _account(*answers: Answer) -> dict:
    own = [EVERY[a.model] for a in answers]
    return account(answers, own, [EVERY] * len(answers))


def test_answers_equal_to_their_own_variant_meet_the_target() -> None:
    out = _account(Answer("a", A + np.float32(1e-6), "a"), Answer("b", B, "b"),
                   Answer("a", None, error="deadline"))
    assert out["counts"] == {"sent": 3, "answered": 2, "equal": 2, "wrong_variant": 0, "mismatched": 0,
                             "refused": 1, "failed": 0, "lost": 0}
    assert out["targets"] == {TARGET: True}
    assert 0 < out["max_abs_diff_equal"] < 1e-5


def test_a_wrong_variant_fails_the_target() -> None:
    by_logits = _account(Answer("a", A, "a"), Answer("a", B, "a"))  # b's output, though it says a
    assert by_logits["counts"]["wrong_variant"] == 1 and by_logits["counts"]["equal"] == 1
    assert by_logits["targets"] == {TARGET: False}
    by_header = _account(Answer("b", B, "a"))  # the right numbers, served by another model
    assert by_header["counts"]["wrong_variant"] == 1 and by_header["targets"] == {TARGET: False}


def test_nobodys_output_a_lost_request_or_no_answer_at_all_fail_the_target() -> None:
    nobody = _account(Answer("a", A + np.float32(0.5), "a"))
    assert nobody["counts"]["mismatched"] == 1 and nobody["targets"] == {TARGET: False}
    lost = _account(Answer("a", A, "a"), Answer("b", None, lost=True))
    assert lost["counts"]["lost"] == 1 and lost["targets"] == {TARGET: False}
    failed = _account(Answer("a", A, "a"), Answer("b", None, error="component_failure"))
    assert failed["counts"]["failed"] == 1 and failed["targets"] == {TARGET: False}
    assert _account(Answer("a", None, error="deadline"))["targets"] == {TARGET: False}  # nothing answered


def test_closest_is_the_nearest_two_variants_come_on_any_request() -> None:
    logits = np.stack([np.vstack([A, A]), np.vstack([B, A + 0.25]), np.vstack([B + 4, B + 4])])
    assert closest(logits) == 0.25
