"""Image pre-processing: encoded image bytes (PNG or JPEG in a V2 BYTES tensor) to a normalised float batch.

In a topology::

    pre:
      component: flowserve_components.images:DecodeImage
      params: {size: [224, 224], mode: RGB, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
      inputs: {image: input.image}

takes ``image``, BYTES ``[-1]`` (one encoded image per element; a request may hold several) and gives
``x``, FP32 ``[-1, C, H, W]`` (``layout: NHWC`` for ``[-1, H, W, C]``): each image decoded, turned to
``mode`` (``L``: one grey channel; ``RGB``: three, alpha dropped), rotated as its EXIF orientation says,
resized to ``size`` (height, width; aspect ratio not kept), scaled to 0..1 and normalised per channel,
``(v - mean) / std``.

Two decoders give pixels a grey level or two apart (the resize's rounding; a colour file made grey):
``backend: pillow`` (the default) and ``backend: torchvision`` (``torchvision.io.decode_image`` and the
transforms v2 resize, which resizes a batch of same-sized images in one call). Serve with the backend the
model was trained with. Bytes that are not a PNG or JPEG (``formats`` widens that), that do not decode,
or that hold more than ``max_pixels`` pixels (a decompression bomb) fail only the request they belong to
(an ``invalid_input`` dead letter naming the node, the row and why); the rest of the batch goes on.

>>> import io
>>> from PIL import Image
>>> png = io.BytesIO()
>>> Image.new("L", (4, 2), color=255).save(png, format="PNG")
>>> pre = DecodeImage.configure({"size": [2, 2], "mode": "L", "mean": [0.5], "std": [0.5]})
>>> pre.process(Batch({"image": np.array([png.getvalue()], dtype=object)}, [1], ["r"])).outputs["x"].tolist()
[[[[1.0, 1.0], [1.0, 1.0]]]]
"""

from __future__ import annotations

import io
import warnings
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowserve.component import Batch, Component, Port, Result, torch_threads
from flowserve.errors import ComponentError
from flowserve_components.model_files import PORT_NAME, require

Mode = Literal["L", "RGB"]
Resample = Literal["nearest", "bilinear", "bicubic"]
CHANNELS: dict[str, int] = {"L": 1, "RGB": 3}
#: how the files of each format start (to tell a damaged file from one of another kind)
MAGIC = {"PNG": b"\x89PNG\r\n\x1a\n", "JPEG": b"\xff\xd8\xff", "GIF": b"GIF8", "BMP": b"BM",
         "WEBP": b"RIFF", "TIFF": b"II*\x00"}
#: Pillow's own decompression-bomb limit, which it only warns about below twice the figure.
DEFAULT_MAX_PIXELS = 40_000_000


class DecodeImageParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    size: tuple[int, int] = Field(description="[height, width] every image is resized to")
    mode: Mode = Field("RGB", description="L: one grey channel; RGB: three channels (alpha dropped)")
    mean: list[float] | None = Field(None, description="per-channel mean subtracted after scaling to 0..1 "
                                     "(one value, or one per channel); default 0")
    std: list[float] | None = Field(None, description="per-channel divisor after subtracting the mean; default 1")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="axis order of the output batch")
    resample: Resample = Field("bilinear", description="resize filter (antialiased when shrinking)")
    backend: Literal["pillow", "torchvision"] = Field("pillow", description="decoder and resizer: Pillow, "
                                                      "or torchvision.io with transforms v2")
    formats: list[Literal["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"]] = Field(
        ["PNG", "JPEG"], min_length=1, description="image formats accepted (others fail their request)")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, gt=0, description="largest width x height accepted")
    exif_transpose: bool = Field(True, description="rotate/flip as the image's EXIF orientation says")
    jpeg_draft: bool = Field(False, description="pillow: decode a JPEG at a reduced scale still no smaller than "
                             "size (libjpeg's DCT scaling): faster, pixels a few levels off a full decode")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads per worker (torchvision backend)")
    input: str = Field("image", description="name of the BYTES input port")
    output: str = Field("x", description="name of the FP32 output port")

    @model_validator(mode="after")
    def _check(self) -> DecodeImageParams:
        if min(self.size) < 1:
            raise ValueError(f"size {list(self.size)} must be two positive numbers [height, width]")
        channels = CHANNELS[self.mode]
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and len(values) not in (1, channels):
                raise ValueError(f"{name} has {len(values)} values; mode {self.mode} takes 1 or {channels}")
        if self.std is not None and any(s == 0 for s in self.std):
            raise ValueError("std must not hold 0")
        for port in (self.input, self.output):
            if not PORT_NAME.match(port):
                raise ValueError(f"'{port}' is not a valid port name (it must match {PORT_NAME.pattern})")
        return self


class BadImage(ValueError):
    """One element that is not an image this node takes; its request fails, the batch goes on."""


class DecodeImage(Component):
    """Encoded images (PNG/JPEG bytes) -> resized, normalised float tensors, one row per image."""

    Params: ClassVar[type[BaseModel]] = DecodeImageParams
    max_batch: ClassVar[int] = 256
    params: DecodeImageParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        p = self.params
        height, width = p.size
        channels = CHANNELS[p.mode]
        self.inputs = {p.input: Port("BYTES", [-1], doc="one encoded image (PNG, JPEG) per element")}  # type: ignore[misc]
        shape = [-1, channels, height, width] if p.layout == "NCHW" else [-1, height, width, channels]
        self.outputs = {p.output: Port("FP32", shape)}  # type: ignore[misc]
        # (v / 255 - mean) / std as one multiply-add per value
        mean = np.broadcast_to(np.asarray(p.mean or [0.0], np.float64), (channels,))
        std = np.broadcast_to(np.asarray(p.std or [1.0], np.float64), (channels,))
        axis = (channels, 1, 1) if p.layout == "NCHW" else (channels,)  # broadcast over the channel axis
        self._scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(axis)
        self._shift = (-mean / std).astype(np.float32).reshape(axis)
        self._tv: Any = None
        # Pillow (the 'vision' extra) reads every image's header, whichever backend decodes it
        self._pil = require("PIL.Image", "vision")
        self._ops = require("PIL.ImageOps", "vision")

    def setup(self) -> None:
        if self.params.backend == "torchvision":
            self._tv = _Torchvision(self.params)

    def process(self, batch: Batch) -> Result:
        p = self.params
        if p.backend == "torchvision" and self._tv is None:
            raise ComponentError(f"node '{self.node}': DecodeImage.process called before setup()")
        height, width = p.size
        pixels = np.zeros((batch.rows, height, width, CHANNELS[p.mode]), np.uint8)
        errors: dict[int, str] = {}
        decoded: list[tuple[int, Any]] = []
        for i, raw in enumerate(batch[p.input]):
            try:
                image = self.open(raw)
                if self._tv is None:
                    pixels[i] = self._pillow_pixels(image)
                else:
                    decoded.append((i, self._tv.decode(raw)))
            except BadImage as exc:
                errors[i] = f"node '{self.node}': image {_in_request(batch, i)}: {exc}"
        if decoded:
            torch_threads(self.params.threads)  # per OS thread: set where process runs, not in setup
            rows = [i for i, _ in decoded]
            pixels[rows] = self._tv.resize([t for _, t in decoded])
        if p.layout == "NCHW":  # reorder the uint8 pixels, a quarter of the bytes of the floats made next
            pixels = np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))
        x = pixels.astype(np.float32)
        x *= self._scale
        x += self._shift
        return Result({p.output: x}, errors=errors)

    def open(self, raw: object) -> Any:
        """``raw`` opened (its header read, nothing decoded yet), once it is known to be an image we take."""
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise BadImage(f"a {type(raw).__name__}, not encoded image bytes")
        if len(raw) == 0:
            raise BadImage("empty (0 bytes)")
        try:
            with warnings.catch_warnings():  # past max_pixels is refused below; Pillow's own warning is noise
                warnings.simplefilter("ignore", self._pil.DecompressionBombWarning)
                image = self._pil.open(io.BytesIO(raw), formats=self.params.formats)
        except self._pil.DecompressionBombError as exc:
            raise BadImage(f"too large to decode ({exc})") from None
        except Exception:  # noqa: BLE001 - Pillow raises UnidentifiedImageError, SyntaxError, ...
            head = bytes(raw[:8])
            like = next((f for f, magic in MAGIC.items() if head.startswith(magic)), None)
            if like in self.params.formats:
                raise BadImage(f"a truncated or corrupt {like}: it starts as one, but its header does not read "
                               f"({len(raw)} bytes)") from None
            raise BadImage(f"not a {' or '.join(self.params.formats)} image ({len(raw)} bytes starting "
                           f"{head!r})") from None
        if image.width * image.height > self.params.max_pixels:
            raise BadImage(f"{image.width}x{image.height} is more than max_pixels {self.params.max_pixels}")
        return image

    def _pillow_pixels(self, image: Any) -> np.ndarray:
        """One opened image decoded by Pillow as uint8 ``[H, W, C]`` at ``size``."""
        p = self.params
        height, width = p.size
        kind = image.format
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", self._pil.DecompressionBombWarning)
                if p.jpeg_draft and kind == "JPEG":  # before load; square, so that an EXIF turn still fits
                    image.draft(p.mode, (max(p.size), max(p.size)))
                image.load()
                if p.exif_transpose:
                    image = self._ops.exif_transpose(image)
                image = image.convert(p.mode)
                if image.size != (width, height):
                    image = image.resize((width, height), self._pil.Resampling[p.resample.upper()])
                array = np.asarray(image)
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt stream fails in the decoder
            raise BadImage(f"does not decode as {kind}: {exc}") from None
        return array.reshape(height, width, CHANNELS[p.mode])


def _in_request(batch: Batch, row: int) -> int:
    """The index of batch row ``row`` among its own request's images (what the caller knows it as)."""
    starts = batch.starts()
    return row - int(starts[np.searchsorted(starts, row, side="right") - 1])


class _Torchvision:
    """torchvision.io decoding and the transforms v2 resize (imported in ``setup``: torchvision is optional)."""

    def __init__(self, p: DecodeImageParams) -> None:
        self.torch = require("torch", "vision")
        self.io = require("torchvision.io", "vision")
        self.v2 = require("torchvision.transforms.v2.functional", "vision")
        modes = self.io.ImageReadMode
        self.read_mode = modes.GRAY if p.mode == "L" else modes.RGB
        self.interpolation = getattr(require("torchvision.transforms", "vision").InterpolationMode,
                                     p.resample.upper())
        self.size = list(p.size)
        self.exif = p.exif_transpose

    def decode(self, raw: bytes) -> Any:
        data = self.torch.frombuffer(bytearray(raw), dtype=self.torch.uint8)
        try:
            with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders in favour of TorchCodec
                warnings.simplefilter("ignore", DeprecationWarning)
                return self.io.decode_image(data, mode=self.read_mode, apply_exif_orientation=self.exif)
        except Exception as exc:  # noqa: BLE001 - torchvision raises RuntimeError for a corrupt stream
            why = str(exc).strip()
            # torchvision prefixes its C++ source location: "operator(), .../decode_png.cpp:79, Out of bound..."
            raise BadImage(f"does not decode: {why.rsplit('.cpp:', 1)[-1].partition(', ')[2] or why}") from None

    def resize(self, images: list[Any]) -> np.ndarray:
        """uint8 ``[C, H, W]`` images -> uint8 ``[N, H, W, C]`` at ``size``; same-sized ones in one call."""
        out: list[Any] = [None] * len(images)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for k, image in enumerate(images):
            by_shape.setdefault(tuple(image.shape), []).append(k)
        for shape, members in by_shape.items():
            stack = self.torch.stack([images[k] for k in members])
            if list(shape[1:]) != self.size:
                stack = self.v2.resize(stack, self.size, interpolation=self.interpolation, antialias=True)
            for k, image in zip(members, stack, strict=True):
                out[k] = image
        return self.torch.stack(out).permute(0, 2, 3, 1).numpy()

