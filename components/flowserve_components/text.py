"""Text pre-processing: UTF-8 strings (a V2 BYTES tensor) to token ids and an attention mask, with a local
Hugging Face ``tokenizers`` file (``tokenizer.json``; nothing is downloaded).

In a topology::

    tokenize:
      component: flowserve_components.text:Tokenize
      params: {tokenizer: models/my-bert/tokenizer.json, max_length: 128}
      inputs: {text: input.text}

takes ``text``, BYTES ``[-1]`` (one UTF-8 string per element; a request may hold several) and gives
``input_ids`` and ``attention_mask``, INT64 ``[-1, L]`` (and ``token_type_ids`` with ``type_ids: true``).
The whole batch is encoded in one ``encode_batch`` call and padded to its longest row (``padding:
longest``), rounded up to ``pad_to_multiple_of``; ``padding: max_length`` pads every row to ``max_length``
instead. Rows longer than ``max_length`` are truncated. A node downstream batches together only requests
of the same padded length, so when the tokenizer and the model run as separate nodes, ``max_length`` or a
``pad_to_multiple_of`` keeps their batches large; fused (``fuse:``), they share the batch either way.

The file is read when the topology loads (a missing file, or one that is not a tokenizer, fails there
naming it); an element that is not valid UTF-8 fails only its own request (``invalid_input``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowserve.component import Batch, Component, Port, Result
from flowserve.errors import ComponentError
from flowserve_components.model_files import PORT_NAME, ModelFile, model_location, one_source, require

#: pad tokens looked for, in order, when the file sets no padding and 'pad_token' is not given
PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|endoftext|>")


class TokenizeParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: str | None = Field(None, description="path of a tokenizer.json file (or a directory holding one)")
    tokenizer_from: str | None = Field(None, description="'module:function' returning that path, creating the "
                                       "file when missing; called when the topology loads")
    max_length: int = Field(512, ge=1, le=1_000_000, description="longest row in tokens; longer ones are truncated")
    padding: Literal["longest", "max_length"] = Field("longest", description="pad each batch to its longest "
                                                      "row, or every row to max_length")
    pad_to_multiple_of: int | None = Field(None, ge=1, description="round the padded length up to a multiple")
    pad_token: str | None = Field(None, description="the padding token; default the file's, else [PAD] or <pad>")
    add_special_tokens: bool = Field(True, description="add the file's special tokens ([CLS] ... [SEP])")
    type_ids: bool = Field(False, description="also emit token_type_ids")
    input: str = Field("text", description="name of the BYTES input port")

    @model_validator(mode="after")
    def _check(self) -> TokenizeParams:
        one_source(self.tokenizer, self.tokenizer_from, name="tokenizer")
        if not PORT_NAME.match(self.input):
            raise ValueError(f"'{self.input}' is not a valid port name (it must match {PORT_NAME.pattern})")
        return self


def load_tokenizer(path: str | Path) -> tuple[Any, Path]:
    """The tokenizer in ``path`` (a tokenizer.json file, or a directory holding one) and the file read."""
    file = ModelFile(path, "tokenizer")
    if file.path.is_dir():
        file = ModelFile(file.path / "tokenizer.json", "tokenizer")
    head = file.head("save it with tokenizer.save('tokenizer.json')")
    if not head.lstrip().startswith(b"{"):
        raise file.fail("is not a tokenizer.json file (not JSON); a 'tokenizers' file is written by "
                        "tokenizer.save('tokenizer.json') or PreTrainedTokenizerFast.save_pretrained(dir)")
    tokenizers = require("tokenizers", "text")
    try:
        return tokenizers.Tokenizer.from_file(str(file.path)), file.path
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot read
        raise file.fail(f"not a tokenizer the 'tokenizers' library reads: {str(exc).strip()}") from None


class Tokenize(Component):
    """Strings -> ``input_ids`` and ``attention_mask`` (INT64, padded per batch) with a local tokenizer.json."""

    Params: ClassVar[type[BaseModel]] = TokenizeParams
    max_batch: ClassVar[int] = 256
    params: TokenizeParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        p = self.params
        self.tokenizer, self.path = load_tokenizer(model_location(p.tokenizer, p.tokenizer_from, "tokenizer"))
        self.inputs = {p.input: Port("BYTES", [-1], doc="one UTF-8 string per element")}  # type: ignore[misc]
        outputs = {"input_ids": Port("INT64", [-1, -1]), "attention_mask": Port("INT64", [-1, -1])}
        if p.type_ids:
            outputs["token_type_ids"] = Port("INT64", [-1, -1])
        self.outputs = outputs  # type: ignore[misc]
        pad_token, pad_id = self._pad()
        self.tokenizer.enable_truncation(p.max_length)
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token, pad_to_multiple_of=p.pad_to_multiple_of,
                                      length=p.max_length if p.padding == "max_length" else None)
        self.pad_id = pad_id
        self.file_hash = ModelFile(self.path, "tokenizer").sha256()

    def _pad(self) -> tuple[str, int]:
        """The padding token and its id: as given, as the file sets, or the first of :data:`PAD_TOKENS` it has."""
        wanted = self.params.pad_token
        padding: dict[str, Any] | None = self.tokenizer.padding
        if wanted is None and padding is not None:
            return str(padding["pad_token"]), int(padding["pad_id"])
        for token in ([wanted] if wanted is not None else PAD_TOKENS):
            pad_id = self.tokenizer.token_to_id(token)
            if pad_id is not None:
                return token, pad_id
        if wanted is not None:
            raise ComponentError(f"tokenizer {self.path}: has no token '{wanted}' (pad_token)")
        raise ComponentError(f"tokenizer {self.path}: sets no padding and has none of {', '.join(PAD_TOKENS)}; "
                             "name its padding token with 'pad_token'")

    def process(self, batch: Batch) -> Result:
        texts: list[str] = []
        errors: dict[int, str] = {}
        starts = batch.starts()  # an error names the text by its index in its own request
        for i, raw in enumerate(batch[self.params.input]):
            try:
                texts.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
            except UnicodeDecodeError as exc:
                where = i - int(starts[np.searchsorted(starts, i, side="right") - 1])
                errors[i] = f"node '{self.node}': text {where} is not UTF-8 ({exc.reason} at byte {exc.start})"
                texts.append("")
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=self.params.add_special_tokens)
        out = {"input_ids": np.array([e.ids for e in encodings], np.int64).reshape(len(texts), -1),
               "attention_mask": np.array([e.attention_mask for e in encodings], np.int64).reshape(len(texts), -1)}
        if self.params.type_ids:
            out["token_type_ids"] = np.array([e.type_ids for e in encodings], np.int64).reshape(len(texts), -1)
        return Result(out, errors=errors)

    def describe(self) -> str:
        return f"{super().describe()}(tokenizer={self.path}, sha256:{self.file_hash})"
