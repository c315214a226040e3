"""Train a demo topology's model in a child process, so that loading the topology never imports torch.

A topology whose model is trained on first use (``model_from: flowserve_components.image_model:ensure_model``)
is loaded by the CLI, the gateway and every worker; only the first load finds the model missing. Training
there would leave torch, its threads and its memory in a process that never runs the model (and
``tests/components/test_component_topologies.py`` holds every topology to loading without torch), so the
module's ``train()`` runs as ``python -m MODULE`` instead, and the loader waits for it.
"""

from __future__ import annotations

import subprocess
import sys

from flowserve.errors import ComponentError

#: seconds a first-use training may take before the load gives up (they take seconds to a minute)
TRAIN_TIMEOUT_S = 600


def train_in_child(module: str) -> None:
    """Run ``python -m module`` (whose ``__main__`` trains and saves the model); raise saying why it failed."""
    try:
        proc = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,  # noqa: S603
                              timeout=TRAIN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ComponentError(f"training the model of {module} took more than {TRAIN_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise ComponentError(f"training the model of {module} failed (exit {proc.returncode}): {tail}")
