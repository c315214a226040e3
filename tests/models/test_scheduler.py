"""The predictive scheduler: no action starts whose predicted end is past its window, requests that cannot
make their deadline are refused early (kind ``deadline``), and without jitter nothing is ever late."""

from __future__ import annotations

import pytest

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models import Action, ActionKind, Catalogue, ModelSpec, Placement, Scheduler, Step, poisson_zipf, run
from flowserve.models.scheduler import REFUSED_KIND, never_late
from flowserve.models.simulate import jitter_margin


class Recording(Scheduler):
    """The scheduler, keeping every action it starts (and the lanes' state when it did)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.started: list[Action] = []

    def step(self, now: float) -> Step:
        out = super().step(now)
        self.started.extend(out.actions)
        return out


def _spec(name: str, size: int = 100, load_ms: float = 10.0, one_ms: float = 5.0, per_ms: float = 1.0) -> ModelSpec:
    return ModelSpec(name, size, load_ms / 1000, {1: one_ms / 1000, 8: (one_ms + 7 * per_ms) / 1000})


@pytest.mark.parametrize(("models", "memory_share", "rate", "s", "cv", "seed"), [
    (50, 0.1, 300.0, 0.9, 0.0, 1), (50, 0.1, 900.0, 1.2, 0.1, 2), (200, 0.05, 600.0, 0.9, 0.05, 3),
    (20, 1.0, 2000.0, 1.2, 0.05, 4)])
def test_no_action_starts_whose_predicted_end_is_past_its_window(models: int, memory_share: float, rate: float,
                                                                 s: float, cv: float, seed: int) -> None:
    cat = Catalogue.emulated(models)
    wl = poisson_zipf(models, rate=rate, seconds=3.0, s=s, seed=seed)
    placement = Placement(2)
    placement.place(wl.shares(cat))
    policies = [Recording(cat, int(memory_share * cat.total_bytes), margin=jitter_margin(cv)) for _ in range(2)]
    out = run(wl, cat, placement, policies, slo_s=0.1, jitter_cv=cv, seed=seed)
    started = [a for p in policies for a in p.started]
    kinds = {ActionKind.BATCH, ActionKind.LOAD} if memory_share < 1 else {ActionKind.BATCH}
    assert {a.kind for a in started} >= kinds
    assert [a for a in started if not never_late(a)] == []
    # each load's window leaves a batch of one before its earliest request's deadline
    assert all(a.window <= a.start + 0.1 for a in started if a.kind is ActionKind.LOAD)
    # every request is answered or refused, never both, never neither
    assert not (out.answered() & out.refused).any()
    assert (out.answered() | out.refused).all()
    if cv == 0.0:  # predictions exact: nothing is answered late
        assert out.late().sum() == 0


def test_a_batch_is_as_large_as_its_window_allows() -> None:
    cat = Catalogue([_spec("a")])
    s = Scheduler(cat, capacity=100, max_batch=8)
    s.preload(["a"])
    for rid in range(8):  # batch of n takes 5 + (n - 1) ms; the earliest deadline leaves 8 ms
        s.submit(rid, "a", deadline=0.008 if rid == 0 else 1.0, now=0.0)
    (batch,) = s.step(0.0).actions
    assert batch.kind is ActionKind.BATCH and batch.requests == (0, 1, 2, 3)
    assert batch.window == 0.008 and batch.end == pytest.approx(0.008)


def test_what_cannot_make_its_deadline_is_refused_early() -> None:
    cat = Catalogue([_spec("a"), _spec("b")])
    s = Scheduler(cat, capacity=200)
    s.preload(["a"])
    s.submit(0, "a", deadline=0.004, now=0.0)  # a batch of one takes 5 ms: too late even now
    s.submit(1, "b", deadline=0.014, now=0.0)  # load 10 ms + batch 5 ms: 15 ms, too late
    s.submit(2, "b", deadline=0.020, now=0.0)  # fits
    out = s.step(0.0)
    assert sorted(out.refused) == [0, 1]
    assert [(a.kind, a.model) for a in out.actions] == [(ActionKind.LOAD, "b")]
    assert s.refusals == {"a": 1, "b": 1}
    assert REFUSED_KIND is ErrorKind.DEADLINE


def test_a_refusal_comes_when_the_slack_runs_out_though_nothing_happens() -> None:
    cat = Catalogue([_spec("a"), _spec("b")])
    s = Scheduler(cat, capacity=100, tau=10.0)  # room for one model
    s.preload(["a"])
    for _ in range(1000):  # "a" is hot: 100 requests a second, next one predicted in 10 ms
        s.predictor.observe("a", 0.0)
    s.submit(9, "b", deadline=0.050, now=0.0)
    out = s.step(0.0)
    # "a" is needed before "b" is: no load; "b" could still be loaded (10 ms) and run (5 ms) in time
    assert out.actions == [] and out.refused == []
    assert out.wake == pytest.approx(0.035, abs=1e-5)
    later = s.step(out.wake)  # nothing happened since, and now 15 ms are more than the 50 ms leave
    assert later.refused == [9] and later.actions == [] and later.wake == float("inf")


def test_an_unknown_model_is_an_invalid_input_naming_it() -> None:
    s = Scheduler(Catalogue([_spec("a")]), capacity=100)
    with pytest.raises(FlowserveError, match="no model 'zz'") as e:
        s.submit(0, "zz", deadline=1.0, now=0.0)
    assert e.value.kind is ErrorKind.INVALID_INPUT


def test_a_margin_below_one_is_refused() -> None:
    with pytest.raises(FlowserveError, match="margin") as e:
        Scheduler(Catalogue([_spec("a")]), capacity=100, margin=0.9)
    assert e.value.kind is ErrorKind.INVALID_SETTINGS


def test_the_copy_lane_sets_aside_a_long_load_that_would_cost_two_short_ones_their_deadlines() -> None:
    cat = Catalogue([_spec("long", load_ms=30.0), _spec("b"), _spec("c")])
    s = Scheduler(cat, capacity=300)  # room for all three: only the copy lane's time is short
    s.submit(0, "long", deadline=0.040, now=0.0)  # alone: a 30-ms load and a 5-ms batch make it
    s.submit(1, "b", deadline=0.046, now=0.0)
    s.submit(2, "c", deadline=0.050, now=0.0)
    # in deadline order "long" goes first and then "c" cannot make it: one load of 30 ms would cost two of 10
    step = s.step(0.0)
    (first,) = step.actions
    assert (first.kind, first.model) == (ActionKind.LOAD, "b")
    assert step.refused == [0]  # behind b's load, 10 + 30 + 5 ms is past its 40: refused early, never loaded
    s.finished(first, first.end)
    second = s.step(first.end)
    assert [(a.kind, a.model) for a in second.actions] == [(ActionKind.BATCH, "b"), (ActionKind.LOAD, "c")]
    assert all(never_late(a) for a in [first, *second.actions])


def test_loads_keep_deadline_order_when_the_copy_lane_makes_every_deadline() -> None:
    cat = Catalogue([_spec("long", load_ms=30.0), _spec("b"), _spec("c")])
    s = Scheduler(cat, capacity=300)
    s.submit(0, "long", deadline=0.040, now=0.0)
    s.submit(1, "b", deadline=0.080, now=0.0)
    s.submit(2, "c", deadline=0.090, now=0.0)
    assert [(a.kind, a.model) for a in s.step(0.0).actions] == [(ActionKind.LOAD, "long")]
