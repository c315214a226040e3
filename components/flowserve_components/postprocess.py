"""Turn classifier outputs into answers: the most likely label, or the k most likely ones.

``ArgMax`` and ``TopK`` serve the ten digit classes; ``Classify`` any named classes, with a threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port
from flowserve.errors import ComponentError

N_CLASSES = 10


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32; subtracting the row maximum keeps ``exp`` from overflowing."""
    z = np.asarray(logits, dtype=np.float32)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class ArgMaxParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Literal["logits", "probs"] = Field(
        "logits", description="what arrives: logits (softmax applied here) or probabilities (passed on)"
    )


class ArgMax(Component):
    """The most likely label and the class probabilities.

    With ``params: {input: probs}`` the input port is ``probs`` and is passed on unchanged, for nodes
    downstream of a softmax or an ensemble.
    """

    inputs = {"logits": Port("FP32", [-1, N_CLASSES])}
    outputs = {"label": Port("INT64", [-1]), "probs": Port("FP32", [-1, N_CLASSES])}
    Params: ClassVar[type[BaseModel]] = ArgMaxParams

    params: ArgMaxParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.inputs = {self.params.input: Port("FP32", [-1, N_CLASSES])}  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        probs = batch["probs"] if self.params.input == "probs" else softmax(batch["logits"])
        return {"label": probs.argmax(axis=1).astype(np.int64), "probs": probs}

    def torch_forward(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``probs`` in torch (the label, an arg-max, has no gradient), for flowserve.explain.Differentiable."""
        if self.params.input == "probs":
            return {"probs": inputs["probs"]}
        return {"probs": inputs["logits"].float().softmax(dim=-1)}


class TopKParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(3, ge=1, le=N_CLASSES, description="how many classes to report per row")


class TopK(Component):
    """The ``k`` most likely classes per row, best first, with their softmax probabilities.

    Ties go to the lower class index, so the output is deterministic.
    """

    inputs = {"logits": Port("FP32", [-1, N_CLASSES])}
    outputs = {"indices": Port("INT64", [-1, -1]), "scores": Port("FP32", [-1, -1])}
    Params: ClassVar[type[BaseModel]] = TopKParams

    params: TopKParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        k = self.params.k
        self.outputs = {"indices": Port("INT64", [-1, k]), "scores": Port("FP32", [-1, k])}  # type: ignore[misc]

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        probs = softmax(batch["logits"])
        # A stable sort of the negated scores keeps equal scores in index order.
        indices = np.argsort(-probs, axis=1, kind="stable")[:, : self.params.k]
        return {"indices": indices.astype(np.int64), "scores": np.take_along_axis(probs, indices, axis=1)}


class ClassifyParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    classes: list[str] = Field(min_length=2, description="class names, by class index")
    input: Literal["probs", "logits", "positive"] = Field(
        "probs", description="probs: [-1, n] probabilities; logits: [-1, n] (softmax applied here); positive: "
        "[-1] the probability of classes[1] (a binary model's single output)")
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="two classes: classes[1] when its "
                                    "probability >= threshold; more: rows whose best probability is below it get "
                                    "label -1 and the 'abstain' name")
    abstain: str = Field("", description="class name of a row below the threshold (more than two classes)")
    top_k: int | None = Field(None, ge=1, description="also emit the k most likely classes and probabilities")


class Classify(Component):
    """Class probabilities to answers for any number of named classes: the label, its name, the probabilities
    and, with ``top_k``, the k most likely names best first (ties to the lower index).

    >>> post = Classify.configure({"classes": ["cat", "dog"], "threshold": 0.3})
    >>> out = post.process(Batch({"probs": np.array([[0.75, 0.25], [0.6, 0.4]], np.float32)}, [2], ["r"]))
    >>> out["label"].tolist(), out["class"].tolist()
    ([0, 1], [b'cat', b'dog'])
    """

    Params: ClassVar[type[BaseModel]] = ClassifyParams
    params: ClassifyParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        n, k = len(self.params.classes), self.params.top_k
        if self.params.input == "positive" and n != 2:
            raise ComponentError(f"input 'positive' is for two classes; 'classes' names {n}")
        if k is not None and k > n:
            raise ComponentError(f"top_k {k} is more than the {n} classes")
        shape = [-1] if self.params.input == "positive" else [-1, n]
        self.inputs = {self.params.input: Port("FP32", shape)}  # type: ignore[misc]
        outputs = {"label": Port("INT64", [-1]), "class": Port("BYTES", [-1]), "probs": Port("FP32", [-1, n])}
        if k is not None:
            outputs |= {"top_classes": Port("BYTES", [-1, k]), "top_probs": Port("FP32", [-1, k])}
        self.outputs = outputs  # type: ignore[misc]
        # index -1 (abstained) picks the last entry: the abstain name
        self._names = np.array([c.encode() for c in self.params.classes] + [self.params.abstain.encode()],
                               dtype=object)

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        raw = batch[self.params.input]
        if self.params.input == "positive":
            probs = np.stack([1 - raw, raw], axis=1).astype(np.float32)
        else:
            probs = softmax(raw) if self.params.input == "logits" else np.asarray(raw, dtype=np.float32)
        label = probs.argmax(axis=1).astype(np.int64)  # the first maximum: ties go to the lower index
        threshold = self.params.threshold
        if threshold is not None and probs.shape[1] == 2:
            label = (probs[:, 1] >= threshold).astype(np.int64)
        elif threshold is not None:
            label[probs.max(axis=1) < threshold] = -1
        out = {"label": label, "class": self._names[label], "probs": probs}
        if self.params.top_k is not None:
            top = np.argsort(-probs, axis=1, kind="stable")[:, : self.params.top_k]
            out |= {"top_classes": self._names[top], "top_probs": np.take_along_axis(probs, top, axis=1)}
        return out
