"""Restart the worker processes of a :class:`~flowserve.runtime.host.ProcessHost` that die.

A worker that exits with status 0 was told to stop (``flowserve control T stop``) and stays stopped. One
that dies otherwise (a crash, SIGKILL, the OOM killer) is restarted after a backoff that doubles with each
quick death in a row (``initial_backoff_s`` .. ``max_backoff_s``) and starts over once a worker has run
``healthy_after_s``. ``max_quick_deaths`` quick deaths in a row are a crash loop: restarting again would
only hide it, so the supervisor gives up and says which node, how often and with what exit status.
Kafka makes restarts safe: a worker commits only what it has answered, so its successor in the consumer
group takes over from there.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flowserve.runtime.host import ProcessHost

log = logging.getLogger("flowserve.supervise")


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    #: a worker that ran this long before dying had been healthy: its backoff starts over
    healthy_after_s: float = 30.0
    #: this many deaths in a row, each within ``healthy_after_s`` of its start, is a crash loop
    max_quick_deaths: int = 5


def describe_exit(returncode: int) -> str:
    """``exit status 3`` or ``signal SIGKILL`` (Popen reports death by signal N as ``-N``)."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


@dataclass
class _Slot:
    started: float
    quick_deaths: int = 0
    restart_at: float | None = None
    done: bool = False


@dataclass
class Supervisor:
    """Watches ``host``'s processes from a thread; :meth:`start` after the host has spawned them."""

    host: ProcessHost
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    #: called with each line worth telling the operator (deaths, restarts, giving up); also logged
    report: Callable[[str], None] = lambda line: None
    #: called once, from the supervisor's thread, when a node is in a crash loop
    on_give_up: Callable[[str], None] = lambda message: None
    poll_s: float = 0.2
    #: node -> the message it was given up with
    gave_up: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    _slots: dict[tuple[str, int], _Slot] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        now = time.monotonic()
        self._slots = {(node, i): _Slot(now) for node, procs in self.host.procs.items() for i in range(len(procs))}
        self._thread = threading.Thread(target=self._loop, name="flowserve-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the host stops its workers, or their exits would be restarted)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One pass: note deaths, restart the slots whose backoff has run out."""
        for (node, index), slot in self._slots.items():
            if slot.done or self._stop.is_set():
                continue
            if slot.restart_at is not None:
                if now >= slot.restart_at:
                    try:
                        self.host.restart(node, index)
                    except OSError as exc:  # cannot even start it (fd limit, memory): retry at the next backoff
                        slot.quick_deaths += 1
                        slot.restart_at = now + min(self.policy.initial_backoff_s * 2 ** slot.quick_deaths,
                                                    self.policy.max_backoff_s)
                        self._say(f"could not restart worker {node}[{index}]: {exc}", logging.ERROR)
                        continue
                    slot.started, slot.restart_at = time.monotonic(), None
                    self.restarts += 1
                    self._say(f"restarted worker {node}[{index}] (pid {self.host.procs[node][index].pid})")
                continue
            proc = self.host.procs[node][index]
            code = proc.poll()
            if code is None:
                continue
            ran = now - slot.started
            if code == 0:
                slot.done = True
                self._say(f"worker {node}[{index}] (pid {proc.pid}) stopped with exit status 0; not restarted")
                continue
            slot.quick_deaths = slot.quick_deaths + 1 if ran < self.policy.healthy_after_s else 1
            if slot.quick_deaths >= self.policy.max_quick_deaths:
                slot.done = True
                message = (f"giving up on node '{node}': its worker died {slot.quick_deaths} times in a row, each "
                           f"within {self.policy.healthy_after_s:g} s of starting (last: {describe_exit(code)}); "
                           "see the worker's log (flowserve run --log-dir DIR)")
                self.gave_up[node] = message
                self._say(message, logging.ERROR)
                self.on_give_up(message)
                continue
            delay = min(self.policy.initial_backoff_s * 2 ** (slot.quick_deaths - 1), self.policy.max_backoff_s)
            slot.restart_at = now + delay
            self._say(f"worker {node}[{index}] (pid {proc.pid}) died with {describe_exit(code)} after {ran:.1f} s; "
                      f"restarting in {delay:g} s", logging.WARNING)

    def _say(self, line: str, level: int = logging.INFO) -> None:
        log.log(level, "%s", line)
        self.report(line)
