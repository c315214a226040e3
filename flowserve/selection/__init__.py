"""Learning from feedback in a topology's workers: bandit model selection (``Component.learns``).

Attach :func:`selection_hooks` to the workers (``flowserve worker`` does): a learning node's decisions go
to ``<base>.<node>.decisions``, feedback from ``<base>.feedback`` is joined to them, and what the node
learned lives in the compacted ``<base>.<node>.state``. Its component implements
:class:`LearnsFromFeedback`. See ``docs/learning.md``.
"""

from flowserve.selection.capabilities import Joined, LearnsFromFeedback
from flowserve.selection.hooks import SelectionHooks, SelectionSettings, selection_hooks
from flowserve.selection.join import FeedbackJoin
from flowserve.selection.learner import Learner

__all__ = ["FeedbackJoin", "Joined", "Learner", "LearnsFromFeedback", "SelectionHooks", "SelectionSettings",
           "selection_hooks"]
