from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from flowserve.errors import ComponentError
from flowserve_components import models
from flowserve_components.digits import load_split

REPO = Path(__file__).resolve().parents[2]
MIN_ACCURACY = {"digits-mlp": 0.95, "digits-mlp-small": 0.93, "digits-cnn": 0.97}


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_importing_the_library_does_not_import_torch() -> None:
    code = (
        "import sys, flowserve.builtin, flowserve_components, flowserve_components.models, "
        "flowserve_components.torch_stage, flowserve_components.digits, flowserve_components.postprocess, "
        "flowserve_components.routing, flowserve_components.ensemble\n"
        "heavy = sorted(m for m in ('torch', 'sklearn') if m in sys.modules)\n"
        "assert not heavy, heavy"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", list(models.ZOO))
def test_trained_accuracy(trained: tuple[Path, dict[str, float]], name: str) -> None:
    assert trained[1][name] >= MIN_ACCURACY[name]


@pytest.mark.parametrize("name", list(models.ZOO))
def test_load_cached_model(model_cache: Path, trained: tuple[Path, dict[str, float]], name: str) -> None:
    import torch

    path = models.model_path(name)
    assert path == model_cache / "models" / f"{name}.pt"
    model = models.load(name, "cpu")
    assert not model.training
    x, y = load_split("test")
    with torch.inference_mode():
        logits = model(torch.from_numpy(np.array(x) / 16))
    assert logits.shape == (450, 10) and logits.dtype == torch.float32
    assert float((logits.argmax(dim=1).numpy() == y).mean()) == pytest.approx(trained[1][name])
    assert models.accuracy(model) == pytest.approx(trained[1][name])


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOWSERVE_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FLOWSERVE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert models.cache_dir() == tmp_path / ".cache" / "flowserve"
    assert models.model_path("digits-mlp") == tmp_path / ".cache" / "flowserve" / "models" / "digits-mlp.pt"


def test_unknown_model() -> None:
    with pytest.raises(ComponentError, match="unknown model 'resnet'; the zoo has digits-mlp, digits-mlp-small"):
        models.build("resnet")
    with pytest.raises(ComponentError, match="unknown model"):
        models.train_all(["resnet"])


def test_training_is_deterministic_and_leaves_no_temp_files(empty_cache: Path) -> None:
    import torch

    threads = torch.get_num_threads()
    path, accuracy = models.train("digits-mlp-small", quiet=True)
    first = path.read_bytes()
    state = torch.load(path, weights_only=True)
    _, again = models.train("digits-mlp-small", quiet=True)
    assert again == accuracy
    for key, tensor in torch.load(path, weights_only=True).items():
        assert torch.equal(tensor, state[key]), key
    assert len(first) > 0
    assert sorted(p.name for p in path.parent.iterdir()) == ["digits-mlp-small.pt"]
    assert torch.get_num_threads() == threads  # training borrows threads and gives them back


def test_train_prints_accuracy(empty_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, accuracy = models.train("digits-mlp-small", epochs=2)
    out = capsys.readouterr().out
    assert "trained digits-mlp-small in " in out
    assert f"held-out accuracy {accuracy:.4f} -> {path}" in out


def test_train_all_reports_cached_models(model_cache: Path, trained, capsys: pytest.CaptureFixture[str]) -> None:
    results = models.train_all()
    out = capsys.readouterr().out.splitlines()
    assert list(results) == list(models.ZOO)
    for line, (name, (path, accuracy)) in zip(out, results.items(), strict=True):
        assert path == model_cache / "models" / f"{name}.pt"
        assert accuracy == pytest.approx(trained[1][name])
        assert line == f"{name}: held-out accuracy {accuracy:.4f} (cached, {path})"


def test_load_trains_a_missing_model_once_across_processes(empty_cache: Path) -> None:
    code = (
        "import hashlib\n"
        "from flowserve_components import models\n"
        "model, digest = models.load_with_hash('digits-mlp-small', 'cpu')\n"
        "print('hash', digest)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLOWSERVE_CACHE": str(empty_cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    stdout = "".join(out for out, _ in outputs)
    assert stdout.count("trained digits-mlp-small") == 1
    saved = empty_cache / "models" / "digits-mlp-small.pt"
    digest = hashlib.sha256(saved.read_bytes()).hexdigest()
    assert stdout.count(f"hash {digest}") == 3
    assert not [p for p in saved.parent.iterdir() if p.name.endswith(".tmp")]


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.touch, (Path(self.marker),))


def test_weights_only_refuses_pickled_code(tmp_path: Path) -> None:
    import torch

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"0.weight": _Payload(str(marker))}, evil)
    with pytest.raises(ComponentError, match=f"cannot load weights '{evil}' \\(only plain tensors"):
        models.load("digits-mlp", "cpu", path=evil)
    assert not marker.exists()


def test_user_state_dict(model_cache: Path, tmp_path: Path) -> None:
    import torch

    user = tmp_path / "mine.pt"
    torch.save(models.load("digits-mlp", "cpu").state_dict(), user)
    model, digest = models.load_with_hash("digits-mlp", "cpu", user)
    assert digest == hashlib.sha256(user.read_bytes()).hexdigest()
    assert models.accuracy(model) >= MIN_ACCURACY["digits-mlp"]
    with pytest.raises(ComponentError, match=f"weights '{user}' do not fit model 'digits-cnn'"):
        models.load("digits-cnn", "cpu", path=user)
    with pytest.raises(ComponentError, match="is a state dict; name the zoo architecture"):
        models.load(None, "cpu", path=user)
    with pytest.raises(ComponentError, match="cannot read weights"):
        models.load("digits-mlp", "cpu", path=tmp_path / "missing.pt")


def test_user_torchscript(model_cache: Path, tmp_path: Path) -> None:
    import torch

    scripted_path = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream
        torch.jit.script(models.load("digits-cnn", "cpu")).save(str(scripted_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = models.load(None, "cpu", path=scripted_path)
    assert models.accuracy(model) == pytest.approx(models.accuracy(models.load("digits-cnn", "cpu")))
