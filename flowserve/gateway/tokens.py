"""Who may call the gateway, on which models, for what, and how often: scoped bearer tokens.

A token file is either the old format, one token per line (``#`` comments), each token allowed every
model and every action, or a YAML (or JSON) document that scopes each token::

    tokens:
      - name: digits-app                  # names the token in stats and messages (never the token)
        token: sha256:9f86d081884c7d65...  # the hex SHA-256 of the token (or the token itself)
        models: [digits]                  # "*": every model
        actions: [infer, feedback]        # infer, feedback, explain, repository, ui; "*": all
        rate: {per_s: 20, burst: 40}      # optional: a token bucket; beyond it, 429 with Retry-After

:func:`need_of` says what a request path needs (the gateway's routes, in one table); :class:`Authorizer`
checks a request's ``Authorization`` header against it and counts every refusal by kind. Tokens are
compared as SHA-256 digests with :func:`hmac.compare_digest`, against every entry, so the time taken does
not tell which entry matched; the plain token is never logged nor kept once hashed.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from flowserve.errors import ErrorKind, SettingsError

Action = Literal["infer", "feedback", "explain", "repository", "ui"]
ACTIONS: tuple[Action, ...] = get_args(Action)
_HASH_PREFIX = "sha256:"
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
#: the last segment of a model path -> the action it needs (the gateway's routes; see :func:`need_of`)
_MODEL_ACTIONS: dict[str, Action] = {"infer": "infer", "feedback": "feedback", "explain": "explain"}
#: the refusals the authorizer counts
REFUSAL_KINDS = (ErrorKind.UNAUTHORIZED, ErrorKind.FORBIDDEN, ErrorKind.RATE_LIMITED)


def hash_token(token: str) -> str:
    """``sha256:<hex>``, the form a token file may store instead of the token itself."""
    return _HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


class RateLimit(BaseModel):
    """A token bucket: ``per_s`` requests a second on average, up to ``burst`` at once after a quiet spell."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_s: float = Field(gt=0, description="requests a second, sustained")
    burst: int = Field(0, ge=0, description="requests at once after a quiet spell; 0: per_s rounded up")

    @property
    def capacity(self) -> int:
        return self.burst or max(1, math.ceil(self.per_s))


class Grant(BaseModel):
    """One token of a token file: the models and actions it may use, and its rate limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token: SecretStr = Field(description="the token, or 'sha256:' and the hex SHA-256 of its UTF-8 bytes")
    name: str = Field("", max_length=64, description="names the token in stats and messages; never the token")
    models: tuple[str, ...] = Field(("*",), min_length=1, description="model names; '*': every model")
    actions: tuple[Literal["infer", "feedback", "explain", "repository", "ui", "*"], ...] = Field(
        ("*",), min_length=1, description="the actions of :data:`Action`; '*': every action")
    rate: RateLimit | None = Field(None, description="per-token rate limit; none: unlimited")

    @field_validator("token")
    @classmethod
    def _well_formed(cls, value: SecretStr) -> SecretStr:
        # the messages never quote the value: it is a secret
        raw = value.get_secret_value()
        if not raw or raw != raw.strip() or any(c.isspace() for c in raw):
            raise ValueError("a token is one word, without spaces")
        if raw.startswith(_HASH_PREFIX) and not _HEX64.match(raw[len(_HASH_PREFIX):]):
            raise ValueError("a hashed token is 'sha256:' and 64 hex digits (printf %s TOKEN | sha256sum)")
        return value

    def digest(self) -> bytes:
        """The SHA-256 of the token, whichever way the file stores it."""
        raw = self.token.get_secret_value()
        if raw.startswith(_HASH_PREFIX):
            return bytes.fromhex(raw[len(_HASH_PREFIX):])
        return hashlib.sha256(raw.encode()).digest()


class TokenFile(BaseModel):
    """The scoped token file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: tuple[Grant, ...]

    @field_validator("tokens")
    @classmethod
    def _not_empty(cls, value: tuple[Grant, ...]) -> tuple[Grant, ...]:
        # here, not min_length: pydantic counts only the valid items, and would add this to every other error
        if not value:
            raise ValueError("the file gives no token: list at least one under 'tokens:'")
        return value


@dataclass(frozen=True, slots=True)
class TokenFileContents:
    """What a token file holds: plain tokens of the old format (every right), or scoped grants."""

    plain: tuple[str, ...] = ()
    grants: tuple[Grant, ...] = ()


def read_token_file(path: str | Path) -> TokenFileContents:
    """Read either format; a mistake raises :class:`SettingsError` naming the file and the line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read token file {path}: {exc.strerror}") from None
    if not _structured(Path(path), text):
        tokens = tuple(line.strip() for line in text.splitlines()
                       if line.strip() and not line.lstrip().startswith("#"))
        if not tokens:
            raise SettingsError(f"token file {path} holds no token (one per line, or a YAML 'tokens:' list)")
        return TokenFileContents(plain=tokens)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise SettingsError(f"token file {path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    try:
        parsed = TokenFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = error["loc"]
            problems.append(f"line {_line_of(node, loc)}: {_dotted(loc)}: {error['msg']}")
        raise SettingsError(f"token file {path}: " + "; ".join(problems)) from None
    digests: dict[bytes, int] = {}
    for i, grant in enumerate(parsed.tokens):
        first = digests.setdefault(grant.digest(), i)
        if first != i:
            raise SettingsError(f"token file {path}, line {_line_of(node, ('tokens', i))}: tokens[{i}] is the same "
                                f"token as tokens[{first}]; give each token one entry")
    return TokenFileContents(grants=parsed.tokens)


def _structured(path: Path, text: str) -> bool:
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped.startswith(("tokens:", "{", "---"))
    return False


def _line_of(node: Any, loc: Sequence[Any]) -> int:
    """The 1-based line of the YAML node at ``loc`` (or of the deepest one that exists)."""
    if node is None:
        return 1
    for key in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            child = node.value[key]
        if child is None:
            break
        node = child
    return int(node.start_mark.line) + 1


def _dotted(loc: Sequence[Any]) -> str:
    out = ""
    for key in loc:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "file"


# -- what a request needs ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Need:
    """What a request path needs. ``action`` None: any right on ``model`` (metadata, readiness), or only
    a valid token when ``model`` is None too. ``model`` None with an action: that action on every model
    (the endpoint concerns them all)."""

    action: Action | None
    model: str | None


def need_of(path: str) -> Need:
    """The right that the gateway route ``path`` needs (``/v2/health/*`` stays open; the app skips it).

    ==============================================  =======================================
    ``POST /v2/models/M[/versions/V]/infer``        ``infer`` on M
    ``POST /v2/models/M[/versions/V]/feedback``     ``feedback`` on M
    ``POST /v2/models/M[/versions/V]/explain``      ``explain`` on M
    ``/v2/repository/models/M/{load,unload}``       ``repository`` on M
    ``/v2/repository/...`` (the index)              ``repository`` on every model
    ``GET /v2/gateway/stats``                       ``ui`` on every model
    ``GET /v2/models/M[/versions/V][/ready]``       any right on M
    ``GET /v2`` and unknown routes                  a valid token
    ==============================================  =======================================
    """
    parts = path.rstrip("/").split("/")[1:]
    if parts[:1] != ["v2"]:
        return Need(None, None)
    rest = parts[1:]
    if rest == ["gateway", "stats"]:
        return Need("ui", None)
    if rest[:1] == ["repository"]:
        model = rest[2] if len(rest) >= 3 and rest[1] == "models" else None
        return Need("repository", model)
    if rest[:1] == ["models"] and len(rest) >= 2:
        tail = rest[2:]
        if len(tail) >= 2 and tail[0] == "versions":
            tail = tail[2:]
        return Need(_MODEL_ACTIONS.get(tail[0]) if len(tail) == 1 else None, rest[1])
    return Need(None, None)


# -- checking ------------------------------------------------------------------------------------

class TokenBucket:
    """``per_s`` tokens a second, up to ``capacity``; :meth:`take` one or say how long until one is there.

    ``clock`` (seconds, monotonic) is injectable so that tests step time instead of sleeping.
    """

    def __init__(self, per_s: float, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s = per_s
        self.capacity = capacity
        self.clock = clock
        self._level = float(capacity)
        self._at = clock()

    def take(self) -> float:
        """0.0 when a request may go now (and count it), else the seconds until one may."""
        now = self.clock()
        self._level = min(float(self.capacity), self._level + max(0.0, now - self._at) * self.per_s)
        self._at = now
        if self._level >= 1.0:
            self._level -= 1.0
            return 0.0
        return (1.0 - self._level) / self.per_s


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    digest: bytes
    models: frozenset[str] | None  # None: every model
    actions: frozenset[str]
    bucket: TokenBucket | None

    def allows(self, need: Need) -> bool:
        if need.model is None:
            return need.action is None or (self.models is None and need.action in self.actions)
        if self.models is not None and need.model not in self.models:
            return False
        return need.action is None or need.action in self.actions


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: its kind (the gateway maps it to 401, 403 or 429), and for people."""

    kind: ErrorKind
    message: str
    #: for ``rate_limited``: whole seconds until the token may call again
    retry_after_s: int = 0


class Authorizer:
    """Checks requests against ``full`` tokens (every right) and scoped ``grants``; counts refusals.

    With neither, every request passes. ``served`` (the model names) lets refusals be counted per model
    without a caller inventing model names in the counters: others count under ``""``.
    """

    def __init__(self, full: Iterable[SecretStr] = (), grants: Iterable[Grant] = (), *,
                 served: Collection[str] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.served = frozenset(served)
        entries = [_Entry(f"token {i + 1}", hashlib.sha256(t.get_secret_value().encode()).digest(), None,
                          frozenset(ACTIONS), None) for i, t in enumerate(full)]
        for i, g in enumerate(grants):
            entries.append(_Entry(
                g.name or f"tokens[{i}]", g.digest(), None if "*" in g.models else frozenset(g.models),
                frozenset(ACTIONS) if "*" in g.actions else frozenset(g.actions),
                TokenBucket(g.rate.per_s, g.rate.capacity, clock) if g.rate else None))
        if len({e.digest for e in entries}) != len(entries):
            raise SettingsError("the same bearer token is given twice (FLOWSERVE_GATEWAY_TOKENS and the token "
                                "file, or twice in one of them); give each token once")
        self._entries = tuple(entries)
        #: (model or "", kind) -> refusals; (token name, kind) -> refusals of a known token
        self._by_model: Counter[tuple[str, ErrorKind]] = Counter()
        self._by_token: Counter[tuple[str, ErrorKind]] = Counter()

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def unknown_models(self) -> dict[str, list[str]]:
        """Token name -> the models it names that are not served here (a typo grants nothing)."""
        return {e.name: sorted(e.models - self.served) for e in self._entries
                if e.models is not None and e.models - self.served}

    def check(self, path: str, authorization: str) -> Refusal | None:
        """None when the request may go on, else why not (and the refusal is counted)."""
        if not self._entries:
            return None
        need = need_of(path)
        entry = self._match(authorization)
        if entry is None:
            return self._refuse(need, None, Refusal(
                ErrorKind.UNAUTHORIZED, "missing or invalid bearer token (send 'Authorization: Bearer <token>')"))
        if not entry.allows(need):
            return self._refuse(need, entry, Refusal(ErrorKind.FORBIDDEN, _forbidden(entry, need)))
        if entry.bucket is not None:
            wait = entry.bucket.take()
            if wait > 0:
                return self._refuse(need, entry, Refusal(
                    ErrorKind.RATE_LIMITED, f"token '{entry.name}' is over its rate limit of "
                                            f"{entry.bucket.per_s:g} requests/s (burst {entry.bucket.capacity})",
                    max(1, math.ceil(wait))))
        return None

    def _match(self, authorization: str) -> _Entry | None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return None
        digest = hashlib.sha256(given.strip().encode()).digest()
        found = None
        for entry in self._entries:  # compare with every entry, so timing does not tell which matched
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found

    def _refuse(self, need: Need, entry: _Entry | None, refusal: Refusal) -> Refusal:
        model = need.model if need.model in self.served else ""
        self._by_model[(model or "", refusal.kind)] += 1
        if entry is not None:
            self._by_token[(entry.name, refusal.kind)] += 1
        return refusal

    def counts(self, model: str | None = None) -> dict[str, int]:
        """Refusals by kind: of requests to ``model`` ("" for those to no served model), or of all."""
        return {str(k): sum(n for (m, kind), n in self._by_model.items()
                            if kind == k and (model is None or m == model)) for k in REFUSAL_KINDS}

    def snapshot(self) -> dict[str, Any]:
        """For ``/v2/gateway/stats``: totals by kind, and by model and by token name where any."""
        models = sorted({m for m, _ in self._by_model})
        tokens = sorted({t for t, _ in self._by_token})
        return {**self.counts(),
                "models": {m or "(none)": self.counts(m) for m in models},
                "tokens": {t: {str(k): self._by_token[(t, k)] for k in REFUSAL_KINDS} for t in tokens}}


def _forbidden(entry: _Entry, need: Need) -> str:
    models = "every model" if entry.models is None else "model(s) " + ", ".join(sorted(entry.models))
    rights = ", ".join(a for a in ACTIONS if a in entry.actions)
    may = f"(it may: {rights} on {models})"
    if need.model is None:
        return f"token '{entry.name}' may not use '{need.action}' on every model, which this endpoint needs {may}"
    if need.action is None:
        return f"token '{entry.name}' has no right on model '{need.model}' {may}"
    return f"token '{entry.name}' may not use '{need.action}' on model '{need.model}' {may}"
