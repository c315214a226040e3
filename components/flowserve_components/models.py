"""A tiny model zoo for the digits data: built, trained and cached locally, never downloaded.

===================  ==============================================  =========================
name                 architecture                                    role
===================  ==============================================  =========================
``digits-mlp``       64 -> 128 -> 10                                 the default classifier
``digits-mlp-small`` 64 -> 32 -> 10                                  fast first stage (cascade)
``digits-cnn``       3 convs (32, 64, 128 ch) + 2048-wide dense      costly per call; batch it
===================  ==============================================  =========================

Every model takes ``x`` (float32 [n, 64], pixels / 16) and returns logits (float32 [n, 10]).
Weights live under ``cache_dir() / "models"``; :func:`load` trains a missing model first, and several
worker processes doing so at once train it only once::

    path, accuracy = train("digits-mlp")     # also prints the held-out accuracy
    model = load("digits-mlp", "cpu")

torch is imported inside the functions only: importing this module must stay cheap for the CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flowserve.errors import ComponentError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Recipe:
    """How to train one zoo model (Adam, one-cycle schedule), sized to take seconds on two CPU cores."""

    epochs: int
    lr: float  # peak of the one-cycle schedule
    batch_size: int = 64
    #: Train on several threads when cores are idle. Only worth it where each op has real work.
    parallel: bool = False


ZOO: dict[str, Recipe] = {
    "digits-mlp": Recipe(epochs=30, lr=5e-3),
    "digits-mlp-small": Recipe(epochs=30, lr=1e-2),
    "digits-cnn": Recipe(epochs=6, lr=4e-3, batch_size=128, parallel=True),
}

#: Hidden width of the CNN's dense layer. Its 4M weights (16 MB) are streamed from memory once per
#: call whatever the batch size, so a call of one row costs about a millisecond and batching pays.
CNN_HIDDEN = 2048


def cache_dir() -> Path:
    """``$FLOWSERVE_CACHE``, else ``~/.cache/flowserve``."""
    env = os.environ.get("FLOWSERVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "flowserve"


def model_path(name: str) -> Path:
    """Where the trained state dict of zoo model ``name`` is cached."""
    _check_name(name)
    return cache_dir() / "models" / f"{name}.pt"


def _check_name(name: str) -> None:
    if name not in ZOO:
        raise ComponentError(f"unknown model '{name}'; the zoo has {', '.join(ZOO)}")


def build(name: str) -> torch.nn.Module:
    """A freshly initialised (untrained) zoo model; seed torch first for reproducible weights."""
    from torch import nn

    _check_name(name)
    if name == "digits-mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "digits-mlp-small":
        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),  # 8x8
        nn.Conv2d(32, 64, 3), nn.BatchNorm2d(64), nn.ReLU(),  # 6x6
        nn.Conv2d(64, 128, 3), nn.BatchNorm2d(128), nn.ReLU(),  # 4x4
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(128 * 4 * 4, CNN_HIDDEN), nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(CNN_HIDDEN, 10),
    )


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    # Worker processes pin torch to few threads; training borrows more and gives them back.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _training_threads(recipe: Recipe) -> int:
    if not recipe.parallel:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    # On busy cores, torch's threads wait on each other at every op and training slows tenfold or
    # worse (seen with other workers running), so use only the cores that are idle.
    spare = cores - os.getloadavg()[0]
    return max(1, min(int(spare), 4))  # the model is too small to gain from more


def _as_tensors(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    import numpy as np
    import torch

    from flowserve_components.digits import PIXEL_MAX, load_split

    x, y = load_split("train" if split == "train" else "test")
    return torch.from_numpy(np.array(x) / np.float32(PIXEL_MAX)), torch.from_numpy(np.array(y))


def accuracy(model: torch.nn.Module, device: str = "cpu") -> float:
    """Held-out (test split) accuracy of ``model``."""
    import torch

    x, y = _as_tensors("test")
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        predicted = model(x.to(device)).argmax(dim=1).cpu()
    model.train(was_training)
    return float((predicted == y).float().mean())


def _save_atomic(state: dict[str, torch.Tensor], path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    # Readers must never see half a file: write beside the target, flush to disk, rename over it.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def train(name: str, *, epochs: int | None = None, seed: int = 0, quiet: bool = False) -> tuple[Path, float]:
    """Train zoo model ``name`` on the digits train split, cache it, return (path, held-out accuracy)."""
    import torch

    _check_name(name)
    recipe = ZOO[name]
    started = time.perf_counter()
    with _torch_threads(_training_threads(recipe)):
        torch.manual_seed(seed)
        model = build(name)
        x, y = _as_tensors("train")
        shuffle = torch.Generator().manual_seed(seed)
        n_epochs = recipe.epochs if epochs is None else epochs
        optimiser = torch.optim.Adam(model.parameters(), lr=recipe.lr)
        # One-cycle reaches good accuracy in a handful of epochs, which keeps first use short.
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimiser, max_lr=recipe.lr, total_steps=max(1, n_epochs * -(-len(x) // recipe.batch_size))
        )
        loss_fn = torch.nn.CrossEntropyLoss()
        model.train()
        for _ in range(n_epochs):
            order = torch.randperm(len(x), generator=shuffle)
            for start in range(0, len(x), recipe.batch_size):
                idx = order[start : start + recipe.batch_size]
                optimiser.zero_grad()
                loss_fn(model(x[idx]), y[idx]).backward()
                optimiser.step()
                schedule.step()
        held_out = accuracy(model)
    path = model_path(name)
    _save_atomic(model.state_dict(), path)
    if not quiet:
        print(f"trained {name} in {time.perf_counter() - started:.1f}s: held-out accuracy {held_out:.4f} -> {path}")
    return path, held_out


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def ensure(name: str) -> Path:
    """The cached weights of zoo model ``name``, training them first when missing.

    Processes that start together wait on a lock file, so the model is trained once.
    """
    path = model_path(name)
    if path.exists():
        return path
    with _file_lock(path.with_suffix(".lock")):
        if not path.exists():  # another process may have trained it while we waited
            train(name)
    return path



def _is_torchscript(data: bytes) -> bool:
    # torch.save archives and TorchScript archives are both zip files; only TorchScript has constants.pkl.
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return any(n.rsplit("/", 1)[-1] == "constants.pkl" for n in archive.namelist())
    except zipfile.BadZipFile:
        return False


def load_with_hash(name: str | None, device: str, path: str | Path | None = None) -> tuple[torch.nn.Module, str]:
    """Like :func:`load`, also returning the sha256 of the exact bytes the weights were read from."""
    import torch

    if path is None:
        if name is None:
            raise ComponentError("name a zoo model or give a weights path")
        source = ensure(name)
    else:
        source = Path(path)
    try:
        data = source.read_bytes()  # hash and load one read, so the hash names what was loaded
    except OSError as exc:
        raise ComponentError(f"cannot read weights '{source}': {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if _is_torchscript(data):
        with warnings.catch_warnings():
            # Loading TorchScript is deprecated upstream but still how many users ship models.
            warnings.simplefilter("ignore", FutureWarning)
            model: torch.nn.Module = torch.jit.load(io.BytesIO(data), map_location=device)
        return model.eval(), digest
    if name is None:
        raise ComponentError(f"'{source}' is a state dict; name the zoo architecture it fits with 'model'")
    try:
        state = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    except Exception as exc:
        raise ComponentError(f"cannot load weights '{source}' (only plain tensors are accepted): {exc}") from None
    model = build(name)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise ComponentError(f"weights '{source}' do not fit model '{name}': {exc}") from None
    return model.to(device).eval(), digest


def load_state(name: str, data: bytes, device: str = "cpu") -> torch.nn.Module:
    """Zoo architecture ``name`` with the state dict in ``data`` (a registered version's weights), in eval
    mode. Read with ``weights_only=True``: a blob holding anything but tensors is refused, not executed."""
    import torch

    try:
        state = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    except Exception as exc:
        raise ComponentError(f"cannot load these weights (only plain tensors are accepted): {exc}") from None
    model = build(name)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise ComponentError(f"these weights do not fit model '{name}': {exc}") from None
    return model.to(device).eval()


def fine_tune(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 30, lr: float = 2e-3,
              batch_size: int = 32, seed: int = 0) -> tuple[bytes, dict[str, float]]:
    """Fine-tune a copy of ``model`` (the live weights stay untouched) on ``x``/``y`` with Adam; return its
    state dict as ``torch.save`` bytes and what training measured (loss and accuracy on ``x`` before and
    after). A small learning rate and the live weights as the start keep what the model knew."""
    import copy

    import torch

    tuned = copy.deepcopy(model).cpu()
    loss_fn = torch.nn.CrossEntropyLoss()

    def measure() -> tuple[float, float]:
        tuned.eval()
        with torch.inference_mode():
            logits = tuned(x)
            return float(loss_fn(logits, y)), float((logits.argmax(dim=1) == y).float().mean())

    loss0, acc0 = measure()
    with _torch_threads(1):
        torch.manual_seed(seed)
        shuffle = torch.Generator().manual_seed(seed)
        optimiser = torch.optim.Adam(tuned.parameters(), lr=lr)
        tuned.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=shuffle)
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                optimiser.zero_grad()
                loss_fn(tuned(x[idx]), y[idx]).backward()
                optimiser.step()
    loss1, acc1 = measure()
    buffer = io.BytesIO()
    torch.save(tuned.state_dict(), buffer)
    return buffer.getvalue(), {"examples": float(len(x)), "epochs": float(epochs), "loss_before": loss0,
                               "loss_after": loss1, "fit_accuracy_before": acc0, "fit_accuracy_after": acc1}


def load(name: str | None, device: str = "cpu", path: str | Path | None = None) -> torch.nn.Module:
    """Zoo model ``name`` with its cached weights (trained first if missing), in eval mode on ``device``.

    ``path`` loads user weights instead: a TorchScript file, or a state dict for architecture ``name``
    (read with ``weights_only=True``, so a file holding arbitrary objects is refused, not executed).
    """
    return load_with_hash(name, device, path)[0]


def train_all(names: Sequence[str] | None = None, *, force: bool = False) -> dict[str, tuple[Path, float]]:
    """Train (or, when cached and not ``force``, re-evaluate) zoo models; print held-out accuracies."""
    results: dict[str, tuple[Path, float]] = {}
    for name in names or list(ZOO):
        _check_name(name)
        path = model_path(name)
        if force or not path.exists():
            with _file_lock(path.with_suffix(".lock")):
                results[name] = train(name)
        else:
            held_out = accuracy(load(name))
            print(f"{name}: held-out accuracy {held_out:.4f} (cached, {path})")
            results[name] = (path, held_out)
    sys.stdout.flush()
    return results
