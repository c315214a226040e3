"""What a component that files side reports (``Component.side_output``) offers capture."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class FilesReports(Protocol):
    """A component whose side reports (a drift detector's window results) capture writes to its side topic."""

    def drain_reports(self) -> list[dict[str, Any]]:
        """Side reports finished since the last call (JSON-able dicts; ``key`` picks their partition).

        Called at the end of every worker step, also between batches, so reports that finish off the loop
        (in a detector's own thread) still leave."""
        ...
