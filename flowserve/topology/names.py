"""Topic and consumer-group names: the only place they are formed.

Every name starts with a topology's *base*, ``<prefix>.<topology>`` (prefix ``fs`` by default)::

    <base>.inputs              requests (any Kafka client may write here)
    <base>.<node>.<port>       an edge: one node's output port that some node reads, or a captured port
    <base>.outputs             replies of asynchronous callers
    <base>.replies.<instance>  replies of one gateway instance (its ``fs-reply-to`` route)
    <base>.deadletter          records that could not be used, with the reason
    <base>.metrics             workers' periodic metrics snapshots
    <base>.control             operator commands to every worker of the topology
    <base>.lineage             lineage records (capture)
    <base>.actions             what features did on their own: the tuner's scaling, the parity decoder's
                               reconstructions (JSON: ts_ms, source, node, action; ``flowserve ui`` shows them)
    <base>.explanations        attributions of sampled or asked-for requests (flowserve.explain), keyed by
                               request id
    <base>.feedback            the true outputs of answered requests (flowserve.wire.feedback), from the
                               gateway's feedback endpoint or any Kafka client
    <base>.<node>.decisions    what a learning node decided per request (flowserve.selection), joined to feedback
    <base>.<node>.state        what a learning node learned, per context (compacted: the last value per key)
    <base>.<side>              a component's side reports, e.g. ``<base>.drift``
    <base>.<node>.parity       parity queries for a parity-protected node (flowserve.parity)
    <base>.<node>-parity.<p>   the parity model's outputs (its node id is ``<node>-parity``)
    <base>.<node>.shadow.<p>   a shadow version's outputs (flowserve.learning: its node id is ``<node>-shadow``;
                               never read by the topology, so it never answers callers)

A node's consumer group is ``<base>.<node>``. Names are plain functions of strings, so tools that know
only a topology's name and prefix (``flowserve inspect``, the capture reader) form the same names.

On Kubernetes (``flowserve deploy``), a node's workers are the Deployment ``flowserve-<topology>-<node>``
(:func:`deployment_name`), which ``flowserve tune --kubernetes`` scales.
"""

from __future__ import annotations

import re

INPUTS = "inputs"
OUTPUTS = "outputs"
DEADLETTER = "deadletter"
METRICS = "metrics"
CONTROL = "control"
LINEAGE = "lineage"
ACTIONS = "actions"
FEEDBACK = "feedback"
EXPLANATIONS = "explanations"
REPLIES = "replies"

#: the topics of a topology that are not edges (``flowserve inspect`` hides these by default).
SERVICE_TOPICS = (METRICS, CONTROL)


def base(prefix: str, topology: str) -> str:
    """``<prefix>.<topology>``: what every topic of the topology starts with."""
    return f"{prefix}.{topology}"


def inputs_topic(base: str) -> str:
    return f"{base}.{INPUTS}"


def outputs_topic(base: str) -> str:
    return f"{base}.{OUTPUTS}"


def deadletter_topic(base: str) -> str:
    return f"{base}.{DEADLETTER}"


def metrics_topic(base: str) -> str:
    return f"{base}.{METRICS}"


def control_topic(base: str) -> str:
    return f"{base}.{CONTROL}"


def lineage_topic(base: str) -> str:
    return f"{base}.{LINEAGE}"


def actions_topic(base: str) -> str:
    return f"{base}.{ACTIONS}"


def feedback_topic(base: str) -> str:
    """Feedback: the true outputs of answered requests, keyed by request id (:mod:`flowserve.wire.feedback`)."""
    return f"{base}.{FEEDBACK}"


def explanations_topic(base: str) -> str:
    """Attributions of requests to the topology's inputs, keyed by request id (:mod:`flowserve.explain`)."""
    return f"{base}.{EXPLANATIONS}"


def explain_group(base: str) -> str:
    """The consumer group of the explainer: it reads the inputs topic beside the topology's own nodes."""
    return f"{base}.{EXPLANATIONS}"


DECISIONS = "decisions"
STATE = "state"


def decisions_topic(base: str, node: str) -> str:
    """A learning node's decisions per request (``Component.learns``): ``<base>.<node>.decisions``."""
    return f"{base}.{node}.{DECISIONS}"


def state_topic(base: str, node: str) -> str:
    """A learning node's learned state per context, compacted: ``<base>.<node>.state``."""
    return f"{base}.{node}.{STATE}"


def side_topic(base: str, name: str) -> str:
    """Where a component's side reports go (``Component.side_output``), e.g. ``<base>.drift``."""
    return f"{base}.{name}"


def replies_prefix(base: str) -> str:
    """Every reply topic of synchronous callers (one per gateway instance) starts with this."""
    return f"{base}.{REPLIES}."


def reply_topic(base: str, instance: str) -> str:
    return f"{replies_prefix(base)}{instance}"


def edge_topic(base: str, node: str, port: str) -> str:
    """The topic of ``node``'s output ``port``."""
    return f"{base}.{node}.{port}"


def group_id(base: str, node: str) -> str:
    """The consumer group of ``node``'s workers."""
    return f"{base}.{node}"


#: the suffix of a parity-protected node's parity topics (flowserve.parity).
PARITY = "parity"


def parity_query_topic(base: str, node: str) -> str:
    """Encoded parity queries for parity-protected ``node``: ``<base>.<node>.parity``."""
    return f"{base}.{node}.{PARITY}"


def parity_node(node: str) -> str:
    """The id of the parity model node that protects ``node`` (its own consumer group and workers)."""
    return f"{node}-{PARITY}"


def parity_output_topic(base: str, node: str, port: str) -> str:
    """The parity model's output ``port`` for protected ``node``: ``<base>.<node>-parity.<port>``."""
    return edge_topic(base, parity_node(node), port)


#: the suffix of a node's shadow version (continual learning, flowserve.learning).
SHADOW = "shadow"


def shadow_node(node: str) -> str:
    """The id of ``node``'s shadow: a side branch running a candidate version on a copy of its inputs."""
    return f"{node}-{SHADOW}"


def shadow_topic(base: str, node: str, port: str) -> str:
    """The shadow version of ``node``'s output ``port``: ``<base>.<node>.shadow.<port>`` (read by nobody in the
    topology: ``flowserve versions`` compares it with the live outputs)."""
    return f"{base}.{node}.{SHADOW}.{port}"


def k8s_name(*parts: str) -> str:
    """A DNS-1123 label from ``parts`` (node ids may hold underscores; topic names dots)."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return name[:63].rstrip("-")


def deployment_name(topology: str, node_id: str) -> str:
    """The Kubernetes Deployment that runs node ``node_id``'s workers of topology ``topology``."""
    return k8s_name("flowserve", topology, node_id)
