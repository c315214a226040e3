"""Tokenize (a local tokenizer.json -> ids and mask, padded per batch) and HfModel (a local transformers
directory, safetensors only) against tokenizers and transformers run directly; text-classifier.yaml's nodes."""

from __future__ import annotations

import doctest
import pickle
from pathlib import Path

import numpy as np
import pytest

from flowserve.component import Batch, Port, Result
from flowserve.errors import ComponentError
from flowserve.topology import load_topology
from flowserve_components import hf, text, text_model
from flowserve_components.hf import HfModel
from flowserve_components.postprocess import Classify, softmax
from flowserve_components.text import Tokenize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    text_model.train_tokenizer(text_model.corpus(200, seed=0)[0]).save(str(path))  # type: ignore[attr-defined]
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_file: Path) -> Path:
    """A tiny random BERT (no training) with the tokenizer, saved as save_pretrained does (safetensors)."""
    from tokenizers import Tokenizer

    path = tmp_path_factory.mktemp("bert")
    vocab = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size()
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(str(path), safe_serialization=True)
    (path / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    return path


def texts(n: int, seed: int) -> np.ndarray:
    return np.array([t.encode() for t in text_model.corpus(n, seed)[0]], dtype=object)


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_tokenize_equals_tokenizers_run_directly(tokenizer_file: Path, rows: int) -> None:
    from tokenizers import Tokenizer

    node = Tokenize.configure({"tokenizer": str(tokenizer_file), "max_length": 12})
    assert node.outputs == {"input_ids": Port("INT64", [-1, -1]), "attention_mask": Port("INT64", [-1, -1])}
    batch = texts(rows, seed=rows)
    out = node.process(Batch({"text": batch}, [rows], ["r"]))
    assert isinstance(out, Result) and not out.errors
    direct = Tokenizer.from_file(str(tokenizer_file))  # padding to the longest as saved; truncation added here
    direct.enable_truncation(12)
    want = direct.encode_batch([t.decode() for t in batch])
    longest = max(len(e.ids) for e in want)
    assert out.outputs["input_ids"].shape == (rows, longest) and longest <= 12
    np.testing.assert_array_equal(out.outputs["input_ids"], [e.ids for e in want])
    np.testing.assert_array_equal(out.outputs["attention_mask"], [e.attention_mask for e in want])


def test_tokenize_padding_choices_and_bad_text(tokenizer_file: Path) -> None:
    batch = Batch({"text": np.array([b"the striker scored", b"\xff\xfe bad", b"rain"], dtype=object)}, [1, 2],
                  ["a", "b"])
    fixed = Tokenize.configure({"tokenizer": str(tokenizer_file), "max_length": 10, "padding": "max_length",
                                "type_ids": True}, node="tok")
    out = fixed.process(batch)
    assert isinstance(out, Result)
    assert out.outputs["input_ids"].shape == (3, 10) and out.outputs["token_type_ids"].shape == (3, 10)
    assert out.errors == {1: "node 'tok': text 0 is not UTF-8 (invalid start byte at byte 0)"}  # 1st of request b
    pad = fixed.tokenizer.token_to_id("[PAD]")
    assert (out.outputs["input_ids"][2, 3:] == pad).all() and out.outputs["attention_mask"][2].sum() == 3
    multiple = Tokenize.configure({"tokenizer": str(tokenizer_file), "pad_to_multiple_of": 8})
    assert multiple.process(batch).outputs["input_ids"].shape == (3, 8)


def test_tokenizer_files_that_are_not_tokenizers_fail_at_load(tmp_path: Path, tokenizer_file: Path) -> None:
    with pytest.raises(ComponentError, match=r"tokenizer .*missing\.json: no such file"):
        Tokenize.configure({"tokenizer": str(tmp_path / "missing.json")})
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ComponentError, match=r"vocab\.pkl: is a pickle .*refused"):
        Tokenize.configure({"tokenizer": str(tmp_path / "vocab.pkl")})
    (tmp_path / "vocab.txt").write_text("[PAD]\nhello\n")
    with pytest.raises(ComponentError, match=r"vocab\.txt: is not a tokenizer\.json file \(not JSON\)"):
        Tokenize.configure({"tokenizer": str(tmp_path / "vocab.txt")})
    (tmp_path / "other.json").write_text('{"model": 1}')
    with pytest.raises(ComponentError, match="not a tokenizer the 'tokenizers' library reads"):
        Tokenize.configure({"tokenizer": str(tmp_path / "other.json")})
    with pytest.raises(ComponentError, match="has no token '<nope>' \\(pad_token\\)"):
        Tokenize.configure({"tokenizer": str(tokenizer_file), "pad_token": "<nope>"})
    with pytest.raises(ComponentError, match="give either 'tokenizer'"):
        Tokenize.configure({})


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_sequence_classification_equals_transformers_run_directly(bert_dir: Path, rows: int) -> None:
    tokenize = Tokenize.configure({"tokenizer": str(bert_dir)})  # a directory: its tokenizer.json
    node = HfModel.configure({"model": str(bert_dir), "task": "sequence-classification"})
    assert node.inputs == {"input_ids": Port("INT64", [-1, -1]), "attention_mask": Port("INT64", [-1, -1])}
    assert node.outputs == {"logits": Port("FP32", [-1, 3])}
    node.setup()
    ids = tokenize.process(Batch({"text": texts(rows, seed=rows)}, [rows], ["r"])).outputs
    out = node.process(Batch(dict(ids), [rows], ["r"]))
    assert isinstance(out, Result) and not out.errors
    logits = out.outputs["logits"]
    model = transformers.BertForSequenceClassification.from_pretrained(str(bert_dir)).eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids["input_ids"]),
                     attention_mask=torch.from_numpy(ids["attention_mask"])).logits.numpy()
    np.testing.assert_allclose(logits, want, atol=1e-5, rtol=0)
    assert node.describe().endswith(f"weights=sha256:{node.weights_hash})")


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_embeddings_equal_mean_pooled_hidden_states(bert_dir: Path, rows: int) -> None:
    tokenize = Tokenize.configure({"tokenizer": str(bert_dir)})
    node = HfModel.configure({"model": str(bert_dir), "task": "embeddings", "normalize": True})
    assert node.outputs == {"embedding": Port("FP32", [-1, 16])}
    node.setup()
    ids = tokenize.process(Batch({"text": texts(rows, seed=50 + rows)}, [rows], ["r"])).outputs
    got = node.process(Batch(dict(ids), [rows], ["r"])).outputs["embedding"]
    model = transformers.AutoModel.from_pretrained(str(bert_dir)).eval()
    with torch.no_grad():
        hidden = model(input_ids=torch.from_numpy(ids["input_ids"]),
                       attention_mask=torch.from_numpy(ids["attention_mask"])).last_hidden_state.numpy()
    mask = ids["attention_mask"][..., None]
    want = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
    np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-5, rtol=0)


def test_rows_the_model_cannot_take_fail_alone(bert_dir: Path) -> None:
    node = HfModel.configure({"model": str(bert_dir), "task": "sequence-classification"}, node="model")
    node.setup()
    vocab = node.vocab
    ids = np.zeros((3, 70), np.int64)
    mask = np.zeros((3, 70), np.int64)
    ids[:, :5], mask[:, :5] = 7, 1
    ids[1, 2] = vocab + 3
    mask[2, :] = 1  # 70 tokens; the model has 64 positions
    out = node.process(Batch({"input_ids": ids, "attention_mask": mask}, [1, 1, 1], ["a", "b", "c"]))
    assert isinstance(out, Result)
    assert out.errors == {
        1: f"node 'model': token id {vocab + 3} is outside the model's vocabulary (0 to {vocab - 1}): was the text "
           "tokenized with this model's tokenizer?",
        2: "node 'model': 70 tokens, more than the model's 64 positions: give the tokenizer max_length 64"}
    alone = node.process(Batch({"input_ids": ids[:1, :5], "attention_mask": mask[:1, :5]}, [1], ["a"]))
    np.testing.assert_allclose(out.outputs["logits"][0], alone.outputs["logits"][0], atol=1e-5, rtol=0)


def test_pickle_weights_are_refused_with_why(tmp_path: Path, bert_dir: Path) -> None:
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_bytes((bert_dir / "config.json").read_bytes())
    model = transformers.BertForSequenceClassification.from_pretrained(str(bert_dir))
    torch.save(model.state_dict(), legacy / "pytorch_model.bin")
    with pytest.raises(ComponentError, match=r"legacy: holds its weights only as pickles \(pytorch_model\.bin\); "
                       r"loading a pickle runs whatever code it names, so it is refused: re-save it as safetensors"):
        HfModel.configure({"model": str(legacy), "task": "sequence-classification"})
    # beside safetensors weights a pickle is never read (use_safetensors=True)
    both = tmp_path / "both"
    both.mkdir()
    for name in ("config.json", "model.safetensors"):
        (both / name).write_bytes((bert_dir / name).read_bytes())
    (both / "pytorch_model.bin").write_bytes(b"\x80\x04 a pickle that would fail if it were read")
    HfModel.configure({"model": str(both), "task": "sequence-classification"}).setup()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ComponentError, match="empty: has no config.json"):
        HfModel.configure({"model": str(tmp_path / "empty"), "task": "embeddings"})
    (both / "model.safetensors").write_bytes(b"\x80\x04 not safetensors at all")
    with pytest.raises(ComponentError, match="model.safetensors: is not a safetensors file"):
        HfModel.configure({"model": str(both), "task": "embeddings"})


def test_text_classifier_trains_once_and_its_nodes_classify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWSERVE_CACHE", str(tmp_path))
    topology = load_topology(REPO / "topologies" / "text-classifier.yaml")  # trains into the empty cache
    directory = text_model.model_dir()
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    assert text_model.ensure_model() == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp  # cached: not trained again
    nodes = {n: topology.spec.nodes[n] for n in ("tokenize", "model", "post")}
    tokenize = Tokenize.configure(nodes["tokenize"].params)
    model = HfModel.configure(nodes["model"].params)
    post = Classify.configure(nodes["post"].params)
    model.setup()
    requests, labels = text_model.sample(64, seed=3)
    batch = np.array([r["text"][0] for r in requests], dtype=object)
    ids = tokenize.process(Batch({"text": batch}, [64], ["r"])).outputs
    logits = model.process(Batch(dict(ids), [64], ["r"])).outputs["logits"]
    out = post.process(Batch({"logits": logits}, [64], ["r"]))
    direct = transformers.AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        want = direct(**{k: torch.from_numpy(v) for k, v in ids.items()}).logits.numpy()
    np.testing.assert_array_equal(out["label"], want.argmax(axis=1))
    np.testing.assert_allclose(out["probs"], softmax(want), atol=1e-5, rtol=0)
    assert float((out["label"] == np.array(labels)).mean()) >= 0.9


def test_docstring_examples_run() -> None:
    for module in (text, hf):
        assert doctest.testmod(module).failed == 0, module.__name__
