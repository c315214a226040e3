"""Coded redundancy (ParM): a parity model node hides a node's slow and failed workers.

A node opts in with a ``parity:`` section (:class:`~flowserve.topology.parity.ParitySpec`). The workers of
the node feeding it group its requests k at a time into parity queries (:class:`Encoder`); the parity
model node computes on them; a decoder beside it rebuilds a late output from the parity output and the
k-1 outputs that arrived (:class:`Decoder`), marked ``fs-reconstructed``. Attach it to workers with
:func:`parity_hooks` (which also drops, at the protected node's readers, the second copy of an output:
:mod:`flowserve.parity.first_wins`). A component that trains its own parity model implements
:class:`TrainsParity`. See ``docs/parity.md``.
"""

from __future__ import annotations

from flowserve.parity.capabilities import TrainsParity
from flowserve.parity.first_wins import FirstWins, FirstWinsHooks, first_wins_hooks
from flowserve.parity.groups import Decoder, Encoder, Group, Member, Reconstructed
from flowserve.parity.hooks import DecoderLoop, EncoderHooks, parity_hooks

__all__ = ["Decoder", "DecoderLoop", "Encoder", "EncoderHooks", "FirstWins", "FirstWinsHooks", "Group", "Member",
           "Reconstructed", "TrainsParity", "first_wins_hooks", "parity_hooks"]
