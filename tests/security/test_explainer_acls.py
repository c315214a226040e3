"""The explain side branch as a principal of its own (issue 39, least privilege): where a topology has an
``explain:`` section, ``flowserve acl`` gives the explainer exactly what it uses and ``flowserve deploy
render`` a Deployment mounting its own user's credentials; without one, neither exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from flowserve.deploy.render import render
from flowserve.kafka.acls import principal_name, principals, topology_acls
from flowserve.topology import load_topology, load_topology_text
from flowserve.topology import names as topic_names

ROOT = Path(__file__).resolve().parents[2]


def _explained() -> Any:
    text = (ROOT / "topologies" / "digits.yaml").read_text() + "\nexplain:\n  sample: 0.01\n"
    return load_topology_text(text, source=str(ROOT / "topologies" / "digits.yaml"))


def test_the_explainer_reads_the_inputs_in_its_own_group_and_writes_explanations_only() -> None:
    topology = _explained()
    [explainer] = [p for p in principals(topology) if p.role == "explainer"]
    assert explainer.name == principal_name(topology.name, "explainer")
    granted = {(a.resource, a.name, a.pattern, a.operation) for a in topology_acls(topology)[explainer]}
    assert granted == {("topic", topology.inputs_topic, "literal", "Read"),
                       ("group", topic_names.explain_group(topology.base), "literal", "Read"),
                       ("topic", topology.explanations_topic, "literal", "Write")}
    # and no stage may write its explanations
    for principal, acls in topology_acls(topology).items():
        if principal.role == "stage":
            assert all(a.name != topology.explanations_topic for a in acls)


def test_without_explain_there_is_no_explainer_principal_or_pod() -> None:
    topology = load_topology(ROOT / "topologies" / "digits.yaml")
    assert "explainer" not in {p.role for p in principals(topology)}
    objs = list(yaml.safe_load_all(render(topology, target="k8s", auth="scram-sha-512")["k8s.yaml"]))
    assert not [o for o in objs if o["metadata"].get("labels", {}).get("flowserve/node") == "explainer"]


def test_deploy_render_gives_the_explainer_a_pod_with_its_own_user() -> None:
    topology = _explained()
    objs = list(yaml.safe_load_all(render(topology, target="k8s", auth="scram-sha-512")["k8s.yaml"]))
    user = principal_name(topology.name, "explainer")
    assert user in {o["metadata"]["name"] for o in objs if o["kind"] == "KafkaUser"}
    [pod] = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"]["flowserve/node"] == "explainer"]
    [container] = pod["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "explainer"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FLOWSERVE_SASL_USERNAME"] == user == pod["metadata"]["name"]
