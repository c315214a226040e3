"""Online model selection that learns from feedback: Exp3 picks one branch per request, Exp4 weights an
ensemble's members (Clipper's selection layer), per context when a request header names one.

Both declare ``Component.learns`` and implement ``flowserve.selection.LearnsFromFeedback``: the selection
feature writes their decisions to ``<base>.<node>.decisions``, joins feedback to them by request id, calls
:meth:`learn`, and keeps the weights per context in the compacted ``<base>.<node>.state``, so a restarted
or added worker resumes them.

Weights are kept as log-weights per context. With ``K`` arms, exploration rate ``gamma`` and learning rate
``eta``, the probability of arm ``i`` is ``(1 - gamma) * w_i / sum(w) + gamma / K``. Exp3 (Auer et al.)
observes only the chosen arm's reward ``x`` (1 when the branch's answer matched the feedback, else 0) and
updates it importance-weighted, in the loss form: ``log w_i -= eta * (1 - x) / p_i``. In expectation it
moves the arms apart exactly as the reward form ``log w_i += eta * x / p_i`` does (the two differ by
``eta / p_i`` per draw, ``eta`` per round on every arm), but models that are mostly right rarely
lose, so its estimates vary far less: a lucky right answer on a rarely drawn arm no longer multiplies
its weight by ``exp(eta / p_i)`` (Lattimore and Szepesvari, *Bandit Algorithms*, ch. 11). Exp4 sees every
member's answer, so each member's gain is observed directly: the probability it gave the true class,
``log w_i += eta * g_i``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowserve.component import Batch, Component, Port, Result
from flowserve.selection.capabilities import Joined

#: the most arms an :class:`Exp3Selector` routes to (its output ports ``arm0``, ``arm1``, ...).
MAX_ARMS = 16
#: the members of an :class:`Exp4Ensemble` (its input ports ``p0``, ``p1``, ``p2``).
MEMBERS = 3
#: the state of requests without a context
DEFAULT_CONTEXT = ""


def probabilities(log_w: np.ndarray, gamma: float) -> np.ndarray:
    """``(1 - gamma) * w / sum(w) + gamma / K`` for log-weights ``log_w`` (one row per context, or one row).

    >>> probabilities(np.log(np.array([3.0, 1.0])), 0.5).round(3).tolist()
    [0.625, 0.375]
    """
    w = np.exp(log_w - log_w.max(axis=-1, keepdims=True))
    k = log_w.shape[-1]
    return (1.0 - gamma) * w / w.sum(axis=-1, keepdims=True) + gamma / k


class Weights:
    """Log-weights per context, bounded: the least recently used context goes first past ``max_contexts``."""

    def __init__(self, arms: int, max_contexts: int) -> None:
        self.arms = arms
        self.max_contexts = max_contexts
        self._by_context: OrderedDict[str, np.ndarray] = OrderedDict()

    def __contains__(self, context: str) -> bool:
        return context in self._by_context

    def contexts(self) -> list[str]:
        return list(self._by_context)

    def get(self, context: str) -> np.ndarray:
        log_w = self._by_context.get(context)
        if log_w is None:
            log_w = np.zeros(self.arms)
            self._by_context[context] = log_w
            if len(self._by_context) > self.max_contexts:
                self._by_context.popitem(last=False)
        else:
            self._by_context.move_to_end(context)
        return log_w

    def matrix(self, contexts: Sequence[str]) -> np.ndarray:
        """The log-weights of each of ``contexts`` (distinct), one row each."""
        return np.stack([self.get(c) for c in contexts]) if contexts else np.zeros((0, self.arms))

    def add(self, context: str, arm: int, amount: float) -> None:
        log_w = self.get(context)
        log_w[arm] += amount
        log_w -= log_w.max()  # keep them near 0: only differences matter, and exp must not overflow

    def state(self, context: str) -> dict[str, Any]:
        return {"log_weights": self.get(context).tolist()}

    def restore(self, context: str, state: Mapping[str, Any]) -> None:
        raw = state.get("log_weights")
        if not isinstance(raw, list) or len(raw) != self.arms:
            return  # another arm count (the node was reconfigured): start this context afresh
        log_w = np.asarray(raw, dtype=np.float64)
        if np.isfinite(log_w).all():
            self.get(context)[:] = log_w - log_w.max()


def _contexts(batch: Batch, header: str | None) -> list[str]:
    if header is None:
        return [DEFAULT_CONTEXT] * len(batch.sizes)
    return [v.decode("utf-8", "replace") if v is not None else DEFAULT_CONTEXT for v in batch.header(header)]


class BanditParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float = Field(0.1, gt=0.0, le=1.0, description="exploration rate: the share spread evenly over arms")
    eta: float = Field(0.05, gt=0.0, le=10.0, description="learning rate of the multiplicative update")
    context_header: str | None = Field(None, description="request header naming the context (e.g. X-User); "
                                                           "feedback's parameters.context names the same one")
    max_contexts: int = Field(10_000, ge=1, description="contexts kept; the least recently used goes first")
    seed: int | None = Field(None, description="seed of the arm draws (None: fresh each start)")


class Exp3Params(BanditParams):
    answers: list[str] = Field(min_length=2, max_length=MAX_ARMS,
                               description="per arm, the 'node.port' whose output is that branch's answer")
    compare: str = Field("label", description="the output compared with the feedback's true output of that name")

    @model_validator(mode="after")
    def _answers_are_ports(self) -> Exp3Params:
        bad = [a for a in self.answers if a.count(".") != 1 or not all(a.split("."))]
        if bad:
            raise ValueError(f"answers must be 'node.port' entries (one per arm), got {bad}")
        return self


class Exp3Selector(Component):
    """Route each request to ONE of ``len(answers)`` branches (ports ``arm0``, ``arm1``, ...), drawn from
    Exp3's probabilities for the request's context; learn from feedback whether that branch was right
    (a wrong answer lowers the branch's log-weight by ``eta / p``, ``p`` the probability it was drawn with).

    All rows of a request take the same branch (a downstream any-join gets the whole request from one
    side). Each decision records the arm, its probability and the branch's answer port for the join.
    """

    inputs = {"x": Port("FP32", [-1, -1])}
    outputs = {"arm0": Port("FP32", [-1, -1]), "arm1": Port("FP32", [-1, -1])}  # one per answer: see __init__
    Params: ClassVar[type[BaseModel]] = Exp3Params
    learns = True

    params: Exp3Params

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.arms = len(self.params.answers)
        # One output port per arm; instance attributes shadow the class-level declaration (the graph reads them).
        self.outputs = {f"arm{i}": Port("FP32", [-1, -1]) for i in range(self.arms)}  # type: ignore[misc]
        self.header = self.params.context_header.lower() if self.params.context_header else None
        self.weights = Weights(self.arms, self.params.max_contexts)
        self.rng = np.random.default_rng(self.params.seed)
        self._decisions: list[dict[str, Any]] = []
        self.rewards = 0
        self.unjoined = 0  # feedback whose answer or true output was missing: not learned from

    def route_fractions(self) -> dict[str, float]:
        return {f"arm{i}": 1.0 / self.arms for i in range(self.arms)}

    def choose(self, contexts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per request, the arm drawn and the probability it had (vectorised over the batch)."""
        distinct, index = np.unique(np.asarray(contexts, dtype=object), return_inverse=True)
        probs = probabilities(self.weights.matrix([str(c) for c in distinct]), self.params.gamma)[index]
        cumulative = np.cumsum(probs, axis=1)
        draws = self.rng.random(len(contexts)) * cumulative[:, -1]
        arms = np.minimum((draws[:, None] >= cumulative).sum(axis=1), self.arms - 1)
        return arms, probs[np.arange(len(contexts)), arms]

    def process(self, batch: Batch) -> Result:
        contexts = _contexts(batch, self.header)
        arms, chosen = self.choose(contexts)
        rows = np.repeat(arms, np.asarray(batch.sizes, dtype=np.intp))
        answers = self.params.answers
        self._decisions.extend(
            {"id": rid, "context": ctx or None, "arm": int(arm), "p": float(p), "answer": answers[arm]}
            for rid, ctx, arm, p in zip(batch.request_ids, contexts, arms.tolist(), chosen.tolist(), strict=True))
        x = batch["x"]
        return Result(outputs={f"arm{i}": x for i in range(self.arms)},
                      mask={f"arm{i}": rows == i for i in range(self.arms)})

    def drain_decisions(self) -> list[dict[str, Any]]:
        out, self._decisions = self._decisions, []
        return out

    def answer_refs(self) -> list[str]:
        return list(self.params.answers)

    def learn(self, joined: Sequence[Joined]) -> set[str]:
        changed: set[str] = set()
        key = self.params.compare
        for j in joined:
            arm, p = j.decision.get("arm"), j.decision.get("p")
            answer, truth = j.answer.get(key), j.truth.get(key)
            if (not isinstance(arm, int) or not 0 <= arm < self.arms or not isinstance(p, float | int) or p <= 0
                    or answer is None or truth is None):
                self.unjoined += 1
                continue
            reward = 1.0 if np.array_equal(np.ravel(answer), np.ravel(truth)) else 0.0
            context = j.context or DEFAULT_CONTEXT
            self.weights.add(context, arm, -self.params.eta * (1.0 - reward) / float(p))
            self.rewards += 1
            changed.add(context)
        return changed

    def probabilities(self, context: str | None = None) -> np.ndarray:
        """The arm probabilities now for ``context`` (None: requests without one)."""
        return probabilities(self.weights.get(context or DEFAULT_CONTEXT), self.params.gamma)

    def learned_state(self, context: str) -> dict[str, Any]:
        return self.weights.state(context)

    def restore_learned(self, context: str, state: Mapping[str, Any]) -> None:
        self.weights.restore(context, state)


class Exp4Params(BanditParams):
    compare: str = Field("label", description="the feedback's output holding the true class per row")


class Exp4Ensemble(Component):
    """Weight three members' class probabilities (``p0``, ``p1``, ``p2``; wire it with an inner join) by
    Exp4 weights for the request's context; learn each member's weight from feedback.

    Outputs the weighted probabilities and their argmax. Every member answered, so each member's gain is
    observed: the probability it gave the true class (its decision record keeps the members' rows).
    """

    inputs = {f"p{i}": Port("FP32", [-1, -1]) for i in range(MEMBERS)}
    outputs = {"probs": Port("FP32", [-1, -1]), "label": Port("INT64", [-1])}
    Params: ClassVar[type[BaseModel]] = Exp4Params
    learns = True

    params: Exp4Params

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.header = self.params.context_header.lower() if self.params.context_header else None
        self.weights = Weights(MEMBERS, self.params.max_contexts)
        self._decisions: list[dict[str, Any]] = []
        self.rewards = 0
        self.unjoined = 0

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        contexts = _contexts(batch, self.header)
        distinct, index = np.unique(np.asarray(contexts, dtype=object), return_inverse=True)
        mix = probabilities(self.weights.matrix([str(c) for c in distinct]), self.params.gamma)[index]
        sizes = np.asarray(batch.sizes, dtype=np.intp)
        per_row = np.repeat(mix, sizes, axis=0)  # (rows, members)
        advice = np.stack([batch[f"p{i}"] for i in range(MEMBERS)], axis=1)  # (rows, members, classes)
        probs = np.einsum("rm,rmc->rc", per_row, advice).astype(np.float32)
        starts = batch.starts()
        self._decisions.extend(
            {"id": rid, "context": ctx or None, "answer": None,
             "advice": advice[s:s + n].round(6).tolist()}
            for rid, ctx, s, n in zip(batch.request_ids, contexts, starts.tolist(), sizes.tolist(), strict=True))
        return {"probs": probs, "label": probs.argmax(axis=1).astype(np.int64)}

    def drain_decisions(self) -> list[dict[str, Any]]:
        out, self._decisions = self._decisions, []
        return out

    def answer_refs(self) -> list[str]:
        return []  # every member answered: the decision keeps their rows, no answer topic is read

    def learn(self, joined: Sequence[Joined]) -> set[str]:
        changed: set[str] = set()
        for j in joined:
            truth = j.truth.get(self.params.compare)
            try:
                advice = np.asarray(j.decision.get("advice"), dtype=np.float64)  # (rows, members, classes)
                labels = np.ravel(np.asarray(truth, dtype=np.int64)) if truth is not None else None
            except (TypeError, ValueError):
                labels = None
            if (labels is None or advice.ndim != 3 or advice.shape[1] != MEMBERS or len(labels) != len(advice)
                    or not ((labels >= 0) & (labels < advice.shape[2])).all()):
                self.unjoined += 1
                continue
            gains = advice[np.arange(len(labels)), :, labels].mean(axis=0)  # per member: prob of the truth
            context = j.context or DEFAULT_CONTEXT
            for member in range(MEMBERS):
                self.weights.add(context, member, self.params.eta * float(gains[member]))
            self.rewards += 1
            changed.add(context)
        return changed

    def member_weights(self, context: str | None = None) -> np.ndarray:
        """The members' weights now for ``context`` (exploration mixed in), summing to 1."""
        return probabilities(self.weights.get(context or DEFAULT_CONTEXT), self.params.gamma)

    def learned_state(self, context: str) -> dict[str, Any]:
        return self.weights.state(context)

    def restore_learned(self, context: str, state: Mapping[str, Any]) -> None:
        self.weights.restore(context, state)

