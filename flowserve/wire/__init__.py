"""Record envelope, tensor codecs, the V2 JSON/binary codec and headers."""

from flowserve.wire.envelope import Envelope, decode_record, make_headers
from flowserve.wire.tensors import DATATYPES, decode_tensors, encode_tensors
from flowserve.wire.v2 import (
    InferRequest,
    build_request,
    decode_raw,
    decode_response,
    encode_raw,
    encode_response,
    parse_infer,
    parse_request,
    tensor_from_v2,
    tensor_to_v2,
)

__all__ = [
    "DATATYPES",
    "Envelope",
    "InferRequest",
    "build_request",
    "decode_raw",
    "decode_record",
    "decode_response",
    "decode_tensors",
    "encode_raw",
    "encode_response",
    "encode_tensors",
    "make_headers",
    "parse_infer",
    "parse_request",
    "tensor_from_v2",
    "tensor_to_v2",
]
