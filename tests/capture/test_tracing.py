"""Span building and the local JSON-lines exporter, unit level (no broker)."""

from __future__ import annotations

import json

from flowserve.capture import tracing


def test_spans_from_the_factory_export_as_json_lines_equal_to_span_dict(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("FLOWSERVE_TRACES_DIR", str(tmp_path))
    tracing.use_exporter(None)  # the default exporter: JSON lines under FLOWSERVE_TRACES_DIR
    try:
        f = tracing.SpanFactory()
        trace_id, span_id = int(tracing.new_trace_id(), 16), int(tracing.new_span_id(), 16)
        request = f.span("model", f.context(trace_id, span_id), f.context(trace_id, 7, remote=True), 10, 20,
                         {"fs.request_id": 'r"1'}, error="boom")
        ids = int(tracing.new_trace_id(), 16), int(tracing.new_span_id(), 16)
        batch = f.span("model.batch", f.context(*ids), None, 10, 20, {"fs.batch.size": 1},
                       links=[f.link(request.context)])
        f.export([request, batch])
        tracing.flush()
    finally:
        tracing.use_exporter(None)
    lines = [json.loads(line) for path in tmp_path.glob("spans-*.jsonl") for line in path.read_text().splitlines()]
    assert lines == [tracing.span_dict(request), tracing.span_dict(batch)]
    assert lines[0]["parent_id"] == f"{7:016x}" and lines[0]["status"] == "ERROR"
    assert lines[0]["trace_id"] == f"{trace_id:032x}" and lines[1]["links"][0]["span_id"] == f"{span_id:016x}"


def test_stage_spans_write_the_same_lines_locally_as_the_sdk_spans_they_stand_for(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setenv("FLOWSERVE_TRACES_DIR", str(tmp_path))
    trace_ids = [tracing.new_trace_id() for _ in range(3)]
    span_ids = tracing.new_span_ids(3)
    rids = [json.dumps(rid) for rid in ("r1", 'r"2', "r3")]  # batch() takes them as JSON strings
    args = ("model-abc-1", 4, 100, 250, rids, trace_ids, span_ids, [f"{7:016x}", "", f"{9:016x}"],
            [None, "boom", None])
    stage = tracing.StageSpans("model", "digits")
    tracing.use_exporter(None)  # the local exporter: lines formatted without SDK objects
    try:
        assert stage.batch(*args) == 4
        tracing.flush()
        memory = InMemorySpanExporter()
        tracing.use_exporter(memory)
        assert stage.batch(*args) == 4
    finally:
        tracing.use_exporter(None)
    lines = [json.loads(line) for path in tmp_path.glob("spans-*.jsonl") for line in path.read_text().splitlines()]
    expected = [tracing.span_dict(s) for s in memory.get_finished_spans()]
    for d in (lines[-1], expected[-1]):  # the batch span's own ids are random
        assert d["parent_id"] is None and d.pop("trace_id") and d.pop("span_id")
    assert lines == expected
    assert [d["status"] for d in lines] == ["UNSET", "ERROR", "UNSET", "UNSET"]
    assert lines[0]["parent_id"] == f"{7:016x}" and lines[1]["parent_id"] is None
    assert lines[3]["attributes"] == {"fs.node": "model", "fs.topology": "digits", "fs.batch.id": "model-abc-1",
                                      "fs.batch.size": 4}
    assert [lk["span_id"] for lk in lines[3]["links"]] == span_ids
    assert lines[1]["attributes"] == {"fs.request_id": 'r"2'}


def test_span_ids_drawn_together_are_distinct_16_hex_digits() -> None:
    ids = tracing.new_span_ids(1000)
    assert len(set(ids)) == 1000 and all(len(s) == 16 and int(s, 16) for s in ids)
    assert tracing.new_span_ids(0) == [] and len(tracing.new_trace_id()) == 32
