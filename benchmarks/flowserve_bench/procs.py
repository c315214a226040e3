"""Which processes serve a port, and their CPU time: per-process CPU per request on the request-reply path.

A server the bench did not start (a broker given by address, any V2 server behind ``--against``) is found
by the port it listens on: ``/proc/net/tcp*`` names the socket inode, ``/proc/<pid>/fd`` the process
holding it. Its child processes count with it (MLServer's inference workers, a JVM's helpers). Linux only;
elsewhere nothing is found and CPU shows as 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from flowserve_bench.common import cpu_seconds, stat_cpu_seconds

_LISTEN = "0A"


def listener_pids(port: int) -> list[int]:
    """The processes with a socket listening on ``port`` (any address), oldest first."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return sorted(pids)


def with_children(pids: Iterable[int]) -> list[int]:
    """``pids`` and all their descendants."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out = list(dict.fromkeys(pids))
    seen = set(out)
    i = 0
    while i < len(out):
        for child, ppid in parent.items():
            if ppid == out[i] and child not in seen:
                seen.add(child)
                out.append(child)
        i += 1
    return out


def cpu_of(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) of these processes together (0 for those gone)."""
    return sum(cpu_seconds(p) for p in pids)


def jit_cpu(pids: Iterable[int]) -> float:
    """CPU seconds of the JIT compiler threads of these processes (JVMs name them ``C1/C2 CompilerThread<n>``;
    0 for a process that is not a JVM): how much a broker is still compiling its hot paths."""
    total = 0.0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                compiler = (task / "comm").read_text().startswith(("C1 Compiler", "C2 Compiler"))
            except OSError:
                continue
            if compiler:
                total += stat_cpu_seconds(task / "stat")
    return total
