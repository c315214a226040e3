"""The protobuf text format reader behind the Triton import: the syntax Triton's configs use, and errors that
say where (file, line, column)."""

from __future__ import annotations

import doctest

import pytest

from flowserve.errors import ErrorKind
from flowserve.imports import pbtxt
from flowserve.imports.pbtxt import PbtxtError, many, one, parse

# Written as Triton's documentation writes its configs: lists of messages with and without ':', ',' or
# newlines between fields, maps as repeated {key, value}, comments, enum names, nested messages.
CONFIG = """
# an ensemble
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]
output: [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape: { shape: [ ] } } ]
ensemble_scheduling {
  step [
    { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "mid" } },
    { model_name: "b"; model_version: -1; input_map < key: "y" value: "mid" > }
  ]
}
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1, kind: KIND_GPU, gpus: [0, 1] } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
parameters { key: "quoted" value: { string_value: 'it\\'s "a" \\x41\\101\\n' " joined" } }
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4, 8 ] }
optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
numbers { float: 1.5e-3 negative: -2 hex: 0x1F trailing_f: 2.5f dot: .5 yes: true no: False inf: -inf }
"""


def test_reads_a_triton_config() -> None:
    config = parse(CONFIG)
    assert one(config, "name") == "ens" and one(config, "max_batch_size") == 8
    assert many(config, "input") == [{"name": ["IN"], "data_type": ["TYPE_FP32"], "dims": [4]}]
    output = many(config, "output")[0]
    assert many(output, "dims") == [-1, 3] and one(output, "reshape") == {"shape": []}
    steps = many(one(config, "ensemble_scheduling"), "step")
    assert [one(s, "model_name") for s in steps] == ["a", "b"]
    assert one(steps[1], "input_map") == {"key": ["y"], "value": ["mid"]}
    assert [one(g, "count") for g in many(config, "instance_group")] == [2, 1]
    assert many(many(config, "instance_group")[1], "gpus") == [0, 1]
    values = [one(one(p, "value"), "string_value") for p in many(config, "parameters")]
    assert values == ["$$TRITON_MODEL_DIRECTORY/env.tar.gz", "it's \"a\" AA\n joined"]
    numbers = one(config, "numbers")
    assert {k: v[0] for k, v in numbers.items()} == {"float": 1.5e-3, "negative": -2, "hex": 31, "trailing_f": 2.5,
                                                     "dot": 0.5, "yes": True, "no": False, "inf": float("-inf")}
    assert one(config, "absent", "default") == "default" and many(config, "absent") == []


@pytest.mark.parametrize(("text", "where"), [
    ('name: "unterminated\n', "cfg:1:7: a string that does not end on its line"),
    ('input [ { name: "x" ', "cfg:1:21: expected '}' before the end"),
    ("name value", "cfg:1:6: field 'name' needs ':' before a scalar value, or '{' for a message"),
    ("a {\n  b: }", "cfg:2:6: field 'b': expected a value, found '}'"),
    ("dims: [1 2]", "cfg:1:10: expected ',', found '2'"),
    ("a: 1 }", "cfg:1:6: expected a field name, found '}'"),
    ("a: @", "cfg:1:4: unexpected character '@'"),
])
def test_errors_name_the_line_and_column(text: str, where: str) -> None:
    with pytest.raises(PbtxtError) as caught:
        parse(text, "cfg")
    assert str(caught.value) == where and caught.value.kind is ErrorKind.INVALID_SETTINGS


def test_docstring_example_runs() -> None:
    assert doctest.testmod(pbtxt).failed == 0
