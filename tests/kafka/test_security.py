"""Kafka security end to end: Apache Kafka with a SASL/SCRAM listener and a TLS listener (a throwaway CA
and certificates made here); a topology served through each by worker processes (the default faust host),
a gateway, the client and the CLI, all configured by FLOWSERVE_* variables; a wrong password fails fast
and says why; the password never appears in a worker's log."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import wait_ready
from flowserve.errors import BrokerError
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.kafka.admin import ensure_topics
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost
from flowserve.topology import load_topology

pytestmark = pytest.mark.slow

USER, PASSWORD = "alice", "s3cret-Pa55word-9f2c"  # the password is grepped for in the logs
TOPOLOGY = """
name: NAME
partitions: 2
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: a.x}
"""


def _certificates(folder: Path) -> tuple[Path, Path]:
    """A CA and a broker certificate for 127.0.0.1/localhost signed by it: (ca.pem, broker key+chain .pem)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key, issuer: str, issuer_key, *, ca: bool):  # noqa: ANN001, ANN202
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, broker_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("flowserve test CA", ca_key, "flowserve test CA", ca_key, ca=True)
    broker_cert = cert("127.0.0.1", broker_key, "flowserve test CA", ca_key, ca=False)
    pem = serialization.Encoding.PEM
    ca_file, keystore = folder / "ca.pem", folder / "broker.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    keystore.write_bytes(broker_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption())
                         + broker_cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    return ca_file, keystore


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path]]:
    """Apache Kafka with PLAINTEXT, SASL_PLAINTEXT (SCRAM) and SSL listeners; and the CA file."""
    if "kafka" not in os.environ.get("FLOWSERVE_TEST_BROKERS", "embedded,kafka").split(","):
        pytest.skip("security is tested on Apache Kafka (FLOWSERVE_TEST_BROKERS leaves it out)")
    from flowserve.kafka.brokers.apache_kafka import ApacheKafka

    ca_file, keystore = _certificates(tmp_path_factory.mktemp("tls"))
    cluster = ApacheKafka.start(
        listeners={"SASL": "SASL_PLAINTEXT", "TLS": "SSL"}, scram_users={USER: PASSWORD},
        config={"sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
                "listener.name.sasl.scram-sha-256.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.tls.ssl.keystore.type": "PEM",
                "listener.name.tls.ssl.keystore.location": keystore})
    try:
        yield cluster, ca_file
    finally:
        cluster.stop()


def _environment(cluster, ca_file: Path, protocol: str, password: str = PASSWORD) -> dict[str, str]:  # noqa: ANN001
    if protocol == "SASL_PLAINTEXT":
        return {"FLOWSERVE_BOOTSTRAP": f"127.0.0.1:{cluster.listener_ports['SASL']}",
                "FLOWSERVE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FLOWSERVE_SASL_MECHANISM": "SCRAM-SHA-256",
                "FLOWSERVE_SASL_USERNAME": USER, "FLOWSERVE_SASL_PASSWORD": password}
    return {"FLOWSERVE_BOOTSTRAP": f"127.0.0.1:{cluster.listener_ports['TLS']}",
            "FLOWSERVE_SECURITY_PROTOCOL": "SSL", "FLOWSERVE_SSL_CAFILE": str(ca_file)}


# Every step has its own bound (their sum is past the suite's 300 s), so a stall fails naming the step.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SSL"])
async def test_a_topology_runs_through_a_secured_listener(secured, protocol: str, write_topology, tmp_path: Path,  # noqa: ANN001
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, ca_file = secured
    for name, value in _environment(cluster, ca_file, protocol).items():
        monkeypatch.setenv(name, value)  # worker processes inherit them; this process reads them too
    kafka = KafkaSettings.from_env()
    assert kafka.security_protocol == protocol and PASSWORD not in repr(kafka) + str(kafka)
    path = write_topology(TOPOLOGY)
    topology = load_topology(path)
    host = ProcessHost(path, topology, kafka, log_dir=tmp_path / "logs")  # workers: the default (faust) host
    await asyncio.wait_for(host.start(), 60)
    try:
        async with TopologyClient(topology, kafka) as client:
            await wait_ready(client, {"x": np.zeros((1, 4), np.float32)}, timeout_s=120)
            reply = await client.call({"x": np.full((2, 4), 5, np.float32)}, timeout_ms=60_000)
        assert reply.error is None, reply.error
        np.testing.assert_array_equal(reply.tensors["y"], np.full((2, 4), 6, np.float32))
        # the gateway, with the same settings
        async with asyncio.timeout(120), Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, \
                AsyncHttpClient(gateway.url) as http:
            answer = await http.infer(topology.name, {"x": np.full((1, 4), 1, np.float32)})
        np.testing.assert_array_equal(answer.raise_for_status().outputs()["y"], np.full((1, 4), 2, np.float32))
        # the CLI (its readiness probe reads the consumer groups), configured by the variables alone
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flowserve", "health", str(path), "--broker", kafka.bootstrap,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(probe.communicate(), 120)
        assert probe.returncode == 0, out.decode(errors="replace")
        assert host.alive() == {"a": 1}
    finally:
        await asyncio.wait_for(asyncio.to_thread(host.stop), 120)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert PASSWORD not in logs


async def test_a_wrong_password_is_a_clear_error(secured) -> None:  # noqa: ANN001
    cluster, ca_file = secured
    kafka = KafkaSettings(**{k.removeprefix("FLOWSERVE_").lower(): v for k, v in _environment(
        cluster, ca_file, "SASL_PLAINTEXT", password="wrong-password").items()})
    with pytest.raises(BrokerError, match="(?i)authentication") as caught:
        await asyncio.wait_for(ensure_topics(kafka, ["never-created"], 1), 60)
    assert "wrong-password" not in str(caught.value)


@pytest.mark.parametrize(("protocol", "expected"), [("SASL_PLAINTEXT", "authentication"), ("SSL", "certificate")])
def test_a_worker_that_cannot_connect_exits_saying_why(secured, write_topology, protocol: str, expected: str) -> None:  # noqa: ANN001
    """A wrong password, or a broker certificate not signed by a CA the worker was given (none here)."""
    cluster, ca_file = secured
    path = write_topology(TOPOLOGY)
    env = {**os.environ, **_environment(cluster, ca_file, protocol, password="wrong-password")}
    env.pop("FLOWSERVE_SSL_CAFILE", None)
    argv = [sys.executable, "-m", "flowserve", "worker", str(path), "a", "--broker", env["FLOWSERVE_BOOTSTRAP"]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    said = done.stderr + done.stdout
    assert "cannot reach Kafka" in said and expected in said.lower(), said[-2000:]
    assert "wrong-password" not in said
