"""What a component that learns from feedback (``Component.learns``) offers the selection feature."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class Joined:
    """Feedback joined to what a learning component did for that request.

    ``decision``: the component's own decision record, as :meth:`LearnsFromFeedback.drain_decisions` gave
    it; ``answer``: the outputs of the port the decision names as its answer (``{}`` when it names none or
    they were not found in the join window); ``truth``: the feedback's true outputs; ``context``: the
    feedback's context, else the decision's.
    """

    request_id: str
    context: str | None
    decision: Mapping[str, Any]
    answer: Mapping[str, np.ndarray]
    truth: Mapping[str, np.ndarray]


@runtime_checkable
class LearnsFromFeedback(Protocol):
    """A bandit selector's side of :mod:`flowserve.selection`: the feature writes what
    :meth:`drain_decisions` gives to ``<base>.<node>.decisions``, joins the topology's feedback to those
    decisions (and to the outputs each names as its answer) by request id, hands the joined records to
    :meth:`learn`, and keeps :meth:`learned_state` in ``<base>.<node>.state``."""

    def drain_decisions(self) -> list[dict[str, Any]]:
        """Decisions taken since the last call, one JSON-able dict per request: ``id`` (the request id),
        ``context`` (str or None), ``answer`` (the ``node.port`` whose output is the request's answer, or
        None) and whatever the component needs to learn from it later."""
        ...

    def answer_refs(self) -> list[str]:
        """Every ``node.port`` a decision may name as its answer (the join reads their topics)."""
        ...

    def learn(self, joined: Sequence[Joined]) -> set[str]:
        """Learn from feedback joined to this component's decisions; returns the contexts whose state changed."""
        ...

    def learned_state(self, context: str) -> dict[str, Any]:
        """What was learned for ``context`` (JSON-able), to be restored by :meth:`restore_learned`."""
        ...

    def restore_learned(self, context: str, state: Mapping[str, Any]) -> None:
        """Take back state that :meth:`learned_state` gave (a restarted or added worker resumes it)."""
        ...
