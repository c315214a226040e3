"""An MLServer runtime serving the digits MLP the way flowserve's digits pipeline does, for comparisons.

The same weights (flowserve_components' model zoo, read with ``torch.load(weights_only=True)``), the same
three steps (pixels / 16, the MLP on one torch thread, softmax and argmax), the same input and outputs
(``pixels`` FP32 [n, 64] in; ``label`` INT64 [n] and ``probs`` FP32 [n, 10] out). MLServer's adaptive
batching (``model-settings.json``: up to 32 requests, 5 ms) merges concurrent requests into one call.
Run it as docs/benchmarks.md shows (``mlserver start docs/mlserver``).
"""

from __future__ import annotations

import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from flowserve_components.models import load


class DigitsMLP(MLModel):
    async def load(self) -> bool:
        torch.set_num_threads(1)  # as the pipeline's model stage (threads: 1)
        self._model = load("digits-mlp", "cpu")
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        pixels = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False).reshape(-1, 64)
        with torch.inference_mode():
            logits = self._model(torch.from_numpy(pixels / np.float32(16.0))).numpy()
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
        label = probs.argmax(axis=1).astype(np.int64)
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[
            NumpyCodec.encode_output("label", label), NumpyCodec.encode_output("probs", probs)])
