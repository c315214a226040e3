"""The accounting of ``flowserve bench explain``: its target reads the interval's low end, and its two sides
differ by the explain: section alone. The bench itself needs a broker and minutes; it is not run here."""

from __future__ import annotations

from flowserve_bench.explain import explain_targets, topology


def test_the_target_reads_the_low_end_of_the_interval() -> None:
    assert explain_targets({"ratio": 0.99, "95ci": [0.96, 1.02]}) == {"explain_1pct_costs_le_5pct": True}
    # a point estimate within 5% whose interval reaches below 0.95: a known bad run fails
    assert explain_targets({"ratio": 0.97, "95ci": [0.93, 1.01]}) == {"explain_1pct_costs_le_5pct": False}


def test_the_two_sides_differ_by_the_explain_section_alone() -> None:
    off_text, off = topology(None)
    on_text, on = topology(0.01)
    assert not off.explained and on.explained
    assert set(off.nodes) == set(on.nodes) == {"pre", "model", "post"}
    assert "explain" not in off_text and "sample: 0.01" in on_text
