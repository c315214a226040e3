"""The tuning files (plans, traces): JSON documents that name their format, read with one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowserve.errors import FlowserveError


def read_document(path: str | Path, fmt: str, what: str, hint: str = "") -> dict[str, Any]:
    """The JSON object at ``path`` whose ``format`` is ``fmt``; a :class:`FlowserveError` naming the file and
    ``what`` it should be (and ``hint``: how to make one) for anything else."""
    source = Path(path)
    try:
        doc = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise FlowserveError(f"cannot read {what} {source}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise FlowserveError(f"{source} is not a flowserve {what} (expected \"format\": \"{fmt}\"){hint}")
    return doc
