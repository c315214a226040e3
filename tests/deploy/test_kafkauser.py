"""``flowserve deploy render --auth``: a Strimzi KafkaUser per stage (and the gateway) with the ACLs ``flowserve
acl`` derives, valid against Strimzi's KafkaUser CRD; each stage's Deployment mounts its own user's Secret
and no other; KEDA reads each stage's lag as that stage.

Vendored schemas (tests never download), beside the others under schemas/:
``strimzi-kafkauser.yaml`` is github.com/strimzi/strimzi-kafka-operator
``packaging/install/cluster-operator/044-Crd-kafkauser.yaml`` at 8541da1e336bdcda9647aeacfbc2048e57580a52 (the
commit of the other Strimzi CRDs here); ``keda.sh_triggerauthentications.yaml`` is github.com/kedacore/keda
``config/crd/bases/keda.sh_triggerauthentications.yaml`` at 8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a (that of
the ScaledObject CRD)."""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_render import validate_k8s

from flowserve.cli.deploy import register
from flowserve.deploy import render
from flowserve.deploy.kafkausers import strimzi_acls
from flowserve.errors import FlowserveError
from flowserve.kafka.acls import principal_name, topology_acls
from flowserve.topology import load_topology

ROOT = Path(__file__).parents[2]
SCHEMAS = Path(__file__).parent / "schemas"
EXTRA_CRDS = {("kafka.strimzi.io/v1", "KafkaUser"): "strimzi-kafkauser.yaml",
              ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml"}
AUTHS = ["scram-sha-512", "tls"]


@cache
def _schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / EXTRA_CRDS[api_version, kind]).read_text())
    version = api_version.rsplit("/", 1)[1]
    [schema] = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version]
    return schema


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in EXTRA_CRDS:
        jsonschema.Draft7Validator(_schema(*key)).validate(obj)
    else:
        validate_k8s(obj)


def _objects(name: str, auth: str) -> list[dict[str, Any]]:
    files = render(load_topology(ROOT / "topologies" / f"{name}.yaml"), target="k8s", auth=auth)  # type: ignore[arg-type]
    return list(yaml.safe_load_all(files["k8s.yaml"]))


@pytest.mark.parametrize("auth", AUTHS)
@pytest.mark.parametrize("name", ["digits", "ensemble"])
def test_every_object_is_valid_and_every_stage_has_its_user(name: str, auth: str) -> None:
    topology = load_topology(ROOT / "topologies" / f"{name}.yaml")
    objs = _objects(name, auth)
    for obj in objs:
        validate(obj)
    users = {o["metadata"]["name"]: o for o in objs if o["kind"] == "KafkaUser"}
    assert sorted(users) == sorted([*(principal_name(topology.name, n) for n in topology.nodes),
                                    principal_name(topology.name, "gateway")])
    for principal, acls in topology_acls(topology).items():
        if principal.name in users:
            assert users[principal.name]["spec"] == {"authentication": {"type": auth},
                                                     "authorization": {"type": "simple",
                                                                       "acls": strimzi_acls(acls)}}
    [kafka] = [o for o in objs if o["kind"] == "Kafka"]
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple"}
    assert kafka["spec"]["kafka"]["listeners"][0]["authentication"] == {"type": auth}
    assert kafka["spec"]["kafka"]["config"]["allow.everyone.if.no.acl.found"] is False
    assert sum(o["kind"] == "TriggerAuthentication" for o in objs) == len(topology.nodes)


@pytest.mark.parametrize("auth", AUTHS)
def test_each_deployment_mounts_only_its_own_users_secret(auth: str) -> None:
    objs = _objects("digits", auth)
    users = {o["metadata"]["name"] for o in objs if o["kind"] == "KafkaUser"}
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    assert len(deployments) == len(users) == 4
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        user = env["FLOWSERVE_SASL_USERNAME"]
        assert deployment["metadata"]["name"] == user  # the stage's Deployment and its user share the name
        secrets = {v["secret"]["secretName"] for v in pod["volumes"]}
        assert secrets & users == {user}  # its own, never another stage's
        assert all(m["readOnly"] for m in container["volumeMounts"])
        assert "FLOWSERVE_SASL_PASSWORD" not in env  # the password stays in the mounted file
        if auth == "tls":
            assert secrets == {user, "flowserve-cluster-ca-cert"}
            assert env["FLOWSERVE_SSL_KEYFILE"].endswith("/user.key")
        else:
            assert env["FLOWSERVE_SASL_PASSWORD_FILE"] == "/etc/flowserve/kafka-user/password"
    scalers = [o for o in objs if o["kind"] == "ScaledObject"]
    assert all(t["authenticationRef"]["name"] == s["spec"]["scaleTargetRef"]["name"]
               for s in scalers for t in s["spec"]["triggers"])


def test_validation_catches_a_broken_user() -> None:
    user = next(o for o in _objects("digits", "scram-sha-512") if o["kind"] == "KafkaUser")
    user["spec"]["authorization"]["acls"][0]["operations"] = ["Reed"]
    with pytest.raises(jsonschema.ValidationError):
        validate(user)
    user["spec"]["authorization"]["acls"][0]["operations"] = ["Read"]
    user["spec"]["authorization"]["acls"][0]["resource"]["patternType"] = "prefixed"  # Kafka's word, not Strimzi's
    with pytest.raises(jsonschema.ValidationError):
        validate(user)


def test_without_auth_nothing_changes_and_compose_refuses_it() -> None:
    objs = list(yaml.safe_load_all(render(load_topology(ROOT / "topologies" / "digits.yaml"))["k8s.yaml"]))
    assert not [o for o in objs if o["kind"] in ("KafkaUser", "TriggerAuthentication")]
    with pytest.raises(FlowserveError, match="--target k8s"):
        render(load_topology(ROOT / "topologies" / "digits.yaml"), target="compose", auth="tls")


def test_the_command_takes_auth(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy", "render", str(ROOT / "topologies" / "digits.yaml"), "-o", str(tmp_path),
                              "--auth", "scram-sha-512"])
    assert args.func(args) == 0
    kinds = [o["kind"] for o in yaml.safe_load_all((tmp_path / "k8s.yaml").read_text())]
    assert kinds.count("KafkaUser") == 4
