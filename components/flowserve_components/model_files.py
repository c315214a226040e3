"""What every model runtime does with the file it serves: find it, refuse pickles, hash it, name it in errors.

The runtimes (:mod:`~flowserve_components.torch_program`, :mod:`~flowserve_components.sklearn_model`,
:mod:`~flowserve_components.boosting`) load formats that hold no code: TorchScript and ``torch.export``
archives, safetensors, skops, XGBoost JSON/UBJ and LightGBM text. A pickle runs whatever code it names
while it is read, so a file that is one is refused before any library sees it, with the way to re-save it.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowserve.errors import ComponentError

#: What a port name must look like (it ends up in topic names): flowserve.topology.spec.ID_PATTERN.
PORT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
#: Pickle protocol 2 and later start with 0x80; joblib's uncompressed dumps are pickles too.
PICKLE_MAGIC = b"\x80"
ZIP_MAGIC = b"PK\x03\x04"


class ModelFile:
    """A model file a runtime serves: its path, the kind of model it should hold, and errors naming both.

    >>> ModelFile("models/m.json", "XGBoost model").fail("no trees").args[0]
    'XGBoost model models/m.json: no trees'
    """

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what

    def fail(self, why: str) -> ComponentError:
        return ComponentError(f"{self.what} {self.path}: {why}")

    def head(self, fix: str) -> bytes:
        """The file's first bytes, once it is known to be a readable file that is not a pickle.

        ``fix`` says how to save the model in a format this runtime reads (it ends the pickle refusal).
        """
        if not self.path.is_file():
            problem = "no such file" if not self.path.exists() else "not a file"
            raise self.fail(f"{problem}; give the path of the {self.what} file")
        try:
            with self.path.open("rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise self.fail(f"cannot read it ({exc.strerror})") from None
        if head.startswith(PICKLE_MAGIC) and not is_safetensors(head):
            raise self.fail(f"is a pickle (pickle.dump, joblib.dump or a legacy torch.save); loading one runs "
                            f"whatever code it names, so it is refused: {fix}")
        return head

    def zip_names(self) -> list[str]:
        """Member names of the file as a zip archive, without the archive's top folder ([] if not a zip)."""
        try:
            with zipfile.ZipFile(self.path) as archive:
                return [n.split("/", 1)[-1] for n in archive.namelist()]
        except (zipfile.BadZipFile, OSError):
            return []

    def sha256(self) -> str:
        """sha256 of the file's bytes (recorded in lineage as the weights hash)."""
        digest = hashlib.sha256()
        with self.path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()


def require(module: str, extra: str) -> Any:
    """Import the optional library ``module`` (a runtime's own dependency), saying which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ComponentError(f"this runtime needs {module} ({exc}): pip install 'flowserve-components[{extra}]'"
                             ) from None


def is_safetensors(head: bytes) -> bool:
    """A safetensors file: a little-endian header length (whose first byte may look like a pickle's), then JSON."""
    return len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < (100 << 20)


def is_torch_save(names: list[str]) -> bool:
    """A ``torch.save`` archive: a zip holding a pickle (``data.pkl``) and no TorchScript code."""
    return "data.pkl" in names and "constants.pkl" not in names


def entry_point(ref: str, what: str) -> Callable[..., Any]:
    """The callable ``module:name`` names; a :class:`ComponentError` saying what is wrong otherwise."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ComponentError(f"{what} '{ref}' must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError) as exc:  # TypeError: a relative name such as '.mod'
        raise ComponentError(f"cannot import module '{module_name}' for {what} '{ref}': {exc}") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ComponentError(f"module '{module_name}' has no '{attr}' ({what} '{ref}')")
    if not callable(target):
        raise ComponentError(f"{what} '{ref}' is a {type(target).__name__}, not a callable")
    return target


def one_source(model: str | None, model_from: str | None, what: str = "a path", name: str = "model") -> None:
    """A runtime's params name a file by ``name`` or by ``name_from``, never both or neither."""
    if (model is None) == (model_from is None):
        raise ValueError(f"give either '{name}' ({what}) or '{name}_from' (a function returning one)")


def model_location(model: str | None, model_from: str | None, name: str = "model") -> str:
    """``model``, else what the ``name_from`` function returns (it may create the file first, e.g. train
    into a cache); a :class:`ComponentError` saying what that function raised."""
    if model is not None:
        return model
    param = f"{name}_from"
    try:
        return str(entry_point(model_from or "", param)())
    except ComponentError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code: say what it raised
        raise ComponentError(f"{param} '{model_from}' failed: {type(exc).__name__}: {exc}") from None


def check_port_name(file: ModelFile, kind: str, name: str) -> str:
    if not PORT_NAME.match(name):
        raise file.fail(f"{kind} '{name}' is not a valid port name (it must match {PORT_NAME.pattern})")
    return name
