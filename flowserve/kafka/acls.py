"""The least Kafka ACLs of each part of a topology: one principal per stage, the gateway, the tuner and the UI.

Derived from the compiled graph alone (the names are :mod:`flowserve.topology.names`'), so ``flowserve acl``,
``flowserve deploy render --auth`` (Strimzi KafkaUsers) and :mod:`flowserve.kafka.acl_apply` (CreateAcls)
grant the same rights. What each part is granted is what it was seen to do on a broker with an authorizer
and ``allow.everyone.if.no.acl.found=false`` (tests/security/test_acl_cluster.py):

- a **stage** reads its input topics in its consumer group (Read on both: join, fetch, commit), writes its
  output ports, its captured ports, the dead-letter and metrics topics, the topology's outputs and the
  gateways' reply topics when it answers callers, the lineage and side-report topics when capture asks
  for them, and its learning topics; it reads the control topic. Under the default (faust) host each worker
  process is its own faust app, ``<group>.host.<instance>``: a prefixed group and the topic faust's
  assignor keeps under that prefix. Idempotent producers need no cluster right (Kafka >= 3.0: Write on a
  topic is enough).
- the **gateway** writes requests and feedback and its metrics, owns its reply topics
  (``<base>.replies.<instance>``: create, read, grow, delete), describes the topology's topics (it checks they
  exist before it serves) and its stages' groups (readiness).
- the **tuner** reads requests' arrivals and each stage's committed offsets (its lag), writes (and creates)
  the actions topic, and may grow every topic (Alter) with ``--max-partitions``.
- the **UI** reads metrics, control, actions, lineage, dead-letter and side-report topics.

Topics are created by an administrator (``flowserve topics --create`` or Strimzi KafkaTopics): no stage may
create a topology topic, so a stage cannot invent one another stage then reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from flowserve.errors import BrokerError, ErrorKind, TopologyError
from flowserve.topology import names
from flowserve.topology.capture import node_policy
from flowserve.topology.graph import Topology

Resource = Literal["topic", "group", "cluster", "transactional_id"]
Pattern = Literal["literal", "prefixed"]
#: Kafka's ACL operations, spelled as Strimzi's KafkaUser spells them
Operation = Literal["Read", "Write", "Create", "Delete", "Alter", "Describe", "DescribeConfigs", "AlterConfigs",
                    "IdempotentWrite"]
Role = Literal["stage", "gateway", "tuner", "ui", "explainer"]
#: the parts of a topology that are not stages, each with its own principal
SERVICES: tuple[Role, ...] = ("gateway", "tuner", "ui")
#: the explain side branch (flowserve.explain): a principal only where the topology has an ``explain:`` section
EXPLAINER: Role = "explainer"


@dataclass(frozen=True, order=True)
class Acl:
    """One allowed operation of one principal on one resource (``name`` is a prefix when ``pattern`` is
    ``prefixed``). ``why`` is for people: it names what the principal does with it."""

    principal: str
    resource: Resource
    name: str
    pattern: Pattern
    operation: Operation
    why: str = field(default="", compare=False)

    @property
    def kafka_principal(self) -> str:
        """As Kafka writes it: ``User:<name>`` (a SCRAM user name, or a TLS certificate's CN)."""
        return f"User:{self.principal}"


@dataclass(frozen=True)
class Principal:
    """A part of a topology with its own Kafka credentials: a stage (``node`` set) or a service."""

    name: str
    role: Role
    node: str | None = None


def principal_name(topology: str, part: str) -> str:
    """The user name of a stage (``part`` = node id) or service (``gateway``, ``tuner``, ``ui``): the name of
    its Strimzi KafkaUser and Secret, so a DNS-1123 label (the stage's Deployment's name)."""
    return names.deployment_name(topology, part)


def principals(topology: Topology) -> list[Principal]:
    """One per stage, then the gateway, the tuner, the UI and (with ``explain:``) the explainer. A node named
    like a service would share its principal, and so its rights: refused."""
    services: tuple[Role, ...] = (*SERVICES, EXPLAINER) if topology.explained else SERVICES
    clash = sorted(set(topology.nodes) & set(services))
    if clash:
        raise TopologyError(f"node id {clash[0]!r} is the name of a service principal ({', '.join(SERVICES)}); "
                            "rename the node to give it its own Kafka principal", source=topology.source,
                            node=clash[0])
    found = [Principal(principal_name(topology.name, n), "stage", n) for n in topology.nodes]
    found += [Principal(principal_name(topology.name, s), s) for s in services]
    return found


class _Grants:
    """Collects one principal's ACLs, deduplicated, in the order they were granted."""

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.acls: dict[Acl, None] = {}

    def topic(self, name: str, ops: Iterable[Operation], why: str, pattern: Pattern = "literal") -> None:
        for op in ops:
            self.acls.setdefault(Acl(self.principal, "topic", name, pattern, op, why))

    def group(self, name: str, ops: Iterable[Operation], why: str, pattern: Pattern = "literal") -> None:
        for op in ops:
            self.acls.setdefault(Acl(self.principal, "group", name, pattern, op, why))


def _stage(topology: Topology, node_id: str, grants: _Grants) -> None:
    node = topology.nodes[node_id]
    group = topology.group_id(node_id)
    for topic in node.input_topics:
        grants.topic(topic, ["Read"], "its input (Read implies Describe)")
    grants.group(group, ["Read"], "its consumer group: join, fetch and commit offsets")
    for topic in node.output_topics.values():
        grants.topic(topic, ["Write"], "its output port")
    for topic in node.capture_topics.values():
        grants.topic(topic, ["Write"], "its captured port (capture:)")
    grants.topic(topology.deadletter_topic, ["Write"], "records it cannot use, with the reason")
    grants.topic(topology.metrics_topic, ["Write"], "its metrics snapshots")
    if node.emits_outputs:
        grants.topic(topology.outputs_topic, ["Write"], "the topology's outputs (asynchronous callers)")
        grants.topic(topology.replies_prefix, ["Write"], "replies to synchronous callers (fs-reply-to)", "prefixed")
    policy = node_policy(topology.spec, node_id)
    if policy.active and policy.lineage:
        grants.topic(topology.lineage_topic, ["Write"], "lineage records (capture:)")
    side = node.component.side_output
    if side:
        grants.topic(topology.side_topic(side), ["Write"], "its side reports (Component.side_output)")
    if node.component.learns:
        grants.topic(topology.decisions_topic(node_id), ["Read", "Write"], "what it decided per request")
        grants.topic(topology.state_topic(node_id), ["Read", "Write"], "what it learned (compacted)")
        grants.topic(topology.feedback_topic, ["Read"], "feedback it learns from")
    spec = topology.spec.nodes.get(node_id)
    if spec is not None and spec.parity is not None:
        grants.topic(names.parity_query_topic(topology.base, node_id), ["Write"], "its parity queries")
    if any(s.parity is not None for s in topology.spec.nodes.values()):
        grants.topic(topology.lineage_topic, ["Write"], "parity reconstructions' lineage")
        grants.topic(topology.actions_topic, ["Write"], "parity reconstructions, as actions")
    grants.topic(topology.control_topic, ["Read"], "operator commands (flowserve control)")
    # The faust host makes each worker process its own app, <group>.host.<instance>: its group, and the
    # topic its assignor keeps, both start with that.
    host = f"{group}.host."
    grants.group(host, ["Read"], "the faust host's own group (one per worker process)", "prefixed")
    grants.topic(host, ["Create", "Read"], "the faust host's assignor topic: created and read, never written",
                 "prefixed")


def _gateway(topology: Topology, grants: _Grants) -> None:
    for topic in [*topology.topics(), topology.control_topic]:
        grants.topic(topic, ["Describe"], "checks the topology's topics exist before it serves")
    grants.topic(topology.inputs_topic, ["Write"], "requests")
    grants.topic(topology.feedback_topic, ["Write"], "feedback (POST .../feedback)")
    if topology.explained:
        grants.topic(topology.explanations_topic, ["Read"], "a request's explanation (POST .../explain)")
    grants.topic(topology.metrics_topic, ["Write"], "its metrics snapshots")
    grants.topic(topology.replies_prefix, ["Create", "Read", "Alter", "Delete"],
                 "its own reply topic: created, read, grown with the inputs, deleted on exit (stages write it)",
                 "prefixed")
    for node_id in topology.nodes:
        grants.group(topology.group_id(node_id), ["Describe"], "readiness: the stage's group has members")


def _tuner(topology: Topology, grants: _Grants) -> None:
    for topic in topology.topics():
        grants.topic(topic, ["Alter"], "grows every topic's partitions together (--max-partitions; Alter implies "
                     "Describe, which its lag reads need)")
    grants.topic(topology.inputs_topic, ["Read"], "requests' arrival times")
    grants.topic(topology.actions_topic, ["Create", "Write"], "what it scaled, and why")
    for node_id in topology.nodes:
        grants.group(topology.group_id(node_id), ["Describe"], "each stage's committed offsets: its lag")


def _ui(topology: Topology, grants: _Grants) -> None:
    reads = [topology.metrics_topic, topology.control_topic, topology.actions_topic, topology.deadletter_topic]
    if topology.lineage_topic in topology.topics():  # only where capture (or parity) writes lineage
        reads.append(topology.lineage_topic)
    if topology.explained:  # a looked-up request's explanations (flowserve.explain)
        reads.append(topology.explanations_topic)
    reads += [topology.side_topic(n.component.side_output) for n in topology.nodes.values()
              if n.component.side_output]
    for topic in reads:
        grants.topic(topic, ["Read"], "shown live (metrics, commands, actions, lineage, dead letters, drift)")


def _explainer(topology: Topology, grants: _Grants) -> None:
    grants.topic(topology.inputs_topic, ["Read"], "the requests it samples, read beside the first stage")
    grants.group(names.explain_group(topology.base), ["Read"], "its own consumer group: join, fetch, commit")
    grants.topic(topology.explanations_topic, ["Write"], "attributions keyed by request id")


def topology_acls(topology: Topology) -> dict[Principal, list[Acl]]:
    """Each principal of ``topology`` and the ACLs it needs, nothing more."""
    out: dict[Principal, list[Acl]] = {}
    for principal in principals(topology):
        grants = _Grants(principal.name)
        if principal.node is not None:
            _stage(topology, principal.node, grants)
        elif principal.role == "gateway":
            _gateway(topology, grants)
        elif principal.role == "tuner":
            _tuner(topology, grants)
        elif principal.role == EXPLAINER:
            _explainer(topology, grants)
        else:
            _ui(topology, grants)
        out[principal] = list(grants.acls)
    return out


# ---------------------------------------------------------------- refusals


#: Kafka's authorization error codes (its protocol's numbers), by the resource they refuse
AUTHORIZATION_CODES: dict[int, tuple[str, Resource]] = {
    29: ("TOPIC_AUTHORIZATION_FAILED", "topic"),
    30: ("GROUP_AUTHORIZATION_FAILED", "group"),
    31: ("CLUSTER_AUTHORIZATION_FAILED", "cluster"),
    53: ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "transactional_id"),
}


class AccessDenied(BrokerError):  # noqa: N818 - the name is what it says
    """Kafka refused a principal an operation its ACLs do not allow. ``kind`` is FORBIDDEN (a valid
    credential without the right); ``resource`` and ``code`` say which kind of right was missing."""

    kind = ErrorKind.FORBIDDEN

    def __init__(self, message: str, *, code: str, resource: Resource) -> None:
        self.code = code
        self.resource = resource
        super().__init__(message)


def access_denied(exc: BaseException) -> AccessDenied | None:
    """The refusal ``exc`` is, when it is Kafka's authorization error (aiokafka's or confluent-kafka's, both
    carry Kafka's error code), else None: so callers branch on the code, never on the message text."""
    code = getattr(exc, "errno", None)
    if code is None and exc.args and hasattr(exc.args[0], "code"):  # confluent_kafka.KafkaException(KafkaError)
        code = exc.args[0].code()
    if not isinstance(code, int) or code not in AUTHORIZATION_CODES:
        return None
    name, resource = AUTHORIZATION_CODES[code]
    return AccessDenied(f"Kafka refused this principal ({name}): {exc}", code=name, resource=resource)
