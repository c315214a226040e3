import numpy as np
import pytest

from flowserve.errors import ErrorKind, WireError
from flowserve.topology import names
from flowserve.wire.feedback import decode_feedback, encode_feedback


def test_round_trip_with_context():
    key, value, headers = encode_feedback("r1", {"label": np.array([3], dtype=np.int64)}, context="tenant-7")
    fb = decode_feedback(key, value)
    assert (fb.request_id, fb.context) == ("r1", "tenant-7")
    np.testing.assert_array_equal(fb.outputs["label"], [3])
    assert dict(headers)["fs-id"] == b"r1"


def test_key_gives_the_id_when_json_has_none():
    fb = decode_feedback(b"r2", b'{"outputs":[{"name":"label","datatype":"INT64","shape":[1],"data":[7]}]}')
    assert fb.request_id == "r2" and fb.context is None


@pytest.mark.parametrize("value, words", [
    (b"not json", "not valid JSON"),
    (b"[]", "JSON object"),
    (b'{"id":"x"}', "outputs"),
    (b'{"id":"x","outputs":[{"name":"p","datatype":"FP32","shape":[1],"data":[NaN]}]}', "non-finite"),
    (b'{"outputs":[{"name":"l","datatype":"INT64","shape":[1],"data":[1]}]}', "request id"),
])
def test_bad_feedback_says_why(value, words):
    with pytest.raises(WireError) as info:
        decode_feedback(None, value)
    assert words in str(info.value)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_topic_name():
    assert names.feedback_topic(names.base("fs", "digits")) == "fs.digits.feedback"
