"""``flowserve acl`` without a broker: the least ACLs derived from a compiled topology, Kafka's refusals
mapped to a kind, and per-stage credentials read from files (never shown)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, NodeNotReadyError, TopicAuthorizationFailedError
from confluent_kafka import KafkaError, KafkaException

from flowserve.cli.acl import register, rows
from flowserve.errors import ErrorKind, SettingsError, TopologyError
from flowserve.kafka.acls import access_denied, principals, topology_acls
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology

ROOT = Path(__file__).parents[2]


def _granted(name: str) -> dict[str, set[tuple[str, str, str, str]]]:
    topology = load_topology(ROOT / "topologies" / f"{name}.yaml")
    return {p.name: {(a.resource, a.pattern, a.name, a.operation) for a in acls}
            for p, acls in topology_acls(topology).items()}


def test_a_stage_gets_its_inputs_group_and_outputs_and_nothing_else() -> None:
    assert _granted("digits")["flowserve-digits-model"] == {
        ("topic", "literal", "fs.digits.pre.x", "Read"),
        ("group", "literal", "fs.digits.model", "Read"),
        ("topic", "literal", "fs.digits.model.logits", "Write"),
        ("topic", "literal", "fs.digits.deadletter", "Write"),
        ("topic", "literal", "fs.digits.metrics", "Write"),
        ("topic", "literal", "fs.digits.control", "Read"),
        ("group", "prefixed", "fs.digits.model.host.", "Read"),
        ("topic", "prefixed", "fs.digits.model.host.", "Create"),
        ("topic", "prefixed", "fs.digits.model.host.", "Read"),
    }
    post = _granted("digits")["flowserve-digits-post"]
    assert ("topic", "literal", "fs.digits.outputs", "Write") in post  # the stage that answers
    assert ("topic", "prefixed", "fs.digits.replies.", "Write") in post


@pytest.mark.parametrize("name", ["digits", "ensemble"])
def test_no_principal_may_create_a_topology_topic_or_read_another_stages_group(name: str) -> None:
    topology = load_topology(ROOT / "topologies" / f"{name}.yaml")
    owned = set(topology.topics())
    for principal, acls in topology_acls(topology).items():
        for acl in acls:
            if acl.operation == "Create":
                assert acl.name not in owned and acl.pattern == "prefixed" or acl.name == topology.actions_topic
            if acl.resource == "group" and acl.operation == "Read":
                assert principal.node is not None and acl.name.startswith(topology.group_id(principal.node))
        if principal.node is not None:  # a stage reads exactly its own inputs (and operator commands)
            reads = {a.name for a in acls if a.resource == "topic" and a.operation == "Read" and a.pattern == "literal"}
            assert reads - {topology.control_topic} == set(topology.nodes[principal.node].input_topics) or \
                topology.nodes[principal.node].component.learns


def test_one_principal_per_stage_and_service_and_a_node_named_like_a_service_is_refused(write_topology) -> None:  # noqa: ANN001
    names = [p.name for p in principals(load_topology(ROOT / "topologies" / "digits.yaml"))]
    assert names == ["flowserve-digits-pre", "flowserve-digits-model", "flowserve-digits-post",
                     "flowserve-digits-gateway", "flowserve-digits-tuner", "flowserve-digits-ui"]
    path = write_topology("name: NAME\nnodes:\n  gateway: {component: fs_testkit:AddOne, inputs: {x: input.x}}\n"
                          "outputs: {y: gateway.x}\n")
    with pytest.raises(TopologyError, match="node 'gateway'.*service principal"):
        principals(load_topology(path))


@pytest.mark.parametrize(("exc", "code", "resource"), [
    (TopicAuthorizationFailedError(), "TOPIC_AUTHORIZATION_FAILED", "topic"),
    (GroupAuthorizationFailedError(), "GROUP_AUTHORIZATION_FAILED", "group"),
    (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), "TOPIC_AUTHORIZATION_FAILED", "topic"),
    (KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED)), "CLUSTER_AUTHORIZATION_FAILED", "cluster"),
])
def test_kafkas_refusals_are_forbidden_by_code(exc: BaseException, code: str, resource: str) -> None:
    denied = access_denied(exc)
    assert denied is not None
    assert (denied.kind, denied.code, denied.resource) == (ErrorKind.FORBIDDEN, code, resource)


def test_other_errors_are_not_refusals() -> None:
    assert access_denied(NodeNotReadyError()) is None
    assert access_denied(KafkaException(KafkaError(KafkaError._TIMED_OUT))) is None
    assert access_denied(ValueError("TOPIC_AUTHORIZATION_FAILED")) is None  # never by the text


def test_the_command_prints_one_row_per_principal_and_resource(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["acl", str(ROOT / "topologies" / "digits.yaml"), "--json"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == rows(topology_acls(load_topology(ROOT / "topologies" / "digits.yaml")))
    gateway_inputs = next(r for r in printed if r["principal"] == "flowserve-digits-gateway"
                          and r["name"] == "fs.digits.inputs")
    assert gateway_inputs["operations"] == ["Describe", "Write"] and gateway_inputs["role"] == "gateway"
    args = parser.parse_args(["acl", str(ROOT / "topologies" / "digits.yaml")])
    assert args.func(args) == 0
    assert "flowserve-digits-ui" in capsys.readouterr().out


def test_credentials_come_from_files_and_never_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-a-file-9d1c\n")  # as `echo` writes it
    monkeypatch.setenv("FLOWSERVE_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("FLOWSERVE_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("FLOWSERVE_SASL_USERNAME", "flowserve-digits-pre")
    monkeypatch.setenv("FLOWSERVE_SASL_PASSWORD_FILE", str(secret))
    kafka = KafkaSettings.from_env("127.0.0.1:9092")
    assert kafka.sasl_password is not None and kafka.sasl_password.get_secret_value() == "from-a-file-9d1c"
    assert kafka.client_kwargs()["sasl_plain_username"] == "flowserve-digits-pre"
    assert "from-a-file" not in repr(kafka) + str(kafka) + repr(kafka.model_dump())
    monkeypatch.setenv("FLOWSERVE_SASL_PASSWORD", "from-the-variable")  # the variable wins
    assert KafkaSettings.from_env().sasl_password.get_secret_value() == "from-the-variable"  # type: ignore[union-attr]
    monkeypatch.delenv("FLOWSERVE_SASL_PASSWORD")
    monkeypatch.setenv("FLOWSERVE_SASL_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="FLOWSERVE_SASL_PASSWORD_FILE: cannot read") as caught:
        KafkaSettings.from_env()
    assert caught.value.kind is ErrorKind.INVALID_SETTINGS
