"""Drift detector components, unit level (no broker): detection, false alarms, contexts, windows."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from flowserve.component import Batch
from flowserve.errors import ComponentError
from flowserve_components.digits import PIXEL_MAX, sample
from flowserve_components.drift import CategoricalDrift, FeatureDrift, OutputDrift, digits_reference

pytest.importorskip("alibi_detect")


def _batch(x: np.ndarray, contexts: list[bytes] | None = None, **extra: np.ndarray) -> Batch:
    headers = [{"x-client": c} for c in contexts] if contexts is not None else ()
    return Batch({"x": x, **extra}, [1] * len(x), [f"r{i}" for i in range(len(x))], headers)


def _reports(d: FeatureDrift | CategoricalDrift | OutputDrift) -> list[dict]:
    """The detector's reports once its test thread has tested every closed window."""
    assert d.wait(60)
    return d.drain_reports()


def _digits(n: int, seed: int, shift: str | None = None, amount: float = 0.0) -> np.ndarray:
    requests, _ = sample(n, seed=seed, shift=shift, amount=amount)  # type: ignore[arg-type]
    return (np.concatenate([r["pixels"] for r in requests]) / PIXEL_MAX).astype(np.float32)


@pytest.fixture(scope="module")
def ks_digits() -> FeatureDrift:
    d = FeatureDrift.configure({"window": 100, "reference": "flowserve_components.drift:digits_reference",
                                "catch_up_windows": 0, "max_pending": 0}, node="d")
    d.setup()
    return d  # type: ignore[return-value]


@pytest.mark.parametrize(("method", "amount"), [("ks", 0.5), ("mmd", 2.0)])
def test_shifted_digits_are_detected_within_three_windows(method: str, amount: float) -> None:
    d = FeatureDrift.configure({"method": method, "window": 100, "n_permutations": 50,
                                "reference": "flowserve_components.drift:digits_reference"}, node="d")
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
    d.process(_batch(np.concatenate([clean_ref, noisy_ref]), [b"a"] * 200 + [b"b"] * 200))
    clean, shifted = _digits(300, seed=3), _digits(300, seed=4, shift="brightness", amount=4.0)
    d.process(_batch(np.concatenate([clean, shifted]), [b"a"] * 300 + [b"b"] * 300))
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


@pytest.mark.parametrize(("n_ref", "n", "tied"), [(1000, 100, True), (300, 100, False), (50, 120, False),
                                                  (200, 37, True)])
def test_ks_feature_scores_equal_scipy_per_feature(n_ref: int, n: int, tied: bool) -> None:
    from flowserve_components.drift_ks import ks_feature_scores

    rng = np.random.default_rng(n_ref + n)
    if tied:  # pixel-like: few distinct values, many ties within and across the samples
        x_ref = rng.integers(0, 17, (n_ref, 8)).astype(np.float32) / 16
        x = rng.integers(0, 17, (n, 8)).astype(np.float32) / 16
    else:
        x_ref = rng.normal(size=(n_ref, 8)).astype(np.float32)
        x = rng.normal(0.2, 1.1, size=(n, 8)).astype(np.float32)
    p_val, dist = ks_feature_scores(x_ref, x)
    for f in range(x.shape[1]):
        expected = stats.ks_2samp(x_ref[:, f], x[:, f], method="asymp")
        assert dist[f] == np.float32(expected.statistic)
        assert p_val[f] == pytest.approx(expected.pvalue, rel=1e-5, abs=1e-12)


def test_the_ks_detector_decides_as_alibi_detects_own() -> None:
    import alibi_detect.cd as cd

    from flowserve_components.drift_ks import ks_detector

    ref = digits_reference().astype(np.float32)
    ours, theirs = ks_detector(cd)(ref, p_val=0.05), cd.KSDrift(ref, p_val=0.05)
    for shift, amount in ((None, 0.0), ("noise", 0.3), ("brightness", 2.0)):
        window = _digits(100, seed=5, shift=shift, amount=amount)
        a, b = ours.predict(window)["data"], theirs.predict(window)["data"]
        assert a["is_drift"] == b["is_drift"]
        np.testing.assert_allclose(a["p_val"], b["p_val"], rtol=1e-5, atol=1e-12)
        np.testing.assert_array_equal(a["distance"], b["distance"])


def test_window_tests_rest_to_keep_to_their_cpu_share(monkeypatch: pytest.MonkeyPatch) -> None:
    import flowserve_components.drift as drift

    clock = {"cpu": 0.0, "now": 100.0}
    slept: list[float] = []

    class FakeTime:
        @staticmethod
        def thread_time() -> float:
            return clock["cpu"]

        @staticmethod
        def monotonic() -> float:
            return clock["now"]

        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append(seconds)
            clock["now"] += seconds

    def a_test(*_: object) -> None:  # a window test that takes 40 ms of CPU
        clock["cpu"] += 0.04
        clock["now"] += 0.04

    monkeypatch.setattr(drift, "time", FakeTime)
    d = FeatureDrift.configure({"cpu_share": 0.2}, node="d")
    d._test = a_test  # type: ignore[method-assign]
    d._pending = 3
    d._tested()
    d._tested()
    assert slept == [pytest.approx(0.16)]  # 40 ms of test, then 160 ms of rest: 20% of a CPU
    clock["now"] += 1.0  # windows far apart: no rest needed
    d._tested()
    assert len(slept) == 1
