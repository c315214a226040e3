"""Tuning: execution-time profiles (``flowserve profile``), arrival traces, network calculus, the
discrete-event simulator, the planner and the tuner (see docs/planning.md)."""

from flowserve.tuning.profile import profile_topology

__all__ = ["profile_topology"]
