"""Drift detectors (alibi-detect) as components: a side branch on any port, off the critical path.

A detector is an ordinary node that reads a port's topic in its own consumer group and emits no
request outputs; each closed window's result goes, as JSON, to ``<prefix>.<topology>.drift`` (through
the worker's Outbox, so it is acknowledged before the detector commits). ``flowserve drift TOPOLOGY``
shows the latest state per detector and context::

    drift:
      component: flowserve_components.drift:FeatureDrift
      params: {method: ks, window: 100, p_val: 0.05, reference: flowserve_components.drift:digits_reference}
      inputs: {x: pre.x}

- :class:`FeatureDrift`: continuous features, FP32 ``[-1, d]``; ``ks`` (per-feature Kolmogorov-Smirnov
  with a Bonferroni or FDR correction) or ``mmd`` (maximum mean discrepancy, permutation test, pytorch).
- :class:`CategoricalDrift`: labels, INT64 ``[-1]``; chi-squared.
- :class:`OutputDrift`: a model's output distribution from its logits, FP32 ``[-1, k]``; chi-squared over
  the predicted class (``method: chi2``, default) or KS over the softmax probabilities (``method: ks``).

Windows close by count (``window`` rows) or by time (``window_s``; the first arrival after the window's
time closes it). Reference data: a ``.npy`` file or ``module:function``, else the first
``reference_size`` rows seen (per context). ``context_header`` (e.g. ``x-client``) keeps one reference and
window per value of that request header. alibi-detect is imported in ``setup`` (it takes seconds).

A detector never delays the critical path: ``process`` only files rows into windows; each closed
window is tested on the detector's own thread (one, so windows are tested in order; torch limited to
``threads``), and its result is written with a later batch. A backlog is bounded: a batch holding more
than ``catch_up_windows`` full windows is tested on its most recent ones only, and at most
``max_pending`` windows wait for the test thread; what is skipped is counted (``rows_skipped`` in the
next report). The tests use at most ``cpu_share`` of one CPU on average (the thread rests between
them). Its worker process also runs at a lower OS priority (``flowserve.capture.stage.worker_process``).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port, torch_threads
from flowserve.errors import ComponentError
from flowserve_components.drift_ks import ks_detector

log = logging.getLogger("flowserve.drift")
_WINDOW = "_window_token"


class DriftParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ks", "mmd", "chi2"] = Field("ks", description="statistical test")
    p_val: float = Field(0.05, gt=0.0, lt=1.0, description="significance level of one window's test")
    window: int = Field(100, ge=2, le=1_000_000, description="rows per window (count windows)")
    window_s: float | None = Field(None, gt=0, description="close windows by time instead (seconds)")
    reference: str | None = Field(None, description="a .npy file or 'module:function' returning the reference")
    reference_size: int = Field(500, ge=2, description="without 'reference': the first N rows seen")
    context_header: str | None = Field(None, description="request header whose values get their own state")
    correction: Literal["bonferroni", "fdr"] = "bonferroni"
    n_permutations: int = Field(100, ge=10, le=10_000, description="mmd: permutations of the test")
    categories: int | None = Field(None, ge=2, description="chi2: number of categories (default: from data)")
    seed: int = 0
    catch_up_windows: int = Field(
        4, ge=0, description="a batch holding more full windows than this (a backlog: the detector started late or "
        "fell behind) is tested on its most recent ones only; the older rows are skipped and counted (0: test all)")
    max_pending: int = Field(
        8, ge=0, description="windows waiting for the test thread at most; a window closed beyond that is skipped "
        "and counted (0: test every window in process, on the calling thread)")
    threads: int = Field(1, ge=1, le=64, description="mmd: torch threads of the test")
    cpu_share: float = Field(
        0.25, gt=0, le=1, description="the window tests use at most this share of one CPU on average: after a "
        "test that took t seconds of CPU, the test thread rests t * (1 / cpu_share - 1) before the next one "
        "(windows closed meanwhile wait, up to max_pending)")


class CategoricalParams(DriftParams):
    method: Literal["ks", "mmd", "chi2"] = Field("chi2", description="statistical test")


@dataclass
class _State:
    """Reference, detector and open window of one context."""

    reference: list[np.ndarray] = field(default_factory=list)
    reference_rows: int = 0
    detector: Any = None
    window: list[np.ndarray] = field(default_factory=list)
    window_rows: int = 0
    window_start_ms: int = 0
    windows: int = 0
    drifts: int = 0
    skipped: int = 0  # rows not tested (backlog bounds), reported with the next window
    #: (sequence number, request id) of the first request with rows in the open window (or in a reference
    #: still being collected): the worker commits no input past it (see ``oldest_held``)
    held: tuple[int, str] | None = None


class _Detector(Component):
    """The shared machinery: per-context state, windows, alibi-detect detectors, reports."""

    Params: ClassVar[type[BaseModel]] = DriftParams
    max_batch: ClassVar[int] = 4096
    keeps_state: ClassVar[bool] = True
    offload: ClassVar[bool] = False  # process() only files rows; the tests run on the detector's own thread
    side_output: ClassVar[str] = "drift"
    methods: ClassVar[tuple[str, ...]] = ("ks", "mmd", "chi2")
    params: DriftParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        if self.params.method not in self.methods:
            raise ComponentError(f"{type(self).__name__} supports method {' or '.join(self.methods)}, "
                                 f"not '{self.params.method}'")
        if self.params.window_s is not None and self.params.window < 2:
            raise ComponentError("window must be >= 2")
        self.context_header = self.params.context_header
        self._states: dict[str | None, _State] = {}
        self._reports: deque[dict[str, Any]] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._pending = 0
        self._rest_until = 0.0  # monotonic time before which the test thread does not start a test
        self._idle = threading.Condition()
        self._cd: Any = None
        self._file_reference: np.ndarray | None = None
        # Restart safety: every request processed gets a sequence number; closed windows awaiting their
        # report hold their first request until the report is drained (written before the commit).
        self._seq = 0
        self._batch_rids: list[str] = []
        self._batch_base = 0
        self._windows_closed = 0
        self._awaiting: dict[int, tuple[int, str]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def setup(self) -> None:
        try:
            self._cd = importlib.import_module("alibi_detect.cd")
        except ImportError as exc:
            raise ComponentError(f"node '{self.node}': drift detectors need alibi-detect "
                                 f"(pip install 'flowserve-components[drift]'): {exc}") from None
        if self.params.reference is not None:
            self._file_reference = self.transform(load_reference(self.params.reference))
        if self.params.method == "mmd":
            import torch

            torch.set_num_threads(self.params.threads)
        if self.params.max_pending:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"drift-{self.node}")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every closed window has been tested (tests, shutdown); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for ctx, s in self._states.items():
            log.info("drift %s context %s: %d windows, %d with drift", self.node, ctx, s.windows, s.drifts)

    # -- what subclasses define ------------------------------------------------------------------

    def rows(self, batch: Batch) -> np.ndarray:
        raise NotImplementedError

    def transform(self, data: np.ndarray) -> np.ndarray:
        """Reference data in the detector's feature space (subclasses map logits to classes etc.)."""
        return np.asarray(data)

    # -- processing ------------------------------------------------------------------------------

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        data = self.rows(batch)
        now = int(time.time() * 1000)
        self._batch_rids, self._batch_base = batch.request_ids, self._seq
        seqs = np.repeat(np.arange(self._seq, self._seq + len(batch.sizes)), batch.sizes)
        self._seq += len(batch.sizes)
        if self.context_header is None:
            self._add(None, data, seqs, now)
        else:
            starts = batch.starts()
            by_ctx: dict[str | None, list[int]] = {}
            for i, raw in enumerate(batch.header(self.context_header)):
                ctx = raw.decode("utf-8", "replace") if raw is not None else None
                by_ctx.setdefault(ctx, []).append(i)
            for ctx, requests in by_ctx.items():
                picked = np.concatenate([np.arange(starts[i], starts[i] + batch.sizes[i]) for i in requests])
                self._add(ctx, data[picked], seqs[picked], now)
        return {}

    def _first(self, seqs: np.ndarray) -> tuple[int, str]:
        seq = int(seqs[0])
        return seq, self._batch_rids[seq - self._batch_base]

    def _add(self, ctx: str | None, rows: np.ndarray, seqs: np.ndarray, now: int) -> None:
        s = self._states.get(ctx)
        if s is None:
            s = self._states[ctx] = _State(window_start_ms=now)
        if s.detector is None:
            if self._file_reference is not None:
                s.detector = self._build(self._file_reference)
            else:  # collect the reference from the first rows seen
                need = self.params.reference_size - s.reference_rows
                if s.held is None and len(rows):
                    s.held = self._first(seqs)
                s.reference.append(rows[:need])
                s.reference_rows += len(rows[:need])
                rows, seqs = rows[need:], seqs[need:]
                if s.reference_rows < self.params.reference_size:
                    return
                s.detector = self._build(np.concatenate(s.reference))
                s.reference, s.held = [], None
                s.window_start_ms = now
        window, bound = self.params.window, self.params.catch_up_windows
        if self.params.window_s is None and bound and len(rows) > (bound + 1) * window:
            # a backlog: keep the open window's fill-up and the last `bound` full windows
            fill = (window - s.window_rows) % window
            keep = fill + bound * window
            s.skipped += len(rows) - keep
            if fill:
                rows = np.concatenate([rows[:fill], rows[len(rows) - bound * window:]])
                seqs = np.concatenate([seqs[:fill], seqs[len(seqs) - bound * window:]])
            else:
                rows, seqs = rows[-keep:], seqs[-keep:]
        while len(rows):
            if self.params.window_s is None:
                take = self.params.window - s.window_rows
                if s.held is None:
                    s.held = self._first(seqs)
                s.window.append(rows[:take])
                s.window_rows += len(rows[:take])
                rows, seqs = rows[take:], seqs[take:]
                if s.window_rows >= self.params.window:
                    self._close(ctx, s, now)
            else:
                if s.window_rows >= 2 and now - s.window_start_ms >= self.params.window_s * 1000:
                    self._close(ctx, s, now)  # the arrival after the window's end closes it
                if s.held is None:
                    s.held = self._first(seqs)
                s.window.append(rows)
                s.window_rows += len(rows)
                rows, seqs = rows[:0], seqs[:0]

    def _build(self, reference: np.ndarray) -> Any:
        if self._cd is None:
            raise ComponentError(f"node '{self.node}': {type(self).__name__}.process called before setup()")
        p = self.params
        if p.method == "ks":
            return ks_detector(self._cd)(_2d(reference).astype(np.float32), p_val=p.p_val, correction=p.correction)
        if p.method == "mmd":
            import torch

            torch.manual_seed(p.seed)
            return self._cd.MMDDrift(_2d(reference).astype(np.float32), backend="pytorch", p_val=p.p_val,
                                     n_permutations=p.n_permutations, device="cpu")
        ref = _2d(reference).astype(np.int64)
        k = p.categories or getattr(self, "classes", None) or int(ref.max()) + 1
        return self._cd.ChiSquareDrift(ref, p_val=p.p_val, correction=p.correction,
                                       categories_per_feature={i: k for i in range(ref.shape[1])})

    def _close(self, ctx: str | None, s: _State, now: int) -> None:
        window, start_ms, skipped = np.concatenate(s.window), s.window_start_ms, s.skipped
        s.window, s.window_rows, s.window_start_ms, s.skipped = [], 0, now, 0
        held, s.held = s.held, None
        token = self._windows_closed = self._windows_closed + 1
        if self._pool is None:
            if held is not None:
                self._awaiting[token] = held
            self._test(ctx, s, window, start_ms, now, skipped, token)
            return
        with self._idle:
            if self._pending >= self.params.max_pending:  # the test thread is behind: skip this window
                s.skipped += skipped + len(window)
                return
            self._pending += 1
            if held is not None:
                self._awaiting[token] = held
        self._pool.submit(self._tested, ctx, s, window, start_ms, now, skipped, token)

    def oldest_held(self) -> str | None:
        """The first request of the oldest open window (or reference being collected) or of the oldest
        closed window whose report has not been drained yet: a restarted worker re-reads from there and
        the next report covers the whole window, as if the worker had not stopped."""
        with self._idle:
            held = [s.held for s in self._states.values() if s.held is not None] + list(self._awaiting.values())
        return min(held)[1] if held else None

    def _tested(self, *args: Any) -> None:
        # The worker process already runs at idle priority, but a CPU busy with a test still slows the
        # critical path on the other cores (shared caches, memory bandwidth, the host's view of the VM):
        # on 2 cores at 300 req/s, alibi's own KS test (~40 ms a window, unpaced) raised p99 by 13%.
        rest = self._rest_until - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        started = time.thread_time()
        try:
            self._test(*args)
        except Exception:  # noqa: BLE001 - a failed test must not stop the detector
            log.exception("drift %s: window test failed", self.node)
            with self._idle:  # no report will come: its rows need not be read again
                self._awaiting.pop(args[-1], None)
        finally:
            spent = time.thread_time() - started
            self._rest_until = time.monotonic() + spent * (1 / self.params.cpu_share - 1)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def _test(self, ctx: str | None, s: _State, window: np.ndarray, start_ms: int, now: int, skipped: int,
              token: int = 0) -> None:
        p = self.params
        if p.method == "mmd":
            import torch

            torch_threads(p.threads)  # in this (the detector's pool) thread: setup() ran in another
            torch.manual_seed(p.seed + s.windows)
            window = _2d(window).astype(np.float32)
        elif p.method == "chi2":
            window = _2d(window).astype(np.int64)
        else:
            window = _2d(window).astype(np.float32)
        result = s.detector.predict(window)["data"]
        pvals = np.atleast_1d(np.asarray(result["p_val"], dtype=np.float64))
        distance = np.atleast_1d(np.asarray(result["distance"], dtype=np.float64))
        threshold = float(np.asarray(result["threshold"]).reshape(-1)[0])
        is_drift = bool(result["is_drift"])
        s.windows += 1
        s.drifts += int(is_drift)
        self._reports.append({
            "key": f"{self.node}/{ctx if ctx is not None else '-'}", "detector": self.node,
            "component": type(self).__name__, "method": p.method, "context": ctx,
            "window": s.windows, "rows": int(len(window)), "is_drift": is_drift,
            "p_val": float(np.nanmin(pvals)) if pvals.size else None, "threshold": threshold,
            "distance": float(np.nanmax(distance)) if distance.size else None,
            "features_drifted": int((pvals < threshold).sum()) if pvals.size > 1 else int(is_drift),
            "window_start_ms": start_ms, "window_end_ms": now, "rows_skipped": skipped,
            "windows_total": s.windows, "drift_windows_total": s.drifts,
            _WINDOW: token,  # which held window this report releases (taken out by drain_reports)
        })

    def drain_reports(self) -> list[dict[str, Any]]:
        """The results of windows closed since the last call (the worker writes them to the drift topic)."""
        out = []
        while self._reports:
            report = self._reports.popleft()
            with self._idle:
                self._awaiting.pop(report.pop(_WINDOW), None)
            out.append(report)
        return out

    def state(self) -> dict[str | None, dict[str, int]]:
        """Per context: windows closed and windows with drift (the detector's metrics)."""
        return {ctx: {"windows": s.windows, "drift_windows": s.drifts, "reference_rows": s.reference_rows}
                for ctx, s in self._states.items()}


def _2d(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(len(a), -1)


def load_reference(ref: str) -> np.ndarray:
    """Reference data from a ``.npy`` file (no pickle) or a ``module:function`` returning an array."""
    if ref.endswith(".npy"):
        try:
            return np.load(Path(ref).expanduser(), allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ComponentError(f"cannot load drift reference '{ref}': {exc}") from None
    module_name, sep, attr = ref.partition(":")
    if not sep:
        raise ComponentError(f"drift reference '{ref}' must be a .npy file or 'module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ComponentError(f"cannot load drift reference '{ref}': {exc}") from None
    return np.asarray(fn())


class FeatureDrift(_Detector):
    """Drift of continuous features (e.g. a model's input): ``ks`` per feature, or ``mmd`` (pytorch)."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, -1])}
    outputs: ClassVar[dict[str, Port]] = {}
    methods = ("ks", "mmd")

    def rows(self, batch: Batch) -> np.ndarray:
        return _2d(batch["x"])


class CategoricalDrift(_Detector):
    """Drift of a categorical value (e.g. predicted labels), chi-squared."""

    inputs: ClassVar[dict[str, Port]] = {"x": Port("INT64", [-1])}
    outputs: ClassVar[dict[str, Port]] = {}
    Params: ClassVar[type[BaseModel]] = CategoricalParams
    methods = ("chi2",)

    def rows(self, batch: Batch) -> np.ndarray:
        return batch["x"].reshape(-1, 1)


class OutputDrift(_Detector):
    """Drift of a model's output distribution from its logits: chi2 on the predicted class, or ks on probs."""

    inputs: ClassVar[dict[str, Port]] = {"logits": Port("FP32", [-1, -1])}
    outputs: ClassVar[dict[str, Port]] = {}
    Params: ClassVar[type[BaseModel]] = CategoricalParams
    methods = ("chi2", "ks")

    def rows(self, batch: Batch) -> np.ndarray:
        return self.transform(batch["logits"])

    def transform(self, data: np.ndarray) -> np.ndarray:
        logits = _2d(data).astype(np.float64)
        self.classes = logits.shape[1]
        if self.params.method == "chi2":
            return logits.argmax(axis=1).reshape(-1, 1)
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)


def digits_reference(n: int = 1000) -> np.ndarray:
    """Normalised training pixels of the digits split (the model input's reference distribution)."""
    from flowserve_components.digits import PIXEL_MAX, load_split

    x, _ = load_split("train")
    return (x[:n] / np.float32(PIXEL_MAX)).astype(np.float32)
