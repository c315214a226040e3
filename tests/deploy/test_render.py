"""`flowserve deploy render`: golden outputs for a chain (digits) and a fan-in (ensemble), and every
rendered object valid against its schema: Kubernetes' own (kubernetes-validate), the Strimzi and KEDA
CRDs' OpenAPI schemas and the Compose specification (vendored under schemas/, see its README)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from flowserve.cli import main
from flowserve.deploy import NodePlan, Plan, render
from flowserve.deploy.keda import DEFAULT_LAG_THRESHOLD
from flowserve.errors import FlowserveError
from flowserve.topology import load_topology

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parent
SCHEMAS = HERE / "schemas"
GOLDEN = HERE / "golden"
K8S_VERSION = "1.33"
CRDS = {("kafka.strimzi.io/v1", "Kafka"): "strimzi-kafka.yaml",
        ("kafka.strimzi.io/v1", "KafkaNodePool"): "strimzi-kafkanodepool.yaml",
        ("kafka.strimzi.io/v1", "KafkaTopic"): "strimzi-kafkatopic.yaml",
        ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml"}
CASES = [(name, target) for name in ("digits", "ensemble") for target in ("k8s", "compose")]


@cache
def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / CRDS[api_version, kind]).read_text())
    version = api_version.rsplit("/", 1)[1]
    [schema] = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version]
    return schema


def validate_k8s(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        jsonschema.Draft7Validator(_crd_schema(*key)).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def validate_compose(doc: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(json.loads((SCHEMAS / "compose-spec.json").read_text())).validate(doc)


def _render(name: str, target: str) -> dict[str, str]:
    return render(load_topology(ROOT / "topologies" / f"{name}.yaml"), target=target)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "target"), CASES)
def test_rendered_files_match_the_golden_ones(name: str, target: str) -> None:
    """Regenerate after an intended change: flowserve deploy render topologies/NAME.yaml -o
    tests/deploy/golden/NAME --target TARGET (then review the diff)."""
    for file, text in _render(name, target).items():
        if file.startswith("Dockerfile"):
            continue  # templates, copied verbatim
        assert text == (GOLDEN / name / file).read_text(), f"{name}/{file} differs from its golden copy"


@pytest.mark.parametrize("name", ["digits", "ensemble"])
def test_every_kubernetes_object_is_valid(name: str) -> None:
    objs = list(yaml.safe_load_all(_render(name, "k8s")["k8s.yaml"]))
    topology = load_topology(ROOT / "topologies" / f"{name}.yaml")
    kinds = [o["kind"] for o in objs]
    assert kinds.count("Deployment") == len(topology.nodes) + 1  # one per node and the gateway
    assert kinds.count("ScaledObject") == len(topology.nodes)
    assert kinds.count("KafkaTopic") == len(topology.topics()) + 1  # and the control topic
    for obj in objs:
        validate_k8s(obj)


@pytest.mark.parametrize("name", ["digits", "ensemble"])
def test_the_compose_file_is_valid(name: str) -> None:
    doc = yaml.safe_load(_render(name, "compose")["compose.yaml"])
    validate_compose(doc)
    assert {"kafka-1", "kafka-2", "kafka-3", "gateway", "otel-collector", "topics"} <= set(doc["services"])


def test_validation_catches_a_broken_object() -> None:
    objs = list(yaml.safe_load_all(_render("digits", "k8s")["k8s.yaml"]))
    topic = next(o for o in objs if o["kind"] == "KafkaTopic")
    topic["spec"]["partitions"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s(topic)
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(deployment)
    compose = yaml.safe_load(_render("digits", "compose")["compose.yaml"])
    compose["services"]["gateway"]["restart"] = ["always"]
    with pytest.raises(jsonschema.ValidationError):
        validate_compose(compose)


def test_a_plan_sets_replicas_partitions_and_gpus() -> None:
    topology = load_topology(ROOT / "topologies" / "digits.yaml")
    plan = Plan(partitions=8, image="reg.example/fs:1", nodes={"model": NodePlan(replicas=2, gpu=1, cpu="2")})
    objs = list(yaml.safe_load_all(render(topology, plan=plan)["k8s.yaml"]))
    model = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "flowserve-digits-model")
    container = model["spec"]["template"]["spec"]["containers"][0]
    assert model["spec"]["replicas"] == 2
    assert container["image"] == "reg.example/fs:1-cuda"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert {o["spec"]["partitions"] for o in objs if o["kind"] == "KafkaTopic"} == {1, 8}
    assert next(o for o in objs if o["kind"] == "ScaledObject")["spec"]["maxReplicaCount"] == 8
    for obj in objs:
        validate_k8s(obj)


def test_a_plan_with_throughputs_and_an_slo_derives_each_lag_threshold() -> None:
    """lagThreshold: what one consumer drains within its share of the SLO (flowserve.deploy.keda); the default
    where the plan gives no throughput."""
    topology = load_topology(ROOT / "topologies" / "digits.yaml")  # pre -> model -> post: 3 stages
    plan = Plan(slo_ms=300, nodes={"model": NodePlan(replicas=2, throughput=250.0)})
    objs = list(yaml.safe_load_all(render(topology, plan=plan)["k8s.yaml"]))
    scaled = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "ScaledObject"}
    model = scaled["flowserve-digits-model"]
    assert model["minReplicaCount"] == 2
    assert [t["metadata"]["lagThreshold"] for t in model["triggers"]] == ["25"]  # 250/s x 0.1 s
    assert scaled["flowserve-digits-pre"]["triggers"][0]["metadata"]["lagThreshold"] == str(DEFAULT_LAG_THRESHOLD)
    for obj in objs:
        validate_k8s(obj)
    with pytest.raises(FlowserveError, match="slo_ms"):
        render(topology, plan=Plan(nodes={"model": NodePlan(throughput=250.0)}))


def test_the_command_writes_the_files(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("partitions: 4\nnodes:\n  post: {replicas: 3}\n")
    assert main(["deploy", "render", str(ROOT / "topologies" / "digits.yaml"), "-o", str(tmp_path / "out"),
                 "--plan", str(plan), "--target", "compose"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "Dockerfile", "Dockerfile.cuda", "compose.yaml", "otel-collector.yaml"]
    doc = yaml.safe_load((tmp_path / "out" / "compose.yaml").read_text())
    assert doc["services"]["post"]["deploy"]["replicas"] == 3
    plan.write_text("nodes:\n  nope: {replicas: 3}\n")
    assert main(["deploy", "render", str(ROOT / "topologies" / "digits.yaml"), "-o", str(tmp_path / "x"),
                 "--plan", str(plan)]) == 2


def test_the_checked_in_digits_deployment_is_the_rendered_one() -> None:
    """deploy/digits/ replaces hand-written manifests: it must stay what the renderer writes."""
    for target in ("k8s", "compose"):
        for file, text in _render("digits", target).items():
            assert text == (ROOT / "deploy" / "digits" / file).read_text(), f"deploy/digits/{file} is stale"
