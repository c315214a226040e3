"""Readiness: the broker answers and every stage of a topology has a live consumer-group member.

Uses Kafka's DescribeGroups API. aiokafka 0.14 pairs the v3 request with the v2 response schema (it
misses ``authorized_operations``) and fails to decode the answer, so this module sends its own request
type with the right response schema (v0..v3, the broker picks). Both the embedded broker (Tansu) and
Apache Kafka 4 answer it. Where a broker does not support DescribeGroups, readiness falls back to
"the broker answers a metadata request" and says so in the reason (``groups_checked`` is False).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError, IncompatibleBrokerVersion
from aiokafka.protocol.admin import (
    DescribeGroupsRequest_v0,
    DescribeGroupsRequest_v1,
    DescribeGroupsRequest_v2,
    DescribeGroupsRequest_v3,
    DescribeGroupsResponse_v3,
)
from aiokafka.protocol.api import Request, RequestStruct

from flowserve.kafka.settings import KafkaSettings
from flowserve.kafka.shutdown import bounded
from flowserve.topology.graph import Topology

log = logging.getLogger("flowserve.gateway")


class _DescribeGroupsRequestV3(RequestStruct):
    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = DescribeGroupsResponse_v3
    SCHEMA = DescribeGroupsRequest_v3.SCHEMA


class _DescribeGroups(
    Request[DescribeGroupsRequest_v0 | DescribeGroupsRequest_v1 | DescribeGroupsRequest_v2 | _DescribeGroupsRequestV3]
):
    API_KEY = 15

    def __init__(self, groups: list[str]) -> None:
        self.groups = groups

    def build(self, request_struct_class: type[Any]) -> Any:
        if request_struct_class.API_VERSION < 3:
            return request_struct_class(self.groups)
        return request_struct_class(self.groups, False)


#: how long a stage whose consumer group had members may show none before the gateway refuses its
#: requests. A frozen broker showed the group empty for 18 s in tests/integration/test_broker_faults.py:
#: the coordinator moved and dropped the members, which rejoined only once their workers' produce to the
#: frozen leader gave up; Kafka's own windows for such a fault are 9 s (broker.session.timeout.ms) to
#: 30 s (replica.lag.time.max.ms).
DEAD_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str
    groups_checked: bool = True
    #: stages whose consumer group has no member at all (not merely rebalancing): requests to them cannot
    #: be answered until a worker joins, so the gateway refuses them at once (503) instead of at the deadline
    dead: tuple[str, ...] = ()
    #: stages without a member that consumes now (none, or the group is rebalancing)
    missing: tuple[str, ...] = ()
    #: per stage, the members of its consumer group when the group is Stable (0 while it rebalances)
    members: Mapping[str, int] = field(default_factory=dict)


class ReadinessProbe:
    """Answers "is topology T ready?", caching each answer for ``cache_s`` seconds."""

    def __init__(self, topologies: Sequence[Topology], kafka: KafkaSettings, cache_s: float = 1.0) -> None:
        self.topologies = {t.name: t for t in topologies}
        self.kafka = kafka
        self.cache_s = cache_s
        self._admin: AIOKafkaAdminClient | None = None
        self._cache: tuple[float, dict[str, Readiness]] | None = None
        self._lock = asyncio.Lock()
        self._supported = True
        #: groups some probe saw with members -> since when it has been seen empty (None: not empty); see _dead
        self._empty_since: dict[str, float | None] = {}

    async def close(self) -> None:
        if self._admin is not None:
            await bounded(self._admin.close(), "gateway readiness probe: admin client close")
            self._admin = None

    async def check(self, max_age_s: float | None = None) -> dict[str, Readiness]:
        """Readiness of every served topology: an answer up to ``max_age_s`` old (default ``cache_s``)."""
        async with self._lock:
            now = time.monotonic()
            max_age = self.cache_s if max_age_s is None else max_age_s
            if self._cache is not None and now - self._cache[0] < max_age:
                return self._cache[1]
            try:
                result = await asyncio.wait_for(self._probe(), 5.0)
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready", with the reason
                await self.close()
                reason = f"Kafka at {self.kafka.bootstrap} does not answer: {exc!r}"
                result = {name: Readiness(False, reason) for name in self.topologies}
            self._cache = (time.monotonic(), result)
            return result

    async def _probe(self) -> dict[str, Readiness]:
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self.kafka.client_kwargs())
            await admin.start()
            self._admin = admin
        admin = self._admin
        if not self._supported:
            await admin._client.force_metadata_update()
            return {name: Readiness(True, "broker answers (consumer groups not checked)", False)
                    for name in self.topologies}
        groups = {t.group_id(n): (t.name, n) for t in self.topologies.values() for n in t.nodes}
        members: dict[str, int] = {}
        present: dict[str, int] = {}  # groups described without error: their member count
        by_node: dict[int, list[str]] = {}
        for group in groups:
            try:
                coordinator = await admin.find_coordinator(group)
            except GroupCoordinatorNotAvailableError:
                # No coordinator yet (a fresh cluster still creating its offsets topic): no worker has
                # joined this group, which is what "not ready" reports below.
                continue
            by_node.setdefault(coordinator, []).append(group)
        try:
            for node_id, ids in by_node.items():
                response = await admin._client.send(node_id, _DescribeGroups(ids))
                for g in response.groups:
                    error_code, group_id, state, members_list = g[0], g[1], g[2], g[5]
                    # Members of a group that is still rebalancing do not consume yet: only Stable counts.
                    members[group_id] = len(members_list) if not error_code and state == "Stable" else 0
                    if not error_code:
                        present[group_id] = len(members_list)
        except IncompatibleBrokerVersion:
            log.warning("broker does not support DescribeGroups: readiness only checks that it answers")
            self._supported = False
            return await self._probe()
        out: dict[str, Readiness] = {}
        for name, t in self.topologies.items():
            stable = {n: members.get(t.group_id(n), 0) for n in t.nodes}
            missing = [n for n, count in stable.items() if not count]
            dead = tuple(n for n in t.nodes if self._dead(t.group_id(n), present))
            if missing:
                out[name] = Readiness(False, f"model '{name}': stage(s) {', '.join(missing)} have no live worker "
                                             f"(consumer group {t.group_id(missing[0])} has no member or is "
                                             "rebalancing)", dead=dead, missing=tuple(missing), members=stable)
            else:
                out[name] = Readiness(True, "every stage has a live worker", members=stable)
        return out

    def _dead(self, group: str, present: dict[str, int]) -> bool:
        """No member at all, for long enough to say so. A group never seen with members is dead as soon as
        it is described empty or cannot be described (no coordinator yet). One that had members is dead
        once it has been described empty for ``DEAD_AFTER_S``, and never while it cannot be described:
        after a broker fault its coordinator moves and its members rejoin, and meanwhile it shows empty or
        not at all though its workers are alive and will answer."""
        if present.get(group):
            self._empty_since[group] = None
            return False
        if group not in self._empty_since:
            return True
        if group not in present:  # not describable now: nothing new is known about it
            return False
        now = time.monotonic()
        since = self._empty_since[group]
        if since is None:
            since = self._empty_since[group] = now
        log.debug("consumer group %s has no member (for %.1f s)", group, now - since)
        return now - since > DEAD_AFTER_S
