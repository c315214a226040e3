"""Detection post-processing: candidate boxes and scores per image to the kept detections, by non-maximum
suppression (``torchvision.ops.batched_nms``; torchvision is the ``vision`` extra).

In a topology::

    post:
      component: flowserve_components.detection:NonMaxSuppression
      params: {iou_threshold: 0.5, score_threshold: 0.25, max_detections: 20, labels: true}
      inputs: {boxes: model.boxes, scores: model.scores, labels: model.labels}

takes per image ``boxes`` FP32 ``[-1, N, 4]`` (N candidates; ``box_format`` xyxy, xywh or cxcywh),
``scores`` FP32 ``[-1, N]`` and, with ``labels: true``, ``labels`` INT64 ``[-1, N]`` (a box suppresses only
boxes of its own class unless ``class_agnostic``). It gives a fixed number of rows per image, best
score first: ``boxes`` FP32 ``[-1, K, 4]`` (xyxy), ``scores`` FP32 ``[-1, K]``, ``labels`` INT64
``[-1, K]`` and ``count`` INT64 ``[-1]``, the detections kept (K = ``max_detections``); rows past
``count`` hold zeros and label -1. The whole batch goes through one ``batched_nms`` call: each image's
boxes are a group of their own, so boxes of different images never suppress each other.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port, torch_threads
from flowserve_components.model_files import require


class NmsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    iou_threshold: float = Field(0.5, ge=0.0, le=1.0, description="a box overlapping a better one by more "
                                 "than this intersection-over-union is dropped")
    score_threshold: float = Field(0.0, description="boxes scoring below this are dropped first")
    max_detections: int = Field(100, ge=1, le=10_000, description="detections kept per image (K)")
    labels: bool = Field(False, description="take a 'labels' input: the class of each candidate box")
    class_agnostic: bool = Field(False, description="with labels: let boxes of different classes suppress "
                                 "each other too")
    box_format: Literal["xyxy", "xywh", "cxcywh"] = Field("xyxy", description="how the input boxes are given "
                                                          "(the output is always xyxy)")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads per worker")


class NonMaxSuppression(Component):
    """Candidate boxes -> the best non-overlapping ones per image (per class with labels), padded to K."""

    Params: ClassVar[type[BaseModel]] = NmsParams
    max_batch: ClassVar[int] = 256
    params: NmsParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        k = self.params.max_detections
        inputs = {"boxes": Port("FP32", [-1, -1, 4], doc=f"candidate boxes, {self.params.box_format}"),
                  "scores": Port("FP32", [-1, -1])}
        if self.params.labels:
            inputs["labels"] = Port("INT64", [-1, -1])
        self.inputs = inputs  # type: ignore[misc]
        self.outputs = {"boxes": Port("FP32", [-1, k, 4], doc="xyxy"), "scores": Port("FP32", [-1, k]),  # type: ignore[misc]
                        "labels": Port("INT64", [-1, k]), "count": Port("INT64", [-1])}
        self._torch: Any = None
        self._ops: Any = None

    def setup(self) -> None:
        self._torch = require("torch", "vision")
        self._ops = require("torchvision.ops", "vision")

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        if self._ops is None:
            self.setup()
        torch, p = self._torch, self.params
        torch_threads(p.threads)
        boxes = torch.from_numpy(np.ascontiguousarray(batch["boxes"], dtype=np.float32))
        scores = np.asarray(batch["scores"], dtype=np.float32)
        images, n = scores.shape
        labels = (np.asarray(batch["labels"], dtype=np.int64) if p.labels
                  else np.zeros((images, n), np.int64))
        if p.box_format != "xyxy":
            boxes = self._ops.box_convert(boxes.reshape(-1, 4), p.box_format, "xyxy").reshape(images, n, 4)
        flat_scores = scores.reshape(-1)
        keep_score = np.flatnonzero(flat_scores >= p.score_threshold)
        image_of = keep_score // n
        # one group per image, or per (image, class): batched_nms never lets two groups suppress each other
        if p.labels and not p.class_agnostic:
            classes = labels.reshape(-1)[keep_score]
            _, group = np.unique(np.stack([image_of, classes], axis=1), axis=0, return_inverse=True)
        else:
            group = image_of
        kept = self._ops.batched_nms(boxes.reshape(-1, 4)[torch.from_numpy(keep_score)],
                                     torch.from_numpy(flat_scores[keep_score]),
                                     torch.from_numpy(np.asarray(group, np.int64).reshape(-1)),
                                     p.iou_threshold).numpy()
        chosen = keep_score[kept]  # flat indices, best score first across the batch
        chosen = chosen[np.argsort(chosen // n, kind="stable")]  # by image, best first within each
        image = chosen // n
        rank = np.arange(len(chosen)) - np.searchsorted(image, image)  # position within its image
        k = p.max_detections
        top = rank < k
        chosen, image, rank = chosen[top], image[top], rank[top]
        out_boxes = np.zeros((images, k, 4), np.float32)
        out_scores = np.zeros((images, k), np.float32)
        out_labels = np.full((images, k), -1, np.int64)
        out_boxes[image, rank] = boxes.reshape(-1, 4).numpy()[chosen]
        out_scores[image, rank] = flat_scores[chosen]
        out_labels[image, rank] = labels.reshape(-1)[chosen]
        count = np.bincount(image, minlength=images).astype(np.int64)
        return {"boxes": out_boxes, "scores": out_scores, "labels": out_labels, "count": count}
