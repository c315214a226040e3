"""The two halves of ParM's code, free of Kafka: grouping and encoding requests, decoding a late output.

:class:`Encoder` groups requests bound for a protected node, in arrival order, k at a time, into one parity
query (the sum of their inputs, or their images tiled: :mod:`flowserve.parity.codes`); the members of a
group come from different stripes of partitions, so that different workers compute them. A group still
open ``wait_ms`` after its first member is given up: the members are never held (they travel to the
protected node at once), only the parity query is not sent. Requests of different row counts never share
a group.

:class:`Decoder` holds the protected node's outputs and the parity outputs. As soon as k of a group's k+1
are present and one real output is missing, it reconstructs that one as ``parity - sum(others)``. A real
output arriving after its reconstruction is a late duplicate (its readers drop it).

Both take the clock as an argument (milliseconds), so tests drive them with a fake one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from flowserve.parity.codes import Encoding, encode

Headers = Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class Member:
    """One request of a parity group: its id, its partition, and the headers its rebuilt output must carry."""

    request_id: str
    partition: int = 0
    headers: Headers = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Group:
    """A formed parity group: its id, partition, members in arrival order, and the encoded query."""

    group_id: str
    partition: int
    members: tuple[Member, ...]
    query: dict[str, np.ndarray]


@dataclass
class _Open:
    first_ms: float
    partition: int  # the first member's: where the parity query goes
    members: list[Member]
    stripes: set[int]
    inputs: list[Mapping[str, np.ndarray]]  # each member's rows by port, in arrival order


@dataclass
class EncoderCounters:
    groups: int = 0  # groups formed (k members), each one parity query
    abandoned: int = 0  # groups given up after wait_ms with fewer than k members


class Encoder:
    """Groups requests into parity queries, each member from another stripe of partitions.

    A group protects its members only if they are computed by different workers: the members of one
    partition are all read by the same worker, so they must not share a group. Partitions are cut into
    ``k`` stripes of consecutive partitions (``stripe = partition * k // partitions``); a request joins the
    oldest open group with no member from its stripe. Range assignment gives each worker of the protected
    node consecutive partitions, so with k workers (or a multiple) the members of a group are on distinct
    workers. The parity query goes to the first member's partition.
    """

    def __init__(self, k: int, wait_ms: float, partitions: int, encoding: Encoding = "sum",
                 image: tuple[int, int] | None = None) -> None:
        if k < 2:
            raise ValueError("k must be at least 2")
        self.k = k
        self.encoding: Encoding = encoding
        self.image = image
        self.wait_ms = wait_ms
        self.partitions = partitions
        #: row count -> open groups, oldest first
        self._open: dict[int, list[_Open]] = {}
        self.counters = EncoderCounters()

    def stripe(self, partition: int) -> int:
        return partition * self.k // max(self.partitions, self.k)

    def add(self, partition: int, member: Member, inputs: Mapping[str, np.ndarray], now_ms: float) -> Group | None:
        """Add one request (its input rows by port); returns the group it completes, if it does."""
        rows = next(iter(inputs.values())).shape[0]
        self._expire(now_ms)
        stripe = self.stripe(partition)
        groups = self._open.setdefault(rows, [])
        group = next((g for g in groups if stripe not in g.stripes), None)
        if group is None:  # a new group
            groups.append(_Open(now_ms, partition, [member], {stripe}, [inputs]))
            return None
        group.members.append(member)
        group.stripes.add(stripe)
        group.inputs.append(inputs)
        if len(group.members) < self.k:
            return None
        groups.remove(group)
        self.counters.groups += 1
        query = {p: encode(self.encoding, np.stack([m[p] for m in group.inputs], axis=1), image=self.image)
                 for p in inputs}
        return Group(f"{group.members[0].request_id}~p{self.k}", group.partition, tuple(group.members), query)

    def expire(self, now_ms: float) -> int:
        """Give up every group open longer than ``wait_ms``; returns how many."""
        return self._expire(now_ms)

    def _expire(self, now_ms: float) -> int:
        gone = 0
        for groups in self._open.values():
            while groups and now_ms - groups[0].first_ms > self.wait_ms:
                groups.pop(0)
                gone += 1
        self.counters.abandoned += gone
        return gone

    def __len__(self) -> int:
        return sum(len(g) for g in self._open.values())


@dataclass(frozen=True, slots=True)
class Reconstructed:
    """A decoded output: the missing member, its group, and its outputs by port."""

    member: Member
    group_id: str
    outputs: dict[str, np.ndarray]
    #: every member of the group, in arrival order (lineage)
    members: tuple[str, ...] = ()


@dataclass
class _Pending:
    seen_ms: float
    members: tuple[Member, ...]
    parity: dict[str, np.ndarray]


@dataclass
class DecoderCounters:
    parity_outputs: int = 0
    reconstructed: int = 0
    late_real: int = 0  # real outputs that arrived after their reconstruction
    lost_groups: int = 0  # groups forgotten before k of k+1 arrived


class Decoder:
    """Holds outputs and parity outputs; reconstructs a missing output once k of k+1 are present."""

    def __init__(self, hold_ms: float, max_outputs: int = 200_000) -> None:
        self.hold_ms = hold_ms
        self.max_outputs = max_outputs
        #: request id -> (arrival, outputs): recent real outputs, oldest first
        self._real: OrderedDict[str, tuple[float, dict[str, np.ndarray]]] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        self._member_of: dict[str, str] = {}  # request id -> pending group id
        #: request id -> arrival: outputs already reconstructed (a real one after them is late)
        self._rebuilt: OrderedDict[str, float] = OrderedDict()
        self.counters = DecoderCounters()

    def real(self, request_id: str, outputs: dict[str, np.ndarray], now_ms: float) -> list[Reconstructed]:
        """A real output of the protected node arrived."""
        if request_id in self._rebuilt:
            del self._rebuilt[request_id]
            self.counters.late_real += 1
            return []
        self._real[request_id] = (now_ms, outputs)
        self._trim(now_ms)
        gid = self._member_of.get(request_id)
        return self._try(gid) if gid is not None else []

    def parity(self, group_id: str, members: Sequence[Member], outputs: dict[str, np.ndarray],
               now_ms: float) -> list[Reconstructed]:
        """The parity model's output for a group arrived."""
        self.counters.parity_outputs += 1
        self._pending[group_id] = _Pending(now_ms, tuple(members), outputs)
        for m in members:
            self._member_of[m.request_id] = group_id
        return self._try(group_id)

    def expire(self, now_ms: float) -> None:
        """Forget groups and outputs older than ``hold_ms``."""
        for gid in [g for g, p in self._pending.items() if now_ms - p.seen_ms > self.hold_ms]:
            self.counters.lost_groups += 1
            self._close(gid)
        self._trim(now_ms)

    def _trim(self, now_ms: float) -> None:
        real, rebuilt = self._real, self._rebuilt
        while real and (len(real) > self.max_outputs or now_ms - next(iter(real.values()))[0] > self.hold_ms):
            real.popitem(last=False)
        while rebuilt and (len(rebuilt) > self.max_outputs or now_ms - next(iter(rebuilt.values())) > self.hold_ms):
            rebuilt.popitem(last=False)

    def _close(self, gid: str) -> None:
        pending = self._pending.pop(gid)
        for m in pending.members:
            self._member_of.pop(m.request_id, None)

    def _try(self, gid: str) -> list[Reconstructed]:
        pending = self._pending[gid]
        missing = [m for m in pending.members if m.request_id not in self._real]
        if not missing:  # every real output arrived: nothing to do
            self._close(gid)
            return []
        if len(missing) > 1:
            return []
        (lost,) = missing
        decoded: dict[str, np.ndarray] = {}
        for port, total in pending.parity.items():
            acc = total.astype(np.float64)
            for m in pending.members:
                if m is not lost:
                    acc = acc - self._real[m.request_id][1][port]
            decoded[port] = acc.astype(total.dtype)
        self._close(gid)
        self._rebuilt[lost.request_id] = pending.seen_ms
        self.counters.reconstructed += 1
        return [Reconstructed(lost, gid, decoded, tuple(m.request_id for m in pending.members))]
