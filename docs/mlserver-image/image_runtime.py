"""An MLServer runtime serving topologies/image-classifier.yaml's ONNX CNN, for comparisons.

MLServer 1.7 ships no ONNX runtime (no ``mlserver-onnx`` package exists for it; its docs send ONNX models
to Triton), so this is the closest thing a user would write: a custom ``MLModel`` that runs the same
``.onnx`` file with ONNX Runtime, with the same pre- and post-processing as the topology's three nodes:

- ``image`` BYTES [n] in, one PNG or JPEG file per element, sent base64 (``"parameters": {"content_type":
  "base64"}``: MLServer's REST API has no binary extension, and plain V2 JSON does not carry binary);
- decode with Pillow, EXIF turn, grey (``L``), bilinear resize to 16x16, ``(v / 255 - 0.5) / 0.5``
  (``DecodeImage`` with ``flowserve_components.image_model.PRE``);
- the CNN on ONNX Runtime, one intra-op and one inter-op thread (the topology's ``threads: 1``), the file
  ``flowserve_components.image_model.ensure_model()`` gives (trained and exported on first use, cached);
- softmax, the label, its class name, the probabilities and the top 3 names (``Classify``, ``top_k: 3``):
  ``label`` INT64 [n], ``class`` BYTES [n], ``probs`` FP32 [n, 10], ``top_classes`` BYTES [n, 3].

MLServer's adaptive batching (``model-settings.json``: up to 32 requests, 5 ms) merges concurrent
requests into one call. ``mlserver start docs/mlserver-image`` serves it on 127.0.0.1:18290 as the model
``image-classifier`` (docs/benchmarks.md shows the bench command).
"""

from __future__ import annotations

import io

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import Base64Codec, NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from PIL import Image, ImageOps

from flowserve_components.image_model import CLASSES, PRE, ensure_model

HEIGHT, WIDTH = PRE["size"]
SCALE = np.float32(1.0 / (255.0 * PRE["std"][0]))
SHIFT = np.float32(-PRE["mean"][0] / PRE["std"][0])
NAMES = np.array([c.encode() for c in CLASSES], dtype=object)
TOP_K = 3


def pixels(raw: bytes) -> np.ndarray:
    """One encoded image as the CNN's input row, float32 [1, 16, 16] (what the topology's ``pre`` gives)."""
    image = Image.open(io.BytesIO(raw), formats=["PNG", "JPEG"])
    image.load()
    image = ImageOps.exif_transpose(image).convert(PRE["mode"])
    if image.size != (WIDTH, HEIGHT):
        image = image.resize((WIDTH, HEIGHT), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8).reshape(1, HEIGHT, WIDTH)


class ImageClassifier(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(ensure_model()), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        images = Base64Codec.decode_input(payload.inputs[0])
        x = np.stack([pixels(raw) for raw in images]).astype(np.float32)
        x *= SCALE
        x += SHIFT
        (logits,) = self._session.run(None, {self._input: x})
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
        label = probs.argmax(axis=1).astype(np.int64)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :TOP_K]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[
            NumpyCodec.encode_output("label", label), NumpyCodec.encode_output("class", NAMES[label]),
            NumpyCodec.encode_output("probs", probs), NumpyCodec.encode_output("top_classes", NAMES[top])])
