"""What a component may declare for the planner and the simulator (:mod:`flowserve.tuning`)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from flowserve.component import Component


@runtime_checkable
class DeclaresLatency(Protocol):
    """A component that knows its seconds per batch size on each hardware kind (an emulated model)."""

    def latency_table(self, hardware: str | None = None) -> dict[int, float] | None:
        """Declared seconds per batch size on ``hardware`` (None: as configured); None when it cannot run
        on that hardware."""
        ...


@runtime_checkable
class DeclaresRoutes(Protocol):
    """A routing component that knows how its rows divide among its output ports."""

    def route_fractions(self) -> dict[str, float]:
        """Expected share of rows emitted on each output port (a port absent here gets every row)."""
        ...


def latency_table(component: Component, hardware: str | None = None) -> dict[int, float] | None:
    """``component``'s declared latency table on ``hardware``; None when it declares none (then a measured
    profile is used) or cannot run there."""
    return component.latency_table(hardware) if isinstance(component, DeclaresLatency) else None


def route_fractions(component: Component) -> dict[str, float]:
    """``component``'s declared share of rows per output port; ``{}`` (every port gets every row) when none."""
    return component.route_fractions() if isinstance(component, DeclaresRoutes) else {}
