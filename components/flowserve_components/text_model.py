"""The model and samples of ``topologies/text-classifier.yaml``: a synthetic labelled corpus made here (no
text data set ships offline with the installed packages), a WordPiece tokenizer and a tiny BERT trained on
it on first use, saved as a Hugging Face model directory.

The corpus: short sentences about three topics (:data:`CLASSES`), each drawn from topic templates and
word lists and padded with words common to all topics, by a seeded generator; training and held-out
sentences come from different seeds. :func:`train` fits a ``tokenizers`` WordPiece vocabulary on the
training sentences, then a two-layer BERT (hidden size 32) for a few seconds (seeded, one thread), and
saves both with ``save_pretrained`` (safetensors) to ``<cache>/models/topics-bert/``::

    requests, labels = sample(2, seed=1)
    requests[0]["text"]            # array([b'the striker scored ...'], dtype=object)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from flowserve.component import Batch
from flowserve_components.models import cache_dir
from flowserve_components.text import Tokenize, TokenizeParams
from flowserve_components.training import train_in_child

CLASSES = ["sports", "weather", "cooking"]
MODEL = "topics-bert"
SEED, TEST_SEED = 0, 1
TRAIN_SIZE = 600
EPOCHS = 4
MAX_LENGTH = 32

_TEMPLATES = {
    "sports": ["the {who} {did} in the {when} {what}", "our {who} {did} after the {what}",
               "a late {what} and the {who} {did}"],
    "weather": ["{what} is expected {when} in the {where}", "the {where} will see {what} {when}",
                "expect {what} over the {where} {when}"],
    "cooking": ["{did} the {what} and serve it {when}", "for the {what} you {did} it {when}",
                "the {who} likes to {did} {what} {when}"],
}
_WORDS = {
    "sports": {"who": ["striker", "goalkeeper", "team", "coach", "captain", "referee"],
               "did": ["scored", "won", "lost", "defended", "tackled", "celebrated"],
               "when": ["final", "second half", "first half", "derby", "league match"],
               "what": ["goal", "penalty", "corner", "free kick", "match"]},
    "weather": {"what": ["rain", "snow", "sunshine", "thunder", "fog", "strong wind", "frost"],
                "when": ["tonight", "tomorrow", "this morning", "on sunday", "later"],
                "where": ["north", "coast", "valley", "hills", "south east", "city"]},
    "cooking": {"who": ["chef", "baker", "cook", "grandmother"],
                "did": ["bake", "roast", "simmer", "chop", "whisk", "season", "fry"],
                "what": ["onions", "sauce", "bread", "soup", "garlic", "pastry", "rice"],
                "when": ["hot", "warm", "with butter", "gently", "slowly"]},
}
_FILLER = ["really", "today", "again", "we think", "they said", "as usual", "of course"]


def corpus(n: int, seed: int) -> tuple[list[str], list[int]]:
    """``n`` sentences and their topic indices, drawn by ``seed`` (balanced in expectation)."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(len(CLASSES)))
        topic = CLASSES[label]
        template = _TEMPLATES[topic][int(rng.integers(len(_TEMPLATES[topic])))]
        words = {slot: choices[int(rng.integers(len(choices)))] for slot, choices in _WORDS[topic].items()}
        text = template.format(**words)
        if rng.random() < 0.5:
            text = f"{_FILLER[int(rng.integers(len(_FILLER)))]} {text}"
        texts.append(text.capitalize() if rng.random() < 0.3 else text)
        labels.append(label)
    return texts, labels


def model_dir() -> Path:
    return cache_dir() / "models" / MODEL


def train_tokenizer(texts: list[str]) -> object:
    """A lower-casing WordPiece tokenizer fitted to ``texts``, adding [CLS] ... [SEP], padding with [PAD]."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))  # noqa: S106 - a token, not a password
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")  # noqa: S106
    return tokenizer


def train(path: Path | None = None) -> Path:
    """Fit the tokenizer and train the tiny BERT (seconds); save both as a model directory at ``path``."""
    import torch
    import transformers

    path = path or model_dir()
    texts, labels = corpus(TRAIN_SIZE, SEED)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = train_tokenizer(texts)
        tokenizer.save(str(tmp / "tokenizer.json"))  # type: ignore[attr-defined]
        # the served pre-processing makes the training inputs, so training and serving agree
        tokenize = Tokenize(TokenizeParams(tokenizer=str(tmp / "tokenizer.json"), max_length=MAX_LENGTH))
        encoded = tokenize.process(Batch({"text": np.array([t.encode() for t in texts], dtype=object)},
                                         [len(texts)], ["train"])).outputs
        input_ids, mask = torch.from_numpy(encoded["input_ids"]), torch.from_numpy(encoded["attention_mask"])
        y = torch.tensor(labels)
        config = transformers.BertConfig(
            vocab_size=tokenize.tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, max_position_embeddings=MAX_LENGTH,
            pad_token_id=tokenize.pad_id, num_labels=len(CLASSES),
            id2label=dict(enumerate(CLASSES)), label2id={c: i for i, c in enumerate(CLASSES)})
        torch.manual_seed(SEED)
        model = transformers.BertForSequenceClassification(config)
        optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
        order = torch.Generator().manual_seed(SEED)
        model.train()
        for _ in range(EPOCHS):
            for rows in torch.randperm(len(y), generator=order).split(32):
                optimiser.zero_grad()
                model(input_ids=input_ids[rows], attention_mask=mask[rows], labels=y[rows]).loss.backward()
                optimiser.step()
        model.eval()
        model.save_pretrained(str(tmp), safe_serialization=True)
        _publish(tmp, path)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _publish(tmp: Path, path: Path) -> None:
    """Move the finished directory into place; readers never see half of one. Two processes training at
    once make the same model: the first rename wins and the other's copy is dropped."""
    try:
        os.rename(tmp, path)
    except OSError:
        if not (path / "config.json").exists():
            raise


def ensure_model() -> Path:
    """The cached model directory, training it first (in a child process) when it is missing (``model_from``)."""
    path = model_dir()
    if not (path / "config.json").exists():
        train_in_child(__name__)
    return path


def ensure_tokenizer() -> Path:
    """The cached model's tokenizer.json, training the model first when it is missing (``tokenizer_from``)."""
    return ensure_model() / "tokenizer.json"


def sample(n: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """``n`` single-sentence requests ``{"text": BYTES [1]}`` (held-out sentences) and their topic indices."""
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    texts, labels = corpus(n, TEST_SEED * 1000 + seed)
    return [{"text": np.array([t.encode()], dtype=object)} for t in texts], labels


if __name__ == "__main__":  # ensure_model runs this in a child process: python -m flowserve_components.text_model
    train()
