"""Record envelope, tensor codecs and headers."""

from flowserve.wire.envelope import Envelope, decode_record, make_headers
from flowserve.wire.tensors import DATATYPES, decode_tensors, encode_tensors
from flowserve.wire.v2 import parse_request, tensor_from_v2, tensor_to_v2

__all__ = [
    "DATATYPES",
    "Envelope",
    "decode_record",
    "decode_tensors",
    "encode_tensors",
    "make_headers",
    "parse_request",
    "tensor_from_v2",
    "tensor_to_v2",
]
