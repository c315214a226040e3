"""``flowserve gateway --processes N``: N gateway processes on one port, for more than one core of HTTP work.

Each process is a whole gateway (``flowserve gateway --reuse-port``) with its own instance name, hence its
own reply topics (``<prefix>.<topology>.replies.<instance>``): a worker answers on the reply topic the
request named, so a reply reaches only the process holding its caller's connection. The kernel spreads
incoming connections over the processes (SO_REUSEPORT, Linux and the BSDs); a connection stays with the
process that accepted it. This process only starts them, prints the URL once every one listens, passes
SIGTERM/SIGINT on, and ends when any of them ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence

from flowserve.console import make_console
from flowserve.gateway.settings import GatewaySettings

console = make_console(stderr=True)


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT: it fixes the port when ``port``
    is 0 and keeps it from other programs until the gateways listen on it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def run_group(topologies: Sequence[str], broker: str, settings: GatewaySettings, processes: int, *,
              token_file: str | None = None, max_inflight: int | None = None, verbose: bool = False,
              plans: Sequence[str] = ()) -> int:
    """Start ``processes`` gateways on one port serving the topology files ``topologies`` from the Kafka at
    ``broker``; return when a signal stops them or one ends (exit status 1, 2 where SO_REUSEPORT is missing)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        console.print("[red]--processes needs SO_REUSEPORT, which this platform lacks[/]")
        return 2
    reserved = _reserve(settings.host, settings.port)
    port = reserved.getsockname()[1]
    base = os.environ.get("FLOWSERVE_GATEWAY_INSTANCE") or uuid.uuid4().hex[:12]
    cmd = [sys.executable, "-m", "flowserve", "gateway", *topologies, "--broker", broker,
           "--host", settings.host, "--port", str(port), "--reuse-port"]
    for plan in plans:
        cmd += ["--plan", plan]
    if token_file:
        cmd += ["--token-file", token_file]
    if max_inflight:
        cmd += ["--max-inflight", str(max_inflight)]
    if verbose:
        cmd.append("-v")
    children: list[subprocess.Popen[str]] = []
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for k in range(processes):
            env = {**os.environ, "FLOWSERVE_GATEWAY_INSTANCE": f"{base}-{k}"}
            child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
            children.append(child)
            assert child.stdout is not None
            if not child.stdout.readline().startswith("http://"):  # it listens once it prints its URL
                console.print(f"[red]gateway process {k} did not start[/]")
                return 1
        reserved.close()
        console.print(f"[green]gateway[/]: {processes} processes on port {port} (instances {base}-0..)")
        print(f"http://{settings.host}:{port}", flush=True)
        while not stop.wait(0.5):  # polling the children for an exit, not synchronisation
            if any(c.poll() is not None for c in children):
                console.print("[red]a gateway process ended; stopping the others[/]")
                return 1
        return 0
    finally:
        reserved.close()
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
