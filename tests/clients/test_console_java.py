"""Apache Kafka's own console producer and consumer (the Java clients, run from the fetched jars) send a
V2 JSON request with headers and read its answer with its headers."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from fs_clients import Served, answer_of, v2_request

from flowserve.errors import BrokerError
from flowserve.kafka.brokers.apache_kafka import kafka_tools_dir

pytestmark = [pytest.mark.external,  # Kafka's Java console clients
            pytest.mark.asyncio(loop_scope="session")]

#: The Java producer is idempotent by default; the embedded broker refuses InitProducerId (see
#: KafkaSettings.idempotence), so there it is turned off, as flowserve's own producers have it.
IDEMPOTENCE = {"embedded": ("--producer-property", "enable.idempotence=false")}
JVM = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")


@pytest.fixture(scope="module")
def tools() -> Path:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java is not installed")
    try:
        return kafka_tools_dir()
    except BrokerError as exc:
        pytest.skip(str(exc))


def _java(tools: Path, main: str, *args: str, stdin: bytes | None = None) -> str:
    java = str(Path(os.environ["JAVA_HOME"], "bin", "java")) if os.environ.get("JAVA_HOME") else "java"
    done = subprocess.run([java, *JVM, "-cp", str(tools / "*"), main, *args], input=stdin, capture_output=True,
                          timeout=120, check=False)
    out = done.stdout.decode(errors="replace")
    if main.endswith("ConsoleProducer"):
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return out


async def test_console_producer_and_consumer_with_headers(served: Served, tools: Path) -> None:
    rid = f"java-{uuid.uuid4().hex[:8]}"
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    # One line: headers <TAB> key <TAB> value (parse.headers / parse.key); the key is the request id.
    line = f"x-client:console,fs-id:{rid}\t{rid}\t".encode() + v2_request(rid, x) + b"\n"
    await asyncio.to_thread(
        _java, tools, "org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", served.kafka.bootstrap,
        "--topic", served.topology.inputs_topic, "--property", "parse.key=true", "--property", "parse.headers=true",
        *IDEMPOTENCE.get(served.broker_kind, ()), stdin=line)
    out = ""
    for _ in range(3):
        # Partition by partition, without a consumer group: on the embedded broker the console consumer's
        # group join did not complete within its timeout (a consumer group is not what is tested here).
        for partition in range(served.topology.spec.partitions):
            out = await asyncio.to_thread(
                _java, tools, "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                served.kafka.bootstrap, "--topic", served.topology.outputs_topic, "--partition", str(partition),
                "--offset", "earliest", "--timeout-ms", "8000", "--property", "print.key=true",
                "--property", "print.headers=true")
            for row in out.splitlines():
                headers, _, rest = row.partition("\t")
                key, _, value = rest.partition("\t")
                if key == rid:
                    np.testing.assert_array_equal(answer_of(value.encode()), x + 1)
                    assert "x-client:console" in headers.split(","), headers
                    return
    raise AssertionError(f"the console consumer found no answer keyed {rid}; it printed:\n{out[-2000:]}")
