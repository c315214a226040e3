"""Span building and the local JSON-lines exporter, unit level (no broker)."""

from __future__ import annotations

import json

from flowserve.capture import tracing


def test_spans_from_the_factory_export_as_json_lines_equal_to_span_dict(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("FLOWSERVE_TRACES_DIR", str(tmp_path))
    tracing.use_exporter(None)  # the default exporter: JSON lines under FLOWSERVE_TRACES_DIR
    try:
        f = tracing.SpanFactory()
        trace_id, span_id = tracing.new_trace_id(), tracing.new_span_id()
        request = f.span("model", f.context(trace_id, span_id), f.context(trace_id, 7, remote=True), 10, 20,
                         {"fs.request_id": 'r"1'}, error="boom")
        batch = f.span("model.batch", f.context(tracing.new_trace_id(), tracing.new_span_id()), None, 10, 20,
                       {"fs.batch.size": 1}, links=[f.link(request.context)])
        f.export([request, batch])
        tracing.flush()
    finally:
        tracing.use_exporter(None)
    lines = [json.loads(line) for path in tmp_path.glob("spans-*.jsonl") for line in path.read_text().splitlines()]
    assert lines == [tracing.span_dict(request), tracing.span_dict(batch)]
    assert lines[0]["parent_id"] == f"{7:016x}" and lines[0]["status"] == "ERROR"
    assert lines[0]["trace_id"] == f"{trace_id:032x}" and lines[1]["links"][0]["span_id"] == f"{span_id:016x}"
