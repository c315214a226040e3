"""Continual learning: versions of a node's model, retraining from feedback, shadow, promote and rollback.

``flowserve learn`` joins the feedback (``<base>.feedback``) with the node's captured inputs, retrains
(the component declares how: ``Component.retrainable``) and registers a version (:class:`Registry`).
A shadow worker runs a version on a copy of the live traffic (:func:`shadow_worker`); ``flowserve
versions`` compares it with the live one (:func:`compare`); ``promote``/``rollback`` switch the live
version between batches (:func:`version_hooks` in the workers, :func:`send_version`). See docs/learning.md.
"""

from __future__ import annotations

from flowserve.learning.hooks import VersionHooks, send_version, version_hooks
from flowserve.learning.learn import TrainingSet, VersionRow, compare, join_training_set, retrain, training_set
from flowserve.learning.registry import BASE, Manifest, Registry, RegistryError
from flowserve.learning.shadow import shadow_topics, shadow_topology, shadow_worker

__all__ = ["BASE", "Manifest", "Registry", "RegistryError", "TrainingSet", "VersionHooks", "VersionRow", "compare",
           "join_training_set", "retrain", "send_version", "shadow_topics", "shadow_topology", "shadow_worker",
           "training_set", "version_hooks"]
