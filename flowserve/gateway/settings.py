"""Gateway settings, read from ``FLOWSERVE_GATEWAY_*`` variables (flags override them)."""

from __future__ import annotations

import os
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from flowserve.gateway.tokens import Grant, read_token_file
from flowserve.kafka.settings import settings_from_env


class GatewaySettings(BaseModel):
    """How the V2 HTTP gateway listens, admits and authenticates. Tokens are never logged."""

    model_config = ConfigDict(frozen=True)

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(8080, ge=0, le=65535, description="0 picks a free port")
    instance: str = Field(default_factory=lambda: uuid.uuid4().hex[:12], pattern=r"^[A-Za-z0-9_-]+$",
                          description="names this gateway's reply topics; unique per running gateway")
    max_inflight: int = Field(4096, ge=1, description="requests waiting for replies; beyond: 429")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="larger request bodies: 413")
    max_connections: int = Field(10_000, ge=1, description="open client connections; one more: 503 and close")
    header_timeout_s: float = Field(10.0, gt=0, description="a request head must arrive whole within this: 408")
    idle_timeout_s: float = Field(60.0, gt=0, description="close a keep-alive connection idle this long; "
                                                          "a body stalled this long: 408")
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with 429")
    fail_fast: bool = Field(True, description="answer 503 at once while a stage of the model has no live "
                                              "worker, instead of 504 at the request's deadline")
    ready_cache_s: float = Field(1.0, ge=0, description="how long a readiness answer is reused")
    max_timeout_ms: int = Field(600_000, gt=0, description="largest per-request timeout a caller may ask for")
    tokens: tuple[SecretStr, ...] = Field((), description="bearer tokens with every right; none and no grants = "
                                                          "no authentication")
    grants: tuple[Grant, ...] = Field((), description="scoped bearer tokens (a YAML token file): models, actions, "
                                                      "rate limits (flowserve.gateway.tokens)")
    metrics_interval_s: float = Field(2.0, ge=0, description="with authentication on, publish the refusal "
                                                             "counters to each model's metrics topic this often "
                                                             "(flowserve stats); 0: never")
    delete_reply_topics: bool = Field(True, description="delete this gateway's reply topics on clean shutdown")
    reuse_port: bool = Field(False, description="share the port with other gateway processes (SO_REUSEPORT); "
                                                "each needs its own instance")
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto", description="the process's event loop; auto: uvloop when installed")

    @classmethod
    def from_env(cls, token_file: str | None = None, **overrides: Any) -> GatewaySettings:
        """Settings from ``FLOWSERVE_GATEWAY_*``; tokens from ``FLOWSERVE_GATEWAY_TOKENS`` (comma-separated,
        every right) and/or a token file (``FLOWSERVE_GATEWAY_TOKEN_FILE``): one token per line (every right),
        or YAML/JSON that scopes each token (:mod:`flowserve.gateway.tokens`)."""
        tokens = [t.strip() for t in os.environ.get("FLOWSERVE_GATEWAY_TOKENS", "").split(",") if t.strip()]
        token_file = token_file or os.environ.get("FLOWSERVE_GATEWAY_TOKEN_FILE")
        values = dict(overrides)
        if token_file:
            contents = read_token_file(token_file)
            tokens.extend(contents.plain)
            if contents.grants and values.get("grants") is None:
                values["grants"] = contents.grants
        if tokens and values.get("tokens") is None:
            values["tokens"] = tuple(SecretStr(t) for t in tokens)
        return settings_from_env(cls, "FLOWSERVE_GATEWAY_", values, skip=frozenset({"tokens", "grants"}))

    @property
    def auth(self) -> bool:
        """Whether requests need a bearer token."""
        return bool(self.tokens or self.grants)

    def __repr__(self) -> str:  # never print tokens
        return (f"GatewaySettings(host={self.host!r}, port={self.port}, instance={self.instance!r}, "
                f"auth={'on' if self.auth else 'off'})")

