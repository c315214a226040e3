"""One base error for flowserve; every error and every failed request carries a machine-readable kind.

The kind says *what* went wrong in one word a program can act on; the message says it for people. A
request that fails inside a pipeline travels on as an error result whose ``fs-error-kind`` header holds
the kind (:data:`flowserve.wire.envelope.H_ERROR_KIND`), so a caller in another process (the gateway, a
Kafka client) chooses what to do by kind, never by the wording of the reason.

Domain errors never carry HTTP status codes: the gateway maps kinds to statuses in one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ErrorKind(StrEnum):
    """Why a request or an operation failed."""

    #: the request's deadline passed before a node could run it, or before its reply arrived
    DEADLINE = "deadline"
    #: an inner join's window closed before every input of the request arrived
    JOIN_TIMEOUT = "join_timeout"
    #: the input does not decode or does not fit the port it feeds (datatype, shape, NaN), or a component
    #: rejected the item (``Result.errors``)
    INVALID_INPUT = "invalid_input"
    #: a record or request is larger than the topology's ``max_message_bytes``
    OVERSIZE = "oversize"
    #: refused at admission: the request could not have finished before its deadline
    REFUSED = "refused"
    #: a component's ``process`` (or ``setup``) raised
    COMPONENT_FAILURE = "component_failure"
    #: a request went round a cycle more often than the topology's ``max_revisits``
    REVISIT_LIMIT = "revisit_limit"
    #: the broker did not accept the request, or the service is shutting down
    UNAVAILABLE = "unavailable"
    #: a request without a valid credential (a bearer token the gateway does not know, or none)
    UNAUTHORIZED = "unauthorized"
    #: a valid credential without the right to this model or action
    FORBIDDEN = "forbidden"
    #: a credential over its own rate limit
    RATE_LIMITED = "rate_limited"
    #: a topology file that cannot be used
    INVALID_TOPOLOGY = "invalid_topology"
    #: a setting (a ``FLOWSERVE_*`` variable, a flag, a settings field) that cannot be used
    INVALID_SETTINGS = "invalid_settings"
    #: an error result written without a kind (by a producer that predates kinds, or by hand)
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, raw: bytes | str | None) -> ErrorKind:
        """The kind named by a header value; :attr:`UNKNOWN` for a missing or unknown one (never raises)."""
        if raw is None:
            return cls.UNKNOWN
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one request failed: its kind, and the reason for people (which names the node, port or id)."""

    kind: ErrorKind
    reason: str


class FlowserveError(Exception):
    """Base class of every error flowserve raises on purpose. ``kind`` says what went wrong."""

    kind: ErrorKind = ErrorKind.UNKNOWN

    def __init__(self, message: str = "", *, kind: ErrorKind | None = None) -> None:
        if kind is not None:
            self.kind = kind
        super().__init__(message)


class TopologyError(FlowserveError):
    """A topology file is invalid. The message names the file and node and says what to fix."""

    kind = ErrorKind.INVALID_TOPOLOGY

    def __init__(self, message: str, *, source: str = "<topology>", node: str | None = None) -> None:
        self.source = source
        self.node = node
        where = f"{source}: node '{node}'" if node else source
        super().__init__(f"{where}: {message}")


class SettingsError(FlowserveError):
    """A setting cannot be used. The message names each bad one as the user gave it (the variable or the
    field) and says what it should be; never its value, which may be a secret."""

    kind = ErrorKind.INVALID_SETTINGS

    @classmethod
    def from_validation(cls, exc: Any, name_of: Callable[[str], str] = str) -> SettingsError:
        """From a pydantic ``ValidationError`` (read through its ``errors()``, so this layer needs no
        pydantic); ``name_of`` turns a field into what the user set: ``event_loop`` into
        ``FLOWSERVE_WORKER_EVENT_LOOP`` where that is where it came from."""
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            field = str(error["loc"][0]) if error["loc"] else ""
            problems.append(f"{name_of(field) if field else 'settings'}: {error['msg']}")
        return cls(f"invalid setting{'s' if len(problems) > 1 else ''}: {'; '.join(problems)}")


class ComponentError(FlowserveError):
    """A component could not be imported, configured or set up, or broke its declared contract."""

    kind = ErrorKind.COMPONENT_FAILURE


class WireError(FlowserveError):
    """Bytes or JSON could not be decoded into tensors, or tensors do not match a port."""

    kind = ErrorKind.INVALID_INPUT

    def __init__(self, message: str, *, request_id: str | None = None, kind: ErrorKind | None = None) -> None:
        self.request_id = request_id
        prefix = f"request {request_id}: " if request_id else ""
        super().__init__(prefix + message, kind=kind)


class BrokerError(FlowserveError):
    """A broker could not be started, reached or used."""

    kind = ErrorKind.UNAVAILABLE


class DeadlineExceeded(FlowserveError):  # noqa: N818 - the name is what it says
    """A request's deadline passed before its reply arrived."""

    kind = ErrorKind.DEADLINE
