"""Reading an incoming traceparent on the capture hot path, unit level (no broker).

Its ids are copied as text into headers, lineage JSON and span lines, so anything that is not a valid
W3C traceparent must come out as "no parent", never as text.
"""

from __future__ import annotations

import pytest

from flowserve.capture.stage import _incoming

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_a_well_formed_traceparent_gives_its_ids_as_hex() -> None:
    assert _incoming(f"00-{TRACE}-{SPAN}-01".encode()) == (TRACE, SPAN)


def test_uppercase_hex_is_read_through_the_general_parser_and_given_lowercase() -> None:
    assert _incoming(f"00-{TRACE.upper()}-{SPAN.upper()}-01".encode()) == (TRACE, SPAN)


@pytest.mark.parametrize("raw", [
    None,
    b"",
    f"00-{'0' * 32}-{SPAN}-01".encode(),  # all-zero trace id: invalid
    f"00-{TRACE}-{'0' * 16}-01".encode(),  # all-zero span id: invalid
    f"ff-{TRACE}-{SPAN}-01".encode(),  # version ff: invalid
    f'00-{TRACE[:-1]}"-{SPAN}-01'.encode(),  # a quote where a digit belongs: must not reach JSON
    f"00-{TRACE}-{SPAN[:-1]}g-01".encode(),
    f"00-{TRACE}x{SPAN}-01".encode(),
])
def test_anything_else_means_no_parent(raw: bytes | None) -> None:
    assert _incoming(raw) == ("", "")
