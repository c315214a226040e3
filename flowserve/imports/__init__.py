"""Import a model repository written for MLServer or Triton: a topology YAML per model, and per ensemble.

>>> report = import_repository("models/", "topologies/imported/")      # doctest: +SKIP
>>> report.written                                                      # doctest: +SKIP
{'iris-sklearn': PosixPath('topologies/imported/iris-sklearn.yaml'), ...}
>>> [str(u) for u in report.unmapped]                                   # doctest: +SKIP
['churn: .../model.joblib: a pickle (.joblib): ... re-save the model with skops.io.dump(...) ...']

Each model becomes a topology of one node (the runtime component that reads its file) named as the
model, so the gateway serves it at the same ``/v2/models/<name>/infer``; a Triton ensemble becomes one
topology whose nodes are its steps. Every topology is loaded back before it is written (its components
built, its model files read), so a file that is written serves. What cannot be mapped is reported with why.
"""

from __future__ import annotations

from pathlib import Path

from flowserve.imports import mlserver, triton
from flowserve.imports.pbtxt import Message, many, one
from flowserve.imports.plan import ImportReport, ModelNode, RepositoryError, Unmapped, finish, probe, single

__all__ = ["ImportReport", "RepositoryError", "Unmapped", "import_repository"]


def import_repository(root: str | Path, out: str | Path, *, names: list[str] | None = None,
                      force: bool = False) -> ImportReport:
    """Write a topology per model (and per Triton ensemble) of the repository at ``root`` into ``out``.

    ``names`` imports only those models (and ensembles; an ensemble's steps are read whatever it says).
    ``force`` overwrites topology files that exist. Raises :class:`RepositoryError` when ``root`` holds
    neither ``model-settings.json`` nor ``config.pbtxt`` files.
    """
    root, out = Path(root), Path(out)
    if not root.is_dir():
        raise RepositoryError(f"{root}: no such directory; give the model repository's folder")
    settings, folders = mlserver.find(root), triton.find(root)
    if not settings and not folders:
        raise RepositoryError(f"{root}: not a model repository: no {mlserver.SETTINGS} (MLServer) below it and no "
                              f"model folder with {triton.CONFIG} (Triton) in it")
    report = ImportReport()
    wanted = set(names or [])

    def selected(name: str) -> bool:
        return not wanted or name in wanted

    mlserver_names: set[str] = set()
    for model in mlserver.iterate(root, report):
        mlserver_names.add(model.name)
        if selected(model.name) and probe(model, report):
            finish(single(model), model.name, out, report, force=force)
    configs = list(triton.iterate(root, report))
    steps = _step_models(configs, wanted)
    models: dict[str, ModelNode] = {}
    for folder, config in configs:
        if triton.is_ensemble(config) or folder.name not in steps:
            continue
        node = triton.read(folder, config, report)
        if node is not None and probe(node, report):
            models[node.name] = node
            if selected(node.name):
                finish(single(node), node.name, out, report, force=force)
    for folder, config in configs:
        if triton.is_ensemble(config) and selected(folder.name):
            topology = triton.ensemble(folder, config, models, report)
            if topology is not None:
                finish(topology, folder.name, out, report, force=force)
    if wanted:  # what was not asked for is not reported on; an ensemble's steps are
        asked = wanted | steps
        report.unmapped = [u for u in report.unmapped if u.model in asked]
        report.notes = [u for u in report.notes if u.model in asked]
        known = {u.model for u in report.unmapped} | set(models) | {f.name for f, _ in configs} | mlserver_names
        for name in sorted(wanted - known):
            report.unmapped.append(Unmapped(name, "--name", f"no model or ensemble of that name in {root}"))
    return report


def _step_models(configs: list[tuple[Path, Message]], wanted: set[str]) -> set[str]:
    """The Triton models to read: those wanted, and every step of a wanted ensemble."""
    names = {folder.name for folder, _ in configs if not wanted or folder.name in wanted}
    for folder, config in configs:
        if triton.is_ensemble(config) and folder.name in names:
            scheduling = one(config, "ensemble_scheduling") or {}
            names |= {str(one(s, "model_name")) for s in many(scheduling, "step")}
    return names
