"""Continual learning: versions of a node's model, retraining from feedback, shadow, promote and rollback.

``flowserve learn`` joins the feedback (``<base>.feedback``) with the node's captured inputs, retrains
(the component declares ``Component.retrainable`` and implements :class:`Retrainable`) and registers a
version (:class:`Registry`).
A shadow worker runs a version on a copy of the live traffic (:func:`shadow_worker`); ``flowserve
versions`` compares it with the live one (:func:`compare`); ``promote``/``rollback`` switch the live
version between batches (:func:`version_hooks` in the workers, :func:`send_version`). A component whose
state spans batches (``keeps_state``, :class:`HoldsState`) bounds its worker's commits (:func:`held_hooks`).
See docs/learning.md.
"""

from __future__ import annotations

from flowserve.learning.capabilities import Retrainable, Retrained, Scores, score
from flowserve.learning.held import HeldHooks, HeldOffsets, HoldsState, held_hooks
from flowserve.learning.hooks import VersionHooks, send_version, version_hooks
from flowserve.learning.learn import TrainingSet, VersionRow, compare, join_training_set, retrain, training_set
from flowserve.learning.registry import BASE, Manifest, Registry, RegistryError
from flowserve.learning.shadow import shadow_topics, shadow_topology, shadow_worker

__all__ = ["BASE", "HeldHooks", "HeldOffsets", "HoldsState", "Manifest", "Registry", "RegistryError", "Retrainable",
           "Retrained", "Scores", "TrainingSet", "VersionHooks", "VersionRow", "compare", "held_hooks",
           "join_training_set", "retrain", "score", "send_version", "shadow_topics", "shadow_topology",
           "shadow_worker", "training_set", "version_hooks"]
