"""Tuning: execution-time profiles of a topology's nodes (``flowserve profile``) and live stats."""

from flowserve.tuning.profile import profile_topology

__all__ = ["profile_topology"]
