"""A principal per stage, on Apache Kafka with SASL/SCRAM and an authorizer that refuses what no ACL allows
(tests/support/fs_acl_cluster.py): the digits pipeline serves end to end with only the ACLs ``flowserve acl
--apply`` created, each worker a process of its own principal reading its password from a file; the broker
refused nothing while it served; and a stage's principal is refused another stage's input, another
topology's outputs and another stage's group, each refusal an AccessDenied of kind FORBIDDEN."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from fs_acl_cluster import ADMIN, MECHANISM, add_users, decisions, sasl, start_acl_cluster

from flowserve.cli.acl import register
from flowserve.cli.ui import sources
from flowserve.client.http import AsyncHttpClient
from flowserve.errors import ErrorKind
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.acl_apply import apply_acls
from flowserve.kafka.acls import AccessDenied, access_denied, topology_acls
from flowserve.kafka.admin import describe_partitions
from flowserve.kafka.lag import LagReader
from flowserve.runtime.host import create_topology_topics
from flowserve.topology import load_topology
from flowserve.tuning.partitions import PartitionGrowth
from flowserve.tuning.tuner import Action, ActionLog, tail_arrivals

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
DIGITS = ROOT / "topologies" / "digits.yaml"
OTHER = """
name: other
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: a.x}
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The cluster, digits' and another topology's topics (made by the admin), a user per digits principal."""
    if "kafka" not in os.environ.get("FLOWSERVE_TEST_BROKERS", "embedded,kafka").split(","):
        pytest.skip("ACLs are tested on Apache Kafka (FLOWSERVE_TEST_BROKERS leaves it out)")
    admin_password = "admin-" + os.urandom(8).hex()
    cluster = start_acl_cluster(admin_password)
    try:
        admin = sasl(cluster, ADMIN, admin_password)
        digits = load_topology(DIGITS)
        other_path = tmp_path_factory.mktemp("other") / "other.yaml"
        other_path.write_text(OTHER)
        other = load_topology(other_path)
        asyncio.run(create_topology_topics(digits, admin))
        asyncio.run(create_topology_topics(other, admin))
        passwords = add_users(admin, [p.name for p in topology_acls(digits)])
        applied = apply_acls(admin, [a for acls in topology_acls(digits).values() for a in acls])
        yield {"cluster": cluster, "admin": admin, "admin_password": admin_password, "digits": digits,
               "other": other, "passwords": passwords, "applied": applied}
    finally:
        cluster.stop()


def _acl_command(argv: list[str]) -> int:
    """``flowserve acl ...``, through the command's own parser."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["acl", *argv])
    return args.func(args)


def _as(secured: dict, part: str, **extra: object):  # noqa: ANN202
    name = f"flowserve-digits-{part}"
    return sasl(secured["cluster"], name, secured["passwords"][name], **extra)


@pytest.mark.timeout(600)
async def test_digits_serves_with_only_the_applied_acls(secured: dict, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, digits, passwords = secured["cluster"], secured["digits"], secured["passwords"]
    bootstrap = f"127.0.0.1:{cluster.listener_ports['SASL']}"
    # the fixture applied them (apply_acls); the command, run as the administrator, finds them all present
    wanted = [a for acls in topology_acls(digits).values() for a in acls]
    assert (len(secured["applied"].created), len(secured["applied"].present)) == (len(wanted), 0)
    for name, value in {"FLOWSERVE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FLOWSERVE_SASL_MECHANISM": MECHANISM,
                        "FLOWSERVE_SASL_USERNAME": ADMIN, "FLOWSERVE_SASL_PASSWORD": secured["admin_password"]}.items():
        monkeypatch.setenv(name, value)
    assert await asyncio.to_thread(_acl_command, [str(DIGITS), "--apply", "--broker", bootstrap]) == 0
    assert f"0 created, {len(wanted)} already present" in capsys.readouterr().out
    for name in list(os.environ):
        if name.startswith("FLOWSERVE_SASL") or name == "FLOWSERVE_SECURITY_PROTOCOL":
            monkeypatch.delenv(name)

    # one worker process per stage, each with its own user and its password in a file (as a mounted Secret)
    procs, logs = [], tmp_path / "logs"
    logs.mkdir()
    for node in digits.nodes:
        user = f"flowserve-digits-{node}"
        secret = tmp_path / user
        secret.write_text(passwords[user] + "\n")
        env = {**os.environ, "FLOWSERVE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FLOWSERVE_SASL_MECHANISM": MECHANISM,
               "FLOWSERVE_SASL_USERNAME": user, "FLOWSERVE_SASL_PASSWORD_FILE": str(secret),
               "FLOWSERVE_IDEMPOTENCE": "1"}
        with (logs / f"{node}.log").open("w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "flowserve", "worker", str(DIGITS), node,
                                           "--broker", bootstrap, "-v"], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    try:
        pixels, labels = digits.sampler()(8)
        kafka = _as(secured, "gateway", idempotence=True)
        async with asyncio.timeout(240), Gateway([digits], kafka, GatewaySettings(port=0)) as gateway, \
                AsyncHttpClient(gateway.url) as http:
            for _ in range(120):  # until every stage's group has formed and its model loaded (503, 504 till then)
                if (await http.infer("digits", pixels[0])).status not in (503, 504):
                    break
                await asyncio.sleep(1)
            slow = {"X-Timeout-Ms": "60000"}  # two cores shared with the broker and three workers: no deadline race

            async def answer(request: np.ndarray) -> int:
                # 503 says "retry later" (a group rebalancing under load, as in one CI run): a caller retries
                for _ in range(30):
                    reply = await http.infer("digits", request, headers=slow)
                    if reply.status != 503:
                        break
                    await asyncio.sleep(1)
                return int(reply.raise_for_status().outputs()["label"][0])

            answers = [await answer(request) for request in pixels]
        assert np.mean(np.array(answers) == np.array(labels).ravel()) >= 0.75  # the model's own accuracy
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    # the UI, as its own principal, reads the panels' topics (metrics, drift, control and actions) and sees
    # what the administrator sees
    ui, admin = sources(_as(secured, "ui")), sources(secured["admin"])
    assert ui.drift is not None and ui.actions is not None and admin.actions is not None
    assert await asyncio.wait_for(ui.snapshots(digits), 60) == await asyncio.wait_for(admin.snapshots(digits), 60)
    assert await asyncio.wait_for(ui.drift(digits), 60) == {}
    assert await asyncio.wait_for(ui.actions(digits), 60) == await asyncio.wait_for(admin.actions(digits), 60)
    said = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    assert not any(password in said for password in passwords.values())
    ours = [d for d in decisions(cluster) if d.principal.startswith("flowserve-digits-")]
    acting = {f"flowserve-digits-{part}" for part in [*digits.nodes, "gateway", "ui"]}
    assert {d.principal for d in ours if d.allowed} >= acting
    assert [d for d in ours if not d.allowed] == []  # served without a single refusal
    # and least: every ACL a stage holds allowed some request while it served (the broker logs the ACL that
    # allowed each one)
    used = {(d.principal, d.acl) for d in ours if d.acl is not None}
    for principal, acls in topology_acls(digits).items():
        if principal.node is not None:
            unused = [a for a in acls if (a.principal, (a.resource.upper(), a.pattern.upper(), a.name,
                                                        a.operation.upper())) not in used]
            assert unused == [], f"{principal.name} holds ACLs it never used: {unused}"


def _refused(caught: pytest.ExceptionInfo[BaseException], code: str, resource: str) -> None:
    denied = access_denied(caught.value)
    assert isinstance(denied, AccessDenied)
    assert (denied.kind, denied.code, denied.resource) == (ErrorKind.FORBIDDEN, code, resource)


async def test_a_stage_is_refused_another_stages_input(secured: dict) -> None:
    """pre reads fs.digits.inputs; fs.digits.pre.x is model's input."""
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **_as(secured, "pre").client_kwargs())
    await consumer.start()
    try:
        consumer.assign([TopicPartition(secured["digits"].inputs_topic, 0)])
        await asyncio.wait_for(consumer.getmany(timeout_ms=500), 60)  # its own input: allowed
        consumer.assign([TopicPartition(secured["digits"].nodes["model"].input_topics[0], 0)])
        with pytest.raises(Exception) as caught:  # noqa: B017,PT011 - its kind is what is asserted
            await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 60)
    finally:
        await consumer.stop()
    _refused(caught, "TOPIC_AUTHORIZATION_FAILED", "topic")


async def test_a_stage_is_refused_another_topologys_outputs(secured: dict) -> None:
    producer = AIOKafkaProducer(**_as(secured, "post").client_kwargs())  # post writes digits' outputs
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(secured["digits"].outputs_topic, b"{}"), 60)
        with pytest.raises(Exception) as caught:  # noqa: B017,PT011
            await asyncio.wait_for(producer.send_and_wait(secured["other"].outputs_topic, b"{}"), 60)
    finally:
        await producer.stop()
    _refused(caught, "TOPIC_AUTHORIZATION_FAILED", "topic")


async def test_a_stage_is_refused_another_stages_group(secured: dict) -> None:
    """pre may read its input, but not as a member of model's group."""
    digits = secured["digits"]
    consumer = AIOKafkaConsumer(group_id=digits.group_id("model"), enable_auto_commit=False,
                                **_as(secured, "pre").client_kwargs())
    await consumer.start()
    try:
        consumer.subscribe([digits.inputs_topic])
        with pytest.raises(Exception) as caught:  # noqa: B017,PT011
            await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 60)
    finally:
        await consumer.stop()
    _refused(caught, "GROUP_AUTHORIZATION_FAILED", "group")


async def test_the_tuner_reads_lag_logs_actions_and_grows_partitions_as_itself(secured: dict) -> None:
    """What ``flowserve tune`` does with Kafka, as the tuner's principal: the stages' lag, the actions topic
    (created on first use), arrivals on the inputs topic, and growing every topic. Last in this module: it
    leaves digits' topics with more partitions."""
    digits, kafka = secured["digits"], _as(secured, "tuner")
    reader = LagReader(kafka, digits)
    await reader.start()
    try:
        assert set(await asyncio.wait_for(reader.per_stage(), 60)) == set(digits.nodes)
    finally:
        await reader.close()
    log = ActionLog(digits, kafka)
    await asyncio.wait_for(log.start(), 60)  # creates the actions topic: only this principal may
    log(Action(at=1.0, stage="model", before=1, after=2, reason="a test"))
    await asyncio.wait_for(log.close(), 60)
    stop, arrivals = asyncio.Event(), []
    tail = asyncio.create_task(tail_arrivals(kafka, digits.inputs_topic, digits.spec.partitions, arrivals.extend,
                                             stop, from_start=True))
    await asyncio.sleep(2)
    stop.set()
    await asyncio.wait_for(tail, 60)
    assert arrivals  # the requests the serving test sent
    growth = PartitionGrowth(digits, kafka, partitions=digits.spec.partitions, limit=2 * digits.spec.partitions)
    assert await asyncio.wait_for(growth.grow(2 * digits.spec.partitions), 120) == 2 * digits.spec.partitions
    admin_view = await describe_partitions(secured["admin"], digits.topics())
    assert set(admin_view.values()) == {2 * digits.spec.partitions}
    refused = [d for d in decisions(secured["cluster"]) if d.principal == "flowserve-digits-tuner" and not d.allowed]
    assert refused == []
