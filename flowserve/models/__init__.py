"""Many models on a few accelerators (Clockwork): the catalogue, device memory, the predictive scheduler,
placement over workers and a discrete-event simulation to drive them (docs/models.md).

Pure and deterministic: nothing here reads a clock or a broker, so a worker's hook and the simulation drive
the same code.
"""

from __future__ import annotations

from flowserve.models.baseline import LruServer
from flowserve.models.capabilities import ServesModels
from flowserve.models.catalogue import BANDWIDTH, Catalogue, ModelSpec
from flowserve.models.memory import DeviceMemory, Predictor
from flowserve.models.placement import Placement, partition_of
from flowserve.models.routing import ModelRouter, PlacementChange
from flowserve.models.scheduler import Action, ActionKind, Scheduler, Step
from flowserve.models.simulate import Outcome, Policy, Workload, jitter_margin, poisson_zipf, run, zipf
from flowserve.models.stage import ModelHooks, model_hooks

__all__ = ["BANDWIDTH", "Action", "ActionKind", "Catalogue", "DeviceMemory", "LruServer", "ModelHooks", "ModelRouter",
           "ModelSpec", "Outcome", "Placement", "PlacementChange", "Policy", "Predictor", "Scheduler", "ServesModels",
           "Step", "Workload", "jitter_margin", "model_hooks", "partition_of", "poisson_zipf", "run", "zipf"]
