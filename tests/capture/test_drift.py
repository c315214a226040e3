"""Drift detector components, unit level (no broker): detection, false alarms, contexts, windows."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from components.digits import PIXEL_MAX, sample
from components.drift import CategoricalDrift, FeatureDrift, OutputDrift, digits_reference
from flowserve.component import Batch
from flowserve.errors import ComponentError

pytest.importorskip("alibi_detect")


def _batch(x: np.ndarray, **extra: np.ndarray) -> Batch:
    return Batch({"x": x, **extra}, [1] * len(x), [f"r{i}" for i in range(len(x))])


def _reports(d: FeatureDrift | CategoricalDrift | OutputDrift) -> list[dict]:
    """The detector's reports once its test thread has tested every closed window."""
    assert d.wait(60)
    return d.drain_reports()


def _digits(n: int, seed: int, shift: str | None = None, amount: float = 0.0) -> np.ndarray:
    requests, _ = sample(n, seed=seed, shift=shift, amount=amount)  # type: ignore[arg-type]
    return (np.concatenate([r["pixels"] for r in requests]) / PIXEL_MAX).astype(np.float32)


@pytest.fixture(scope="module")
def ks_digits() -> FeatureDrift:
    d = FeatureDrift.configure({"window": 100, "reference": "components.drift:digits_reference",
                                "catch_up_windows": 0, "max_pending": 0}, node="d")
    d.setup()
    return d  # type: ignore[return-value]


@pytest.mark.parametrize(("method", "amount"), [("ks", 0.5), ("mmd", 2.0)])
def test_shifted_digits_are_detected_within_three_windows(method: str, amount: float) -> None:
    d = FeatureDrift.configure({"method": method, "window": 100, "n_permutations": 50,
                                "reference": "components.drift:digits_reference"}, node="d")
    d.setup()
    d.process(_batch(_digits(300, seed=7, shift="noise", amount=amount)))
    reports = _reports(d)
    assert [r["window"] for r in reports] == [1, 2, 3]
    assert any(r["is_drift"] for r in reports), reports
    assert all(r["rows"] == 100 and r["method"] == method and r["detector"] == "d" for r in reports)


def test_unshifted_digits_rarely_alarm(ks_digits: FeatureDrift) -> None:
    # Held-out digits against training digits: Bonferroni-corrected KS stays at or below p_val.
    ks_digits.process(_batch(_digits(4000, seed=11)))  # 40 windows, drawn with replacement past 450
    reports = _reports(ks_digits)
    assert len(reports) == 40
    alarms = sum(r["is_drift"] for r in reports)
    # One-sided binomial test of "rate <= 0.05": fail only when alarms are implausibly many.
    assert stats.binomtest(alarms, len(reports), 0.05, alternative="greater").pvalue > 0.001, alarms


@pytest.mark.parametrize(("cls", "method", "make"), [
    (FeatureDrift, "ks", lambda rng, n: rng.normal(size=(n, 1)).astype(np.float32)),
    (CategoricalDrift, "chi2", lambda rng, n: rng.integers(0, 4, size=n).astype(np.int64)),
])
def test_false_alarm_rate_matches_p_value(cls: type, method: str, make) -> None:  # noqa: ANN001
    """Under no drift, the share of windows flagged is consistent with p_val (a two-sided binomial test)."""
    rng = np.random.default_rng(1234)
    windows, size = 400, 50
    port = "x"
    d = cls.configure({"method": method, "window": size, "p_val": 0.05, "reference_size": 2000,
                       "catch_up_windows": 0, "max_pending": 0}, node="d")
    d.setup()
    d.process(Batch({port: make(rng, 2000)}, [1] * 2000, ["r"] * 2000))  # the reference
    d.process(Batch({port: make(rng, windows * size)}, [1] * (windows * size), ["r"] * (windows * size)))
    reports = _reports(d)
    assert len(reports) == windows
    alarms = sum(r["is_drift"] for r in reports)
    rate = alarms / windows
    assert stats.binomtest(alarms, windows, 0.05).pvalue > 0.001, rate
    assert 0.01 < rate < 0.10, rate


def test_contexts_keep_their_own_reference_and_windows() -> None:
    d = FeatureDrift.configure({"window": 100, "reference_size": 200, "context_header": "x-client"}, node="d")
    d.setup()
    clean_ref, noisy_ref = _digits(200, seed=1), _digits(200, seed=2)
    d.contexts = [b"a"] * 200 + [b"b"] * 200
    d.process(_batch(np.concatenate([clean_ref, noisy_ref])))
    clean, shifted = _digits(300, seed=3), _digits(300, seed=4, shift="brightness", amount=4.0)
    d.contexts = [b"a"] * 300 + [b"b"] * 300
    d.process(_batch(np.concatenate([clean, shifted])))
    by_ctx: dict[str, list[bool]] = {}
    for r in _reports(d):
        by_ctx.setdefault(r["context"], []).append(r["is_drift"])
        assert r["key"] == f"d/{r['context']}"
    assert by_ctx["b"] == [True, True, True]
    assert len(by_ctx["a"]) == 3 and sum(by_ctx["a"]) <= 1
    assert d.state()["a"]["windows"] == 3


def test_output_drift_on_predicted_classes() -> None:
    rng = np.random.default_rng(5)
    d = OutputDrift.configure({"window": 200, "reference_size": 1000}, node="out")
    d.setup()
    logits = rng.normal(size=(1000, 10)).astype(np.float32)
    d.process(Batch({"logits": logits}, [1000], ["r"]))
    skewed = rng.normal(size=(400, 10)).astype(np.float32)
    skewed[:, 3] += 3.0  # the model now predicts class 3 most of the time
    d.process(Batch({"logits": skewed}, [400], ["r"]))
    reports = _reports(d)
    assert [r["is_drift"] for r in reports] == [True, True]


def test_time_windows_close_on_the_next_arrival() -> None:
    d = FeatureDrift.configure({"window_s": 0.001, "reference_size": 50}, node="d")
    d.setup()
    rng = np.random.default_rng(0)
    d.process(_batch(rng.normal(size=(50, 2)).astype(np.float32)))  # reference
    d.process(_batch(rng.normal(size=(30, 2)).astype(np.float32)))
    assert _reports(d) == []  # a time window closes only when a later record arrives
    d._states[None].window_start_ms -= 10  # the window's time has passed (no sleeping)
    d.process(_batch(rng.normal(size=(5, 2)).astype(np.float32)))
    (report,) = _reports(d)
    assert report["rows"] == 30


def test_bad_params_are_refused() -> None:
    with pytest.raises(ComponentError, match="supports method ks or mmd"):
        FeatureDrift.configure({"method": "chi2"}, node="d")
    d = FeatureDrift.configure({"reference": "/nonexistent/ref.npy"}, node="d")
    with pytest.raises(ComponentError, match="cannot load drift reference"):
        d.setup()


def test_reference_from_npy_file(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "ref.npy"
    np.save(path, digits_reference(300))
    d = FeatureDrift.configure({"window": 100, "reference": str(path)}, node="d")
    d.setup()
    d.process(_batch(_digits(100, seed=9, shift="brightness", amount=3.0)))
    (report,) = _reports(d)
    assert report["is_drift"] is True


def test_a_backlog_is_tested_on_its_most_recent_windows_only() -> None:
    rng = np.random.default_rng(2)
    d = FeatureDrift.configure({"window": 50, "reference_size": 50, "catch_up_windows": 2}, node="d")
    d.setup()
    d.process(_batch(rng.normal(size=(50, 2)).astype(np.float32)))  # reference
    d.process(_batch(rng.normal(size=(20, 2)).astype(np.float32)))  # an open window of 20 rows
    backlog = rng.normal(size=(1000, 2)).astype(np.float32)
    backlog[-130:] += 100.0  # only the most recent rows are far off: what the kept windows must hold
    d.process(_batch(backlog))
    reports = _reports(d)
    # the open window is filled up (30 rows), then the last 2 full windows; the 1000 - 30 - 100 rows skipped
    # are counted in the next report
    assert [(r["window"], r["rows"], r["rows_skipped"]) for r in reports] == [(1, 50, 870), (2, 50, 0), (3, 50, 0)]
    assert [r["is_drift"] for r in reports][1:] == [True, True]
    d.close()


def test_windows_beyond_max_pending_are_skipped_not_queued() -> None:
    import threading

    rng = np.random.default_rng(3)
    d = FeatureDrift.configure({"window": 10, "reference_size": 10, "max_pending": 1, "catch_up_windows": 0},
                               node="d")
    d.setup()
    release = threading.Event()
    test = d._test
    d._test = lambda *args: (release.wait(30), test(*args))  # type: ignore[method-assign]
    d.process(_batch(rng.normal(size=(10, 2)).astype(np.float32)))  # reference
    d.process(_batch(rng.normal(size=(30, 2)).astype(np.float32)))  # 3 windows; the thread holds the first
    release.set()
    reports = _reports(d)
    assert [r["window"] for r in reports] == [1]
    d.process(_batch(rng.normal(size=(10, 2)).astype(np.float32)))
    (report,) = _reports(d)
    assert report["rows_skipped"] == 20  # the two windows closed while the thread was busy
    d.close()
