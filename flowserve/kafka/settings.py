"""Connection and worker settings, one frozen model per concern, read from ``FLOWSERVE_*`` variables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from flowserve.errors import SettingsError

M = TypeVar("M", bound=BaseModel)


def settings_from_env(model: type[M], prefix: str, values: dict[str, Any], skip: frozenset[str] = frozenset(),
                      defaults: dict[str, Any] | None = None) -> M:
    """``model`` from ``{prefix}{FIELD}`` variables, over ``defaults`` and under ``values`` (flags and code win
    where they are given, i.e. not None).

    A value that does not fit raises :class:`~flowserve.errors.SettingsError` naming the variable it came
    from (or the field, for a value given in code), not a pydantic traceback.
    """
    from_env: dict[str, str] = {}
    for field in model.model_fields:
        raw = os.environ.get(f"{prefix}{field.upper()}")
        if raw and field not in skip and values.get(field) is None:
            from_env[field] = raw
    try:
        return model(**{**(defaults or {}), **from_env, **{k: v for k, v in values.items() if v is not None}})
    except ValidationError as exc:
        raise SettingsError.from_validation(
            exc, lambda field: f"{prefix}{field.upper()}" if field in from_env else field) from None


#: KafkaSettings fields that may be read from a file named by ``FLOWSERVE_<FIELD>_FILE``
SECRET_FILE_FIELDS = ("sasl_username", "sasl_password")


def _secret_files(prefix: str, fields: tuple[str, ...]) -> dict[str, str]:
    """``{field: the file's text}`` for each ``{prefix}{FIELD}_FILE`` variable that is set. An unreadable
    file is a SettingsError naming the variable; the file's text is never in a message."""
    found: dict[str, str] = {}
    for name in fields:
        variable = f"{prefix}{name.upper()}_FILE"
        path = os.environ.get(variable)
        if not path:
            continue
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SettingsError(f"{variable}: cannot read {path} ({exc.strerror})") from None
        found[name] = text.removesuffix("\n").removesuffix("\r")  # a file written by echo ends in a newline
    return found


class KafkaSettings(BaseModel):
    """How to reach the brokers. TLS/SASL settings pass through to aiokafka and librdkafka; secrets are never
    logged."""

    model_config = ConfigDict(frozen=True)

    bootstrap: str = Field("127.0.0.1:9092", description="host:port[,host:port...]")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    fetch_max_wait_ms: int = Field(
        500, ge=0, description="how long the broker may hold a fetch that finds no records. Apache Kafka answers "
        "as soon as records arrive, so a long wait costs no latency, where a short one makes every idle consumer "
        "poll (at 5 ms, ~10% of a core each, in the consumer and again in the broker). The embedded broker "
        "answers only when the wait ends: its clients use EmbeddedBroker.fetch_max_wait_ms (5)")
    replication_factor: int | None = Field(
        None, ge=1, description="copies of each partition of the topics flowserve creates (None: min(3, brokers); "
        "more than the cluster has is refused)")
    min_insync_replicas: int | None = Field(
        None, ge=1, description="min.insync.replicas of those topics (None: 2 where 3 or more copies, else 1): "
        "with acks=all, a write needs this many copies")
    idempotence: bool = Field(
        False, description="idempotent producers (no duplicates when a send is retried after a broker fault). "
        "Apache Kafka supports it (ApacheKafka.settings() turns it on; deployments set FLOWSERVE_IDEMPOTENCE=1); "
        "the embedded broker refuses InitProducerId, so it is off unless asked for")

    @classmethod
    def from_env(cls, bootstrap: str | None = None, **defaults: Any) -> KafkaSettings:
        """Settings from ``FLOWSERVE_<FIELD>`` variables over ``defaults``; ``bootstrap`` over both.

        A stage's own credentials may come from files instead (a mounted Secret, as ``flowserve deploy render
        --auth`` mounts each stage's KafkaUser Secret into that stage's pods only): ``FLOWSERVE_SASL_USERNAME_FILE``
        and ``FLOWSERVE_SASL_PASSWORD_FILE`` name them; the plain variables win where both are set."""
        return settings_from_env(cls, "FLOWSERVE_", {"bootstrap": bootstrap or None},
                                 defaults={**defaults, **_secret_files("FLOWSERVE_", SECRET_FILE_FIELDS)})

    def ssl_context(self) -> Any:
        """The TLS context of SSL and SASL_SSL connections (None for the others): verifies the brokers'
        certificates against ``ssl_cafile`` (else the system's CAs), with a client certificate if given."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        from aiokafka.helpers import create_ssl_context

        return create_ssl_context(cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile)

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"bootstrap_servers": self.bootstrap.split(","),
                                  "security_protocol": self.security_protocol}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = self.ssl_context()
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        return kwargs

    def librdkafka_config(self) -> dict[str, Any]:
        """The same connection settings in librdkafka's terms (confluent-kafka's configuration keys)."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap,
                                  "security.protocol": self.security_protocol.lower()}
        for key, value in (("ssl.ca.location", self.ssl_cafile), ("ssl.certificate.location", self.ssl_certfile),
                           ("ssl.key.location", self.ssl_keyfile), ("sasl.mechanism", self.sasl_mechanism),
                           ("sasl.username", self.sasl_username)):
            if value is not None and (key.startswith("sasl") or self.security_protocol in ("SSL", "SASL_SSL")):
                config[key] = value
        if self.sasl_password is not None:
            config["sasl.password"] = self.sasl_password.get_secret_value()
        return config

    def __repr__(self) -> str:  # never print the password, even by accident
        return f"KafkaSettings(bootstrap={self.bootstrap!r}, security_protocol={self.security_protocol!r})"

    __str__ = __repr__


class WorkerSettings(BaseModel):
    """Knobs of one stage worker. Defaults suit low latency on a single machine."""

    model_config = ConfigDict(frozen=True)

    fetch_max_wait_ms: int | None = Field(
        None, ge=0, description="broker long-poll of this worker's fetches (None: KafkaSettings.fetch_max_wait_ms)")
    poll_timeout_ms: int = Field(100, ge=1, description="how long one fetch waits for records")
    fetch_min_bytes: int = Field(1, ge=1, description="broker holds a fetch until this many bytes (or the wait)")
    session_timeout_ms: int = Field(6_000, ge=1000, description="embedded broker: a group join takes half of this")
    heartbeat_interval_ms: int = Field(1000, ge=100)
    rebalance_timeout_ms: int = Field(10_000, ge=1000, description="max time between polls in a group")
    max_partition_fetch_bytes: int = Field(4 * 1_048_576, ge=1024)
    producer_batch_bytes: int = Field(1_048_576, ge=16_384)
    acks: Literal[0, 1, "all"] = "all"
    request_timeout_ms: int = Field(
        10_000, ge=100, description="how long a batch's outputs may wait for the broker's acknowledgement; past it "
        "the worker re-reads the batch's inputs and tries again (flowserve.runtime.rewind). aiokafka's default is "
        "40 s; a frozen leader held a worker's step, and so its group membership, that long")
    commit_interval_ms: int = Field(100, ge=0, description="under load, commit at most this often (0: every batch)")
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    client: Literal["aiokafka", "librdkafka"] = Field(
        "aiokafka", description="the Kafka client the worker consumes and produces with, under the same "
        "at-least-once bookkeeping: aiokafka (its record batches built and parsed in Cython) or librdkafka "
        "(confluent-kafka: the protocol in C threads, but a Python call per record produced, per delivery "
        "report and per record read). aiokafka measured the cheaper per record (flowserve bench passthrough: "
        "13 vs 17 us of CPU on Apache Kafka, 11 vs 17 on the embedded broker); FLOWSERVE_WORKER_CLIENT=librdkafka "
        "picks the other")
    honour_deadlines: bool = Field(
        True, description="fail requests whose deadline passed; False for a branch that answers nobody (a shadow "
        "replaying retained inputs computes every request whatever its deadline)")
    stats_interval_s: float = Field(0.0, ge=0, description="log counters this often (0: only at exit)")
    metrics_interval_s: float = Field(2.0, ge=0, description="publish a metrics snapshot this often (0: never)")
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto", description="the worker process's event loop; auto: uvloop when installed")
    inline_below_ms: float = Field(
        1.0, ge=0, description="run an offloading component on the event loop while its batches take less than"
        " this (a thread handoff costs more than a sub-millisecond model; 0: always offload)")

    @classmethod
    def from_env(cls, **overrides: Any) -> WorkerSettings:
        """Settings from ``FLOWSERVE_WORKER_<FIELD>`` variables (``FLOWSERVE_WORKER_EVENT_LOOP=asyncio``);
        ``overrides`` that are not None (flags) win over them."""
        return settings_from_env(cls, "FLOWSERVE_WORKER_", overrides)
