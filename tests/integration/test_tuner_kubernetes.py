"""``flowserve tune --kubernetes`` against a real API server: kube-apiserver built from the Kubernetes
sources (``deploy/k8s/build-apiserver.sh``), etcd and kubectl from Debian. There is no kubelet, so no pod
runs: the tuner only changes what the API server holds (a Deployment's replicas, a KEDA ScaledObject's
bounds), and that is what these tests read back. Skipped where the three programs are missing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from fs_testkit import ONE_EMULATED_STAGE

from flowserve.client import TopologyClient
from flowserve.deploy.render import Plan as DeployPlan
from flowserve.deploy.render import kubernetes
from flowserve.errors import FlowserveError
from flowserve.kafka.brokers.process import dies_with_us, free_port
from flowserve.runtime.host import create_topology_topics
from flowserve.topology import Topology, load_topology
from flowserve.topology.names import deployment_name
from flowserve.tuning.plan import Plan, apply_plan, save_plan
from flowserve.tuning.scalers import KubernetesScaler
from flowserve.tuning.stages import StageConfig

pytestmark = pytest.mark.external  # kube-apiserver built from the Kubernetes sources, etcd, kubectl

ROOT = Path(__file__).resolve().parents[2]
VERSION = "1.34.4"

# the CRDs the rendered objects need (KEDA's and Strimzi's, vendored for the offline schema tests)
CRDS = ROOT / "tests" / "deploy" / "schemas"


def _apiserver() -> str | None:
    given = os.environ.get("FLOWSERVE_KUBE_APISERVER")
    cached = Path.home() / ".cache" / "flowserve" / "k8s" / VERSION / "kube-apiserver"
    for candidate in (given, str(cached), shutil.which("kube-apiserver")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    # as the brokers start theirs: the child dies with this process even if the test run is killed
    with log.open("wb") as out:
        return subprocess.Popen(dies_with_us(args), stdout=out, stderr=subprocess.STDOUT)


def _kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running etcd + kube-apiserver; yields a kubeconfig with cluster-admin rights."""
    apiserver, etcd = _apiserver(), shutil.which("etcd")
    if apiserver is None or etcd is None or shutil.which("kubectl") is None or shutil.which("openssl") is None:
        pytest.skip("needs kube-apiserver (deploy/k8s/build-apiserver.sh), etcd (Debian etcd-server), kubectl "
                    "and openssl")
    d = tmp_path_factory.mktemp("kube")
    client, peer, secure = free_port(), free_port(), free_port()
    procs = [_start([etcd, "--name", "t", "--data-dir", str(d / "etcd"),
                     "--listen-client-urls", f"http://127.0.0.1:{client}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client}",
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", f"t=http://127.0.0.1:{peer}"], d / "etcd.log")]
    subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
                   check=True, capture_output=True)
    token = os.urandom(16).hex()
    (d / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    procs.append(_start([apiserver, f"--etcd-servers=http://127.0.0.1:{client}", "--bind-address=127.0.0.1",
                         f"--secure-port={secure}", "--advertise-address=127.0.0.1", f"--cert-dir={d / 'certs'}",
                         f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
                         "--service-account-issuer=https://kubernetes.default.svc",
                         f"--service-account-key-file={d / 'sa.pub'}",
                         f"--service-account-signing-key-file={d / 'sa.key'}",
                         "--service-cluster-ip-range=10.96.0.0/24"], d / "apiserver.log"))
    config = d / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"https://127.0.0.1:{secure}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "admin"}}]}))
    os.environ["KUBECONFIG"] = str(config)  # what a user has; kubectl (and so the tuner) reads it
    try:
        deadline = time.monotonic() + 120
        while _kubectl("get", "namespace", "default", check=False).returncode != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                logs = "\n".join((d / f).read_text()[-3000:] for f in ("etcd.log", "apiserver.log"))
                raise AssertionError(f"the API server did not come up:\n{logs}")
            time.sleep(1)
        yield config
    finally:
        os.environ.pop("KUBECONFIG", None)
        for p in reversed(procs):
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.poll() is None:
                p.kill()


def _apply(objects: list[dict]) -> None:
    _kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def _replicas(topology: str, node: str) -> int:
    return int(_kubectl("get", f"deployment/{deployment_name(topology, node)}",
                        "-o", "jsonpath={.spec.replicas}").stdout)


def _rendered(topology: Topology, kind: str) -> list[dict]:
    return [o for o in kubernetes(topology, "t.yaml", DeployPlan()) if o["kind"] == kind]


def test_the_scaler_sets_the_rendered_deployments_and_pins_keda_where_it_scales(kube: Path) -> None:
    topology = load_topology(ROOT / "topologies" / "digits.yaml")
    nodes = list(topology.nodes)  # the order they are rendered in
    _apply(_rendered(topology, "Deployment"))
    # no KEDA in the cluster yet: the scaler sets the Deployments' replicas
    scaler = KubernetesScaler(topology.name, "default")
    scaler.load()
    assert scaler.current() == {n: topology.nodes[n].replicas for n in nodes}
    asyncio.run(scaler.scale(nodes[0], 3))
    assert _replicas(topology.name, nodes[0]) == 3 and scaler.current()[nodes[0]] == 3

    # KEDA (and Strimzi) installed, and everything rendered applied but the last node's ScaledObject; the
    # API server validates each object against its schema, the CRDs' included
    for crd in ("keda.sh_scaledobjects.yaml", "strimzi-kafka.yaml", "strimzi-kafkanodepool.yaml",
                "strimzi-kafkatopic.yaml"):
        _kubectl("apply", "--server-side", "-f", str(CRDS / crd))
    _kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/scaledobjects.keda.sh",
             "crd/kafkas.kafka.strimzi.io", "crd/kafkanodepools.kafka.strimzi.io", "crd/kafkatopics.kafka.strimzi.io")
    objects = kubernetes(topology, "t.yaml", DeployPlan())
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert [o["spec"]["scaleTargetRef"]["name"] for o in scaled] == [deployment_name(topology.name, n) for n in nodes]
    _apply([o for o in objects if o["kind"] != "Deployment" and o is not scaled[-1]])  # the rest
    scaler = KubernetesScaler(topology.name, "default")
    scaler.load()
    assert scaler.current()[nodes[0]] == 3  # read back from the cluster
    asyncio.run(scaler.scale(nodes[0], 4))
    pinned = json.loads(_kubectl("get", f"scaledobjects.keda.sh/{deployment_name(topology.name, nodes[0])}",
                                 "-o", "json").stdout)["spec"]
    assert (pinned["minReplicaCount"], pinned["maxReplicaCount"]) == (4, 4)
    assert _replicas(topology.name, nodes[0]) == 3  # KEDA's to change, not ours
    asyncio.run(scaler.scale(nodes[-1], 2))  # no ScaledObject: its Deployment
    assert _replicas(topology.name, nodes[-1]) == 2

    # grown partitions (--max-partitions): the topology's KafkaTopics follow, the control topic stays at 1
    asyncio.run(KubernetesScaler(topology.name, "default", topics=topology.topics()).grown(8))
    declared = {o["spec"]["topicName"]: o["spec"]["partitions"] for o in json.loads(
        _kubectl("get", "kafkatopics.kafka.strimzi.io", "-l", f"flowserve/topology={topology.name}", "-o", "json"
                 ).stdout)["items"]}
    assert declared == {**dict.fromkeys(topology.topics(), 8), topology.control_topic: 1}

    with pytest.raises(FlowserveError, match="no Deployments of topology 'digits' in namespace 'nowhere'"):
        KubernetesScaler(topology.name, "nowhere").load()
    # a failing kubectl leaves the stage as it was and the tuner running
    asyncio.run(KubernetesScaler(topology.name, "nowhere").scale(nodes[0], 5))


async def test_flowserve_tune_scales_a_deployment_on_a_step_and_back_after_the_hold(
        kube: Path, kafka, write_topology: Callable[[str], Path], tmp_path: Path) -> None:
    path = write_topology(ONE_EMULATED_STAGE.replace("PARTITIONS", "4"))
    base = load_topology(path)
    plan = Plan(base.name, slo_ms=400, partitions=4, hop_ms=5, stages={"m": StageConfig("cpu", 4, 1)})
    save_plan(plan, tmp_path / "plan.json")
    topology = apply_plan(base, plan)
    await create_topology_topics(topology, kafka)
    _apply(_rendered(topology, "Deployment"))
    tune = subprocess.Popen(
        [sys.executable, "-m", "flowserve", "tune", str(path), "--plan", str(tmp_path / "plan.json"),
         "--broker", kafka.bootstrap, "--kubernetes", "default", "--hold-s", "2", "--horizon-s", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    replicas: list[int] = []
    try:
        await asyncio.sleep(3)  # the tuner tails the inputs from their end: let it start first
        async with TopologyClient(topology, kafka) as client:
            x = np.zeros((1, 4), np.float32)
            for i in range(1500):  # 150/s: ~3 consumers' worth (nothing consumes: no pod runs)
                await client.send({"x": x}, request_id=f"r{i}")
                await asyncio.sleep(1 / 150)
                if i % 150 == 0:
                    replicas.append(_replicas(topology.name, "m"))
                    if replicas[-1] > 1:
                        break
            assert replicas[-1] > 1, f"the Deployment stayed at {replicas} replicas"
            for _ in range(30):  # quiet: after the horizon and the hold it comes back to one
                await client.send({"x": x}, request_id=f"q{time.monotonic()}")
                await asyncio.sleep(1)
                replicas.append(_replicas(topology.name, "m"))
                if replicas[-1] == 1:
                    break
            assert replicas[-1] == 1, f"not back to one replica: {replicas}"
    finally:
        tune.send_signal(signal.SIGINT)
        output, _ = tune.communicate(timeout=30)
    assert "scale m 1 -> " in output, output
