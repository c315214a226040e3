"""The binary tensor frame: exact round trips for every V2 datatype, and only WireError on hostile bytes."""

from __future__ import annotations

import random
import struct
import tracemalloc

import numpy as np
import pytest

from flowserve.errors import WireError
from flowserve.wire.tensors import DATATYPES, MAGIC, MAX_RANK, datatype_of, decode_tensors, encode_tensors

FIXED = [name for name in DATATYPES if name != "BYTES"]
CODE = {name: i for i, name in enumerate(DATATYPES)}
ODD_BYTES = [b"", b"\xff\xfe\x00\x80", "h\u00e9llo \u2603".encode(), b"\x00" * 7, b"x" * 300]


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random values spanning the datatype's range, with NaN, +-inf and -0.0 for floats."""
    rng = np.random.default_rng(seed)
    dtype = DATATYPES[datatype]
    size = int(np.prod(shape))
    if datatype == "BOOL":
        flat = rng.integers(0, 2, size).astype(bool)
    elif datatype == "BYTES":
        flat = np.empty(size, dtype=object)
        for i in range(size):
            flat[i] = ODD_BYTES[i % len(ODD_BYTES)] + bytes(rng.integers(0, 256, i % 5, dtype=np.uint8))
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        flat[: min(size, 2)] = [info.min, info.max][: min(size, 2)]
    else:
        flat = (rng.standard_normal(size) * 1000).astype(dtype)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).max, np.finfo(dtype).tiny], dtype=dtype)
        flat[: min(size, len(specials))] = specials[: min(size, len(specials))]
    return flat.reshape(shape)


def assert_same(got: np.ndarray, want: np.ndarray, datatype: str) -> None:
    assert datatype_of(got) == datatype
    assert got.shape == want.shape
    if datatype == "BYTES":
        assert got.dtype == object
        assert got.reshape(-1).tolist() == want.reshape(-1).tolist()
        assert all(type(v) is bytes for v in got.flat)
    else:
        assert got.dtype == DATATYPES[datatype]
        assert got.tobytes() == np.ascontiguousarray(want, dtype=DATATYPES[datatype]).tobytes()  # bitwise
        if got.dtype.kind == "f":
            assert np.array_equal(got, want, equal_nan=True)


def tensor_frame(name: bytes | str, code: int, shape: list[int], payload: bytes, *, count: int = 1,
                 nbytes: int | None = None) -> bytes:
    """A hand-built frame, so tests can lie in any field."""
    raw = name.encode() if isinstance(name, str) else name
    return (
        MAGIC + struct.pack("<H", count) + bytes((len(raw),)) + raw + bytes((code, len(shape)))
        + struct.pack(f"<{len(shape)}qQ", *shape, len(payload) if nbytes is None else nbytes) + payload
    )


def valid_frame() -> bytes:
    return encode_tensors({
        "pixels": sample("FP32", (2, 3)),
        "text": np.array([b"", b"\xff\x00", b"abc"], dtype=object),
        "flag": np.array(True),
    })


# --- round trips -------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 1, 3, 1)])
def test_round_trip_every_datatype(datatype: str, shape: tuple[int, ...]) -> None:
    array = sample(datatype, shape)
    out = decode_tensors(encode_tensors({"t": array}))
    assert list(out) == ["t"]
    assert_same(out["t"], array, datatype)


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("shape", [(0, 64), (0,), (3, 0), ()])
def test_round_trip_empty_and_scalar_tensors(datatype: str, shape: tuple[int, ...]) -> None:
    array = sample(datatype, shape)
    out = decode_tensors(encode_tensors({"t": array}))["t"]
    assert_same(out, array, datatype)
    assert out.size == (1 if shape == () else 0)


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_nan_and_infinities_are_preserved_bitwise(datatype: str) -> None:
    dtype = DATATYPES[datatype]
    array = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype)
    out = decode_tensors(encode_tensors({"f": array}))["f"]
    assert out.tobytes() == array.tobytes()
    assert np.array_equal(out, array, equal_nan=True)
    assert np.signbit(out[4]) and not np.signbit(out[5])


def test_bytes_keep_empty_and_non_utf8_values_and_str_becomes_utf8() -> None:
    array = np.array([[b"", b"\xff\xfe"], [b"\x00", b"ok"]], dtype=object)
    out = decode_tensors(encode_tensors({"b": array}))["b"]
    assert out.shape == (2, 2)
    assert out.tolist() == [[b"", b"\xff\xfe"], [b"\x00", b"ok"]]
    text = decode_tensors(encode_tensors({"s": np.array(["caf\u00e9", ""])}))["s"]
    assert text.tolist() == ["caf\u00e9".encode(), b""]


def test_multi_tensor_frame_keeps_names_and_order() -> None:
    tensors = {name: sample(name, (2, 2), seed=i) for i, name in enumerate(DATATYPES)}
    tensors["\u00fcnicode name"] = sample("INT8", (1,))
    out = decode_tensors(encode_tensors(tensors))
    assert list(out) == list(tensors)
    for name, array in tensors.items():
        assert_same(out[name], array, datatype_of(array))


def test_empty_frame_round_trips() -> None:
    assert decode_tensors(encode_tensors({})) == {}


def test_large_shapes_round_trip() -> None:
    big = np.arange(512 * 1024, dtype=np.float64).reshape(512, 1024)
    deep = np.arange(2, dtype=np.int16).reshape((2,) + (1,) * (MAX_RANK - 1))
    out = decode_tensors(encode_tensors({"big": big, "deep": deep}))
    assert np.array_equal(out["big"], big)
    assert out["deep"].shape == deep.shape and np.array_equal(out["deep"], deep)


def test_fixed_width_arrays_are_read_only_views() -> None:
    out = decode_tensors(encode_tensors({"x": np.zeros(4, dtype=np.float32)}))["x"]
    assert not out.flags.writeable


def test_non_contiguous_and_big_endian_inputs_encode_as_their_values() -> None:
    matrix = np.arange(12, dtype=np.int32).reshape(3, 4)
    big_endian = np.array([1.5, -2.25], dtype=">f8")
    out = decode_tensors(encode_tensors({"t": matrix.T, "r": matrix[::-1, ::2], "be": big_endian}))
    assert np.array_equal(out["t"], matrix.T)
    assert np.array_equal(out["r"], matrix[::-1, ::2])
    assert out["be"].dtype == np.dtype("<f8") and out["be"].tolist() == [1.5, -2.25]


@pytest.mark.parametrize("data", [bytearray, memoryview])
def test_decode_accepts_bytearray_and_memoryview(data: type) -> None:
    frame = encode_tensors({"x": np.arange(3, dtype=np.uint16)})
    assert decode_tensors(data(frame))["x"].tolist() == [0, 1, 2]


# --- encode errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"n" * 256: np.zeros(1)}, "longer than 255 bytes"),
        ({"deep": np.zeros((1,) * (MAX_RANK + 1))}, "rank 17"),
        ({"c": np.zeros(2, dtype=np.complex64)}, "has no V2 datatype"),
        ({"o": np.array([1, b"x"], dtype=object)}, "holds a int"),
    ],
)
def test_encode_rejects_what_a_frame_cannot_hold(tensors: dict, message: str) -> None:
    with pytest.raises(WireError, match=message):
        encode_tensors(tensors)


def test_encode_rejects_more_tensors_than_the_count_field_holds() -> None:
    tensors = {f"t{i}": np.zeros(0, dtype=np.uint8) for i in range(0x10000)}
    with pytest.raises(WireError, match="65536 tensors"):
        encode_tensors(tensors)


# --- hostile input -----------------------------------------------------------------------------------


def test_truncation_at_every_offset_raises_wire_error() -> None:
    frame = valid_frame()
    assert decode_tensors(frame)["text"].tolist() == [b"", b"\xff\x00", b"abc"]
    for cut in range(len(frame)):
        with pytest.raises(WireError):
            decode_tensors(frame[:cut])


def test_stray_trailing_bytes_raise() -> None:
    with pytest.raises(WireError, match="1 stray bytes after the last tensor"):
        decode_tensors(valid_frame() + b"\x00")


@pytest.mark.parametrize("magic", [b"FST2", b"\x00\x00\x00\x00", b'{"in'])
def test_wrong_magic_raises(magic: bytes) -> None:
    with pytest.raises(WireError, match="not a flowserve tensor frame"):
        decode_tensors(magic + valid_frame()[4:])


@pytest.mark.parametrize("code", [len(DATATYPES), 200, 255])
def test_unknown_datatype_code_raises(code: int) -> None:
    with pytest.raises(WireError, match=f"tensor 'x': unknown datatype code {code}"):
        decode_tensors(tensor_frame("x", code, [1], b"\x00"))


def test_rank_above_limit_raises() -> None:
    with pytest.raises(WireError, match=f"rank {MAX_RANK + 1} is more than {MAX_RANK}"):
        decode_tensors(tensor_frame("x", CODE["UINT8"], [1] * (MAX_RANK + 1), b"\x00"))


@pytest.mark.parametrize("shape", [[-1], [2, -3], [-(2**63)]])
def test_negative_dimension_raises(shape: list[int]) -> None:
    with pytest.raises(WireError, match="negative dimension"):
        decode_tensors(tensor_frame("x", CODE["UINT8"], shape, b""))


def test_payload_longer_than_the_frame_raises() -> None:
    for nbytes in (5, 2**40, 2**64 - 1):
        with pytest.raises(WireError, match="runs past the frame"):
            decode_tensors(tensor_frame("x", CODE["UINT8"], [4], b"\x00" * 4, nbytes=nbytes))


@pytest.mark.parametrize(("datatype", "shape", "payload"), [
    ("FP32", [2], b"\x00" * 12),
    ("FP32", [3], b"\x00" * 8),
    ("INT64", [], b"\x00" * 4),
    ("FP16", [0], b"\x00\x00"),
])
def test_payload_that_does_not_match_the_shape_raises(datatype: str, shape: list[int], payload: bytes) -> None:
    with pytest.raises(WireError, match=f"of {datatype} needs"):
        decode_tensors(tensor_frame("x", CODE[datatype], shape, payload))


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("shape", [[2**62], [2**62, 2**62], [2**31] * MAX_RANK, [0, 2**62, 2**62], [2**63 - 1, 0]])
def test_huge_declared_dims_raise_without_allocating(datatype: str, shape: list[int]) -> None:
    frame = tensor_frame("x", CODE[datatype], shape, b"\x00" * 16)
    tracemalloc.start()
    try:
        with pytest.raises(WireError, match="tensor 'x'"):
            decode_tensors(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_bytes_element_running_past_payload_raises() -> None:
    payload = struct.pack("<I", 10) + b"abc"
    with pytest.raises(WireError, match="BYTES element 0 of 10 bytes runs past the payload"):
        decode_tensors(tensor_frame("s", CODE["BYTES"], [1], payload))


def test_bytes_payload_with_stray_bytes_raises() -> None:
    payload = struct.pack("<I", 1) + b"a" + b"zz" + b"\x00\x00"
    with pytest.raises(WireError, match="stray bytes after 1 BYTES elements"):
        decode_tensors(tensor_frame("s", CODE["BYTES"], [1], payload))


def test_bool_payload_other_than_0_or_1_raises() -> None:
    with pytest.raises(WireError, match="BOOL payload holds bytes other than 0 and 1"):
        decode_tensors(tensor_frame("b", CODE["BOOL"], [3], b"\x00\x02\x01"))


def test_non_utf8_tensor_name_raises() -> None:
    with pytest.raises(WireError, match="not UTF-8"):
        decode_tensors(tensor_frame(b"\xff\xfe", CODE["UINT8"], [1], b"\x00"))


def test_duplicate_tensor_names_raise() -> None:
    one = tensor_frame("x", CODE["UINT8"], [1], b"\x07")
    frame = MAGIC + struct.pack("<H", 2) + one[6:] + one[6:]
    with pytest.raises(WireError, match="tensor 'x' appears twice"):
        decode_tensors(frame)


def test_count_larger_than_the_tensors_present_raises() -> None:
    one = tensor_frame("x", CODE["UINT8"], [1], b"\x07", count=3)
    with pytest.raises(WireError, match="frame ends before all its tensors"):
        decode_tensors(one)


def test_fuzzed_frames_raise_only_wire_error() -> None:
    rng = random.Random(1234)
    seeds = [valid_frame(), encode_tensors({"e": np.zeros((0, 64), dtype=np.float32)}),
             encode_tensors({n: sample(n, (2,)) for n in DATATYPES})]
    rejected = 0
    for _ in range(4000):
        frame = bytearray(rng.choice(seeds))
        mutation = rng.randrange(5)
        if mutation == 0:
            frame = bytearray(rng.randbytes(rng.randrange(64)))
            if rng.random() < 0.5:
                frame[:4] = MAGIC
        elif mutation == 1:
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
        elif mutation == 2:
            at = rng.randrange(len(frame))
            frame[at:at] = rng.randbytes(rng.randrange(1, 9))
        elif mutation == 3:
            at = rng.randrange(len(frame))
            del frame[at : at + rng.randrange(1, 9)]
        else:
            at = rng.randrange(len(frame))
            frame[at : at + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, struct.pack("<q", 2**62)])
        try:
            decode_tensors(bytes(frame))
        except WireError:  # anything else fails the test
            rejected += 1
    assert rejected > 3000  # the mutations do reach the checks, not only the magic
