"""The chaos run's HTTP front: ``flowserve gateway`` processes on one port that faults kill and start again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from flowserve.client.http import AsyncHttpClient
from flowserve.kafka.settings import KafkaSettings


class Gateways:
    """``count`` ``flowserve gateway`` processes on one fixed port that the chaos run kills and starts again.

    With two or more they share the port with SO_REUSEPORT (``--reuse-port``), as ``flowserve gateway
    --processes N`` runs them, each its own instance with its own reply topics; a restart takes one of them
    at a time (a crash: SIGKILL) and waits until it listens again, so another is always serving, as in a
    production set-up of more than one. With one, HTTP calls are refused while it restarts: its own figure.
    """

    def __init__(self, topology_path: Path, kafka: KafkaSettings, port: int, log_dir: Path, count: int) -> None:
        self.topology_path, self.kafka, self.port, self.log_dir = topology_path, kafka, port, log_dir
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.logs: list[Path | None] = [None] * count
        self.starts = 0

    def start(self, slot: int) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", FLOWSERVE_FETCH_MAX_WAIT_MS=str(self.kafka.fetch_max_wait_ms),
                   FLOWSERVE_IDEMPOTENCE="1" if self.kafka.idempotence else "0")
        cmd = [sys.executable, "-m", "flowserve", "gateway", str(self.topology_path), "--broker", self.kafka.bootstrap,
               "--port", str(self.port)] + (["--reuse-port"] if len(self.procs) > 1 else [])
        log = self.log_dir / f"gateway-{slot}-{self.starts}.log"
        with log.open("wb") as out:
            self.procs[slot] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.logs[slot] = log
        self.starts += 1

    async def listening(self, slot: int, timeout_s: float = 120.0) -> None:
        """Until gateway ``slot`` prints its URL, which it does once it listens (another may answer the port)."""
        proc, log = self.procs[slot], self.logs[slot]
        assert proc is not None and log is not None, f"gateway {slot} was never started"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(line.startswith(b"http://") for line in log.read_bytes().splitlines()):
                return
            if proc.poll() is not None:
                raise RuntimeError(f"gateway {slot} exited with {proc.returncode}; see {log}")
            await asyncio.sleep(0.1)  # polling a starting process's log, not a synchronisation
        raise RuntimeError(f"gateway {slot} did not listen on port {self.port} within {timeout_s:g} s; see {log}")

    async def ready(self, timeout_s: float = 120.0) -> None:
        """Every gateway listens, and the port answers ready."""
        for slot in range(len(self.procs)):
            await self.listening(slot, timeout_s)
        deadline = time.monotonic() + timeout_s
        http = AsyncHttpClient(f"http://127.0.0.1:{self.port}", timeout_s=5.0)
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
                    if (await http.get("/v2/health/ready")).status == 200:
                        return
                await asyncio.sleep(0.2)  # polling a starting server, not a synchronisation
        finally:
            await http.close()
        raise RuntimeError(f"the gateways on port {self.port} were not ready within {timeout_s:g} s")

    def kill(self, slot: int) -> None:
        proc = self.procs[slot]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
