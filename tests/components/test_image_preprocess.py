"""DecodeImage (PNG/JPEG bytes -> resized, normalised batches) against Pillow and torchvision run directly,
bad bytes failing only their own request; NonMaxSuppression against torchvision.ops run image by image."""

from __future__ import annotations

import doctest
import io

import numpy as np
import pytest
from PIL import Image

from flowserve.component import Batch, Port, Result
from flowserve.errors import ComponentError
from flowserve_components import images
from flowserve_components.detection import NonMaxSuppression
from flowserve_components.images import DecodeImage

torch = pytest.importorskip("torch")
tv_ops = pytest.importorskip("torchvision.ops")
tv_io = pytest.importorskip("torchvision.io")
tv_f = pytest.importorskip("torchvision.transforms.v2.functional")

# torchvision 0.29 deprecates its decoders (for TorchCodec); the references below still use them
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def encode(array: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt)
    return out.getvalue()


def photos(n: int, seed: int) -> list[bytes]:
    """``n`` RGB images of assorted sizes, alternately PNG and JPEG (smooth, so JPEG keeps them close)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(9, 48, 2))
        base = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
        array = np.asarray(Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR))
        out.append(encode(array, "PNG" if i % 2 == 0 else "JPEG"))
    return out


def pillow_reference(raw: bytes, size: tuple[int, int]) -> np.ndarray:
    """What DecodeImage should give for one image, written out with Pillow and numpy: [3, H, W]."""
    image = Image.open(io.BytesIO(raw)).convert("RGB").resize((size[1], size[0]), Image.Resampling.BILINEAR)
    x = np.asarray(image, np.float32) / 255.0
    return ((x - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1)


def torchvision_reference(raw: bytes, size: tuple[int, int]) -> np.ndarray:
    image = tv_io.decode_image(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=tv_io.ImageReadMode.RGB)
    image = tv_f.resize(image, list(size), antialias=True)
    x = tv_f.normalize(tv_f.to_dtype(image, torch.float32, scale=True), MEAN, STD)
    return x.numpy()


def run(node: DecodeImage, raws: list[bytes], sizes: list[int] | None = None) -> Result:
    batch = Batch({"image": np.array(raws, dtype=object)}, sizes or [len(raws)], ["r"] * len(sizes or [1]))
    out = node.process(batch)
    assert isinstance(out, Result)
    return out


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_pillow_backend_equals_pillow_run_directly(rows: int) -> None:
    node = DecodeImage.configure({"size": [20, 24], "mean": MEAN, "std": STD})
    assert node.inputs == {"image": Port("BYTES", [-1])} and node.outputs == {"x": Port("FP32", [-1, 3, 20, 24])}
    raws = photos(rows, seed=rows)
    out = run(node, raws)
    assert not out.errors and out.outputs["x"].dtype == np.float32
    want = np.stack([pillow_reference(r, (20, 24)) for r in raws])
    np.testing.assert_allclose(out.outputs["x"], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_torchvision_backend_equals_torchvision_run_directly(rows: int) -> None:
    node = DecodeImage.configure({"size": [20, 24], "mean": MEAN, "std": STD, "backend": "torchvision"})
    node.setup()
    raws = photos(rows, seed=100 + rows)
    out = run(node, raws)
    assert not out.errors
    want = np.stack([torchvision_reference(r, (20, 24)) for r in raws])
    np.testing.assert_allclose(out.outputs["x"], want, atol=1e-5, rtol=0)
    # the two backends differ by the resize's rounding only: at most one grey level before normalising
    pillow = run(DecodeImage.configure({"size": [20, 24], "mean": MEAN, "std": STD}), raws).outputs["x"]
    assert np.abs((out.outputs["x"] - pillow) * np.float32(STD).reshape(1, 3, 1, 1)).max() <= 1.0 / 255 + 1e-6


def test_jpeg_draft_decodes_at_a_reduced_scale() -> None:
    raws = photos(8, seed=3)
    big = [encode(np.asarray(Image.open(io.BytesIO(r)).convert("RGB").resize((160, 120))), "JPEG") for r in raws]
    node = DecodeImage.configure({"size": [20, 24], "jpeg_draft": True})
    want = []
    for raw in big:
        image = Image.open(io.BytesIO(raw))
        image.draft("RGB", (24, 24))
        assert image.size == (40, 30)  # libjpeg decoded it at a quarter of its size
        want.append(np.asarray(image.convert("RGB").resize((24, 20), Image.Resampling.BILINEAR)).transpose(2, 0, 1))
    np.testing.assert_allclose(run(node, big).outputs["x"], np.stack(want) / np.float32(255), atol=1e-6, rtol=0)


def test_grey_nhwc_and_one_request_of_several_images() -> None:
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    node = DecodeImage.configure({"size": [8, 8], "mode": "L", "layout": "NHWC", "std": [2.0]})
    assert node.outputs == {"x": Port("FP32", [-1, 8, 8, 1])}
    rgb = np.stack([grey] * 3, axis=2)  # an RGB file turned grey gives the same grey back
    out = run(node, [encode(grey, "PNG"), encode(rgb, "PNG")], sizes=[2])
    np.testing.assert_allclose(out.outputs["x"][..., 0], np.stack([grey, grey]) / 255.0 / 2.0, atol=1e-6)


def test_bad_bytes_fail_only_their_own_rows() -> None:
    node = DecodeImage.configure({"size": [4, 4], "mode": "L", "max_pixels": 10_000}, node="pre")
    good = encode(np.full((8, 8), 255, np.uint8), "PNG")
    gif = io.BytesIO()
    Image.new("L", (4, 4)).save(gif, format="GIF")
    raws = [good, b"not an image", b"", good[:-20], gif.getvalue(),
            encode(np.zeros((200, 60), np.uint8), "PNG"), good[:20], good]
    out = run(node, raws, sizes=[len(raws)])
    assert out.errors == {
        1: "node 'pre': image 1: not a PNG or JPEG image (12 bytes starting b'not an i')",
        2: "node 'pre': image 2: empty (0 bytes)",
        3: f"node 'pre': image 3: does not decode as PNG: {out.errors[3].split('as PNG: ', 1)[-1]}",
        4: f"node 'pre': image 4: not a PNG or JPEG image ({len(gif.getvalue())} bytes starting b'GIF87a\\x04\\x00')",
        5: "node 'pre': image 5: 60x200 is more than max_pixels 10000",
        6: "node 'pre': image 6: a truncated or corrupt PNG: it starts as one, but its header does not read "
           "(20 bytes)",
    }
    assert "truncated" in out.errors[3]
    # an error names the image by its place in its own request: here the second image of the second request
    assert run(node, [good, good, b"?"], sizes=[1, 2]).errors == {
        2: "node 'pre': image 1: not a PNG or JPEG image (1 bytes starting b'?')"}
    np.testing.assert_array_equal(out.outputs["x"][[0, 7]], np.ones((2, 1, 4, 4), np.float32))
    tv = DecodeImage.configure({"size": [4, 4], "mode": "L", "backend": "torchvision"}, node="pre")
    tv.setup()
    out = run(tv, raws[:4], sizes=[4])
    assert sorted(out.errors) == [1, 2, 3] and out.errors[3].startswith("node 'pre': image 3: does not decode")


def test_params_are_checked() -> None:
    with pytest.raises(ComponentError, match="mean has 2 values; mode RGB takes 1 or 3"):
        DecodeImage.configure({"size": [4, 4], "mean": [0.1, 0.2]})
    with pytest.raises(ComponentError, match="std must not hold 0"):
        DecodeImage.configure({"size": [4, 4], "std": [0.0]})
    with pytest.raises(ComponentError, match="size"):
        DecodeImage.configure({"size": [0, 4]})


def test_docstring_example_runs() -> None:
    assert doctest.testmod(images).failed == 0


def nms_reference(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, k: int, iou: float, low: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torchvision.ops.batched_nms run on one image, its best ``k`` kept boxes, scores and labels."""
    keep = np.flatnonzero(scores >= low)
    kept = tv_ops.batched_nms(torch.from_numpy(boxes[keep]), torch.from_numpy(scores[keep]),
                              torch.from_numpy(labels[keep]), iou).numpy()[:k]
    return boxes[keep][kept], scores[keep][kept], labels[keep][kept]


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_nms_equals_torchvision_per_image(rows: int) -> None:
    rng = np.random.default_rng(rows)
    n, k = 30, 5
    corner = rng.uniform(0, 40, (rows, n, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(5, 30, (rows, n, 2)).astype(np.float32)], axis=2)
    scores = rng.permutation(rows * n).reshape(rows, n).astype(np.float32) / (rows * n)  # distinct: no ties
    labels = rng.integers(0, 3, (rows, n))
    node = NonMaxSuppression.configure({"iou_threshold": 0.3, "score_threshold": 0.2, "max_detections": k,
                                        "labels": True})
    assert node.outputs["boxes"] == Port("FP32", [-1, k, 4]) and node.outputs["count"] == Port("INT64", [-1])
    node.setup()
    out = node.process(Batch({"boxes": boxes, "scores": scores, "labels": labels}, [rows], ["r"]))
    for i in range(rows):
        want_boxes, want_scores, want_labels = nms_reference(boxes[i], scores[i], labels[i], k, 0.3, 0.2)
        c = len(want_scores)
        assert out["count"][i] == c
        np.testing.assert_array_equal(out["boxes"][i, :c], want_boxes)
        np.testing.assert_array_equal(out["scores"][i, :c], want_scores)
        np.testing.assert_array_equal(out["labels"][i, :c], want_labels)
        assert (out["labels"][i, c:] == -1).all() and (out["scores"][i, c:] == 0).all()


def test_nms_class_agnostic_and_box_formats() -> None:
    # two overlapping boxes of different classes, given as cx, cy, w, h
    boxes = np.array([[[5, 5, 10, 10], [6, 6, 10, 10], [50, 50, 4, 4]]], np.float32)
    scores = np.array([[0.9, 0.8, 0.7]], np.float32)
    labels = np.array([[0, 1, 0]])
    per_class = NonMaxSuppression.configure({"labels": True, "box_format": "cxcywh", "max_detections": 3})
    agnostic = NonMaxSuppression.configure({"labels": True, "class_agnostic": True, "box_format": "cxcywh",
                                            "max_detections": 3})
    batch = Batch({"boxes": boxes, "scores": scores, "labels": labels}, [1], ["r"])
    for node in (per_class, agnostic):
        node.setup()
    out = per_class.process(batch)
    assert out["count"].tolist() == [3] and out["labels"].tolist() == [[0, 1, 0]]
    np.testing.assert_array_equal(out["boxes"][0, 0], [0, 0, 10, 10])  # output is xyxy
    out = agnostic.process(batch)
    assert out["count"].tolist() == [2] and out["labels"].tolist() == [[0, 0, -1]]
    assert NonMaxSuppression.configure({}).inputs.keys() == {"boxes", "scores"}
