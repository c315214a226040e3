"""Scoped gateway tokens without a broker: the token file, the route table, the authorizer, the bucket."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from pydantic import SecretStr

from flowserve.errors import ErrorKind, SettingsError
from flowserve.gateway.app import status_of
from flowserve.gateway.settings import GatewaySettings
from flowserve.gateway.tokens import (
    ACTIONS,
    Authorizer,
    Grant,
    Need,
    RateLimit,
    TokenBucket,
    hash_token,
    need_of,
    read_token_file,
)

ROOT = Path(__file__).resolve().parents[2]
A_TOKEN = "tok-a-6f1d2c"
FULL_TOKEN = "tok-full-93be7a"
SCOPED = f"""# who may call the gateway
tokens:
  - name: digits-app
    token: {hash_token(A_TOKEN)}
    models: [a]
    actions: [infer, feedback]
  - name: ops
    token: {FULL_TOKEN}
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bearer(token: str) -> str:
    return f"Bearer {token}"


def scoped(tmp_path: Path, text: str = SCOPED) -> Authorizer:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return Authorizer(grants=read_token_file(path).grants, served=("a", "b"))


@pytest.mark.parametrize(("path", "need"), [
    ("/v2/models/a/infer", Need("infer", "a")),
    ("/v2/models/a/versions/1/infer", Need("infer", "a")),
    ("/v2/models/a/feedback", Need("feedback", "a")),
    ("/v2/models/a/explain", Need("explain", "a")),
    ("/v2/models/a", Need(None, "a")),
    ("/v2/models/a/ready", Need(None, "a")),
    ("/v2/models/a/versions/1", Need(None, "a")),
    ("/v2/repository/models/a/load", Need("repository", "a")),
    ("/v2/repository/models/a/unload", Need("repository", "a")),
    ("/v2/repository/index", Need("repository", None)),
    ("/v2/gateway/stats", Need("ui", None)),
    ("/v2", Need(None, None)),
    ("/elsewhere", Need(None, None)),
])
def test_each_route_needs_its_right(path: str, need: Need) -> None:
    assert need_of(path) == need


def test_a_token_for_model_a_is_refused_model_b_and_repository(tmp_path: Path) -> None:
    auth = scoped(tmp_path)
    a = bearer(A_TOKEN)
    for path in ("/v2/models/a/infer", "/v2/models/a/feedback", "/v2/models/a", "/v2/models/a/ready", "/v2"):
        assert auth.check(path, a) is None, path
    for path in ("/v2/models/b/infer", "/v2/models/b", "/v2/models/b/ready", "/v2/models/b/feedback",
                 "/v2/models/a/explain", "/v2/repository/models/a/load", "/v2/repository/models/a/unload",
                 "/v2/repository/index", "/v2/gateway/stats"):
        refusal = auth.check(path, a)
        assert refusal is not None and refusal.kind is ErrorKind.FORBIDDEN, path
        assert status_of(refusal.kind) == 403
        assert "digits-app" in refusal.message and A_TOKEN not in refusal.message
    assert "may not use 'infer' on model 'b'" in str(auth.check("/v2/models/b/infer", a).message)  # type: ignore[union-attr]


def test_a_full_token_opens_everything_and_a_wrong_one_nothing(tmp_path: Path) -> None:
    auth = scoped(tmp_path)
    for path in ("/v2/models/b/infer", "/v2/models/a/explain", "/v2/repository/models/b/load",
                 "/v2/repository/index", "/v2/gateway/stats", "/v2"):
        assert auth.check(path, bearer(FULL_TOKEN)) is None, path
    # the file stores A's hash: the hash itself is no password
    for header in ("", "Bearer", "Bearer wrong", f"Basic {FULL_TOKEN}", bearer(hash_token(A_TOKEN))):
        refusal = auth.check("/v2/models/a/infer", header)
        assert refusal is not None and refusal.kind is ErrorKind.UNAUTHORIZED, header
        assert status_of(refusal.kind) == 401


def test_the_old_format_still_gives_every_right(tmp_path: Path) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text("# one per line\n\n  first  \nsecond\n")
    contents = read_token_file(path)
    assert contents.plain == ("first", "second") and contents.grants == ()
    settings = GatewaySettings.from_env(str(path))
    assert [t.get_secret_value() for t in settings.tokens] == ["first", "second"] and settings.grants == ()
    auth = Authorizer(settings.tokens, settings.grants, served=("a",))
    for path_ in ("/v2/models/a/infer", "/v2/repository/models/a/load", "/v2/gateway/stats"):
        assert auth.check(path_, bearer("second")) is None
    assert auth.check("/v2/models/a/infer", bearer("third")) is not None


def test_settings_take_a_scoped_file_and_never_print_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(SCOPED)
    monkeypatch.setenv("FLOWSERVE_GATEWAY_TOKEN_FILE", str(path))
    monkeypatch.setenv("FLOWSERVE_GATEWAY_TOKENS", "env-token")
    settings = GatewaySettings.from_env()
    assert [g.name for g in settings.grants] == ["digits-app", "ops"]
    assert [t.get_secret_value() for t in settings.tokens] == ["env-token"]
    assert settings.auth and "auth=on" in repr(settings)
    assert FULL_TOKEN not in repr(settings) and FULL_TOKEN not in repr(settings.grants)
    assert not GatewaySettings().auth


def test_rate_limit_answers_429_with_retry_after_then_recovers() -> None:
    clock = FakeClock()
    grant = Grant(token=SecretStr("limited"), name="batch-job", rate=RateLimit(per_s=0.5, burst=2))
    auth = Authorizer(grants=[grant], served=("a",), clock=clock)
    header = bearer("limited")
    assert auth.check("/v2/models/a/infer", header) is None
    assert auth.check("/v2/models/a/infer", header) is None  # the burst
    refusal = auth.check("/v2/models/a/infer", header)
    assert refusal is not None and refusal.kind is ErrorKind.RATE_LIMITED and status_of(refusal.kind) == 429
    assert refusal.retry_after_s == 2  # one request every 2 s
    assert "batch-job" in refusal.message
    clock.now += 1.0  # half a request's worth: still refused, and told the rest
    again = auth.check("/v2/models/a/infer", header)
    assert again is not None and again.retry_after_s == 1
    clock.now += 1.0
    assert auth.check("/v2/models/a/infer", header) is None
    assert auth.check("/v2/models/a/infer", header) is not None
    clock.now += 1000.0  # a long quiet spell refills the burst, no more
    assert [auth.check("/v2/models/a", header) is None for _ in range(3)] == [True, True, False]
    assert auth.counts("a")["rate_limited"] == 4  # each refusal counted once


def test_token_bucket_rounds_and_defaults() -> None:
    clock = FakeClock()
    bucket = TokenBucket(per_s=4.0, capacity=RateLimit(per_s=3.5).capacity, clock=clock)
    assert bucket.capacity == 4
    assert [bucket.take() for _ in range(5)] == [0.0, 0.0, 0.0, 0.0, 0.25]
    clock.now += 0.25
    assert bucket.take() == 0.0


def test_every_refusal_is_counted_by_kind_model_and_token(tmp_path: Path) -> None:
    auth = scoped(tmp_path)
    auth.check("/v2/models/b/infer", bearer(A_TOKEN))
    auth.check("/v2/models/b", bearer(A_TOKEN))
    auth.check("/v2/repository/models/a/load", bearer(A_TOKEN))
    auth.check("/v2/gateway/stats", bearer(A_TOKEN))
    auth.check("/v2/models/a/infer", "")
    auth.check("/v2/models/nosuch/infer", bearer("wrong"))  # a name not served counts under no model
    auth.check("/v2/models/a/infer", bearer(A_TOKEN))  # allowed: not counted
    assert auth.counts("b") == {"unauthorized": 0, "forbidden": 2, "rate_limited": 0}
    assert auth.counts("a") == {"unauthorized": 1, "forbidden": 1, "rate_limited": 0}
    assert auth.counts("") == {"unauthorized": 1, "forbidden": 1, "rate_limited": 0}
    snap = auth.snapshot()
    assert (snap["unauthorized"], snap["forbidden"], snap["rate_limited"]) == (2, 4, 0)
    assert snap["tokens"] == {"digits-app": {"unauthorized": 0, "forbidden": 4, "rate_limited": 0}}
    assert set(snap["models"]) == {"a", "b", "(none)"} and "nosuch" not in str(snap)


def test_no_tokens_means_no_authentication() -> None:
    auth = Authorizer()
    assert not auth.enabled and auth.check("/v2/gateway/stats", "") is None


def test_the_same_token_twice_is_refused() -> None:
    with pytest.raises(SettingsError, match="same bearer token is given twice"):
        Authorizer([SecretStr("x")], [Grant(token=SecretStr(hash_token("x")))])


def test_models_not_served_are_reported_by_token_name(tmp_path: Path) -> None:
    auth = Authorizer(grants=[Grant(token=SecretStr("t"), name="typo", models=("a", "digts"))], served=("a",))
    assert auth.unknown_models() == {"typo": ["digts"]}


@pytest.mark.parametrize(("text", "line", "says"), [
    ("tokens:\n  - token: abc\n    actions: [infer, delete]\n", 3, "actions[1]"),
    ("tokens:\n  - token: abc\n  - token: sha256:12ab\n", 3, "64 hex digits"),
    ("tokens:\n  - token: abc\n    models: [a]\n    rate: {per_s: 0}\n", 4, "rate.per_s"),
    ("tokens:\n  - name: x\n", 2, "tokens[0].token: Field required"),
    ("tokens:\n  - token: abc\n    colour: blue\n", 3, "colour"),
    ("tokens:\n  - token: abc\n  - token: abc\n", 3, "same token as tokens[0]"),
    ("tokens:\n  - token: abc\n  - token: [unclosed\n", 4, "not valid YAML"),
    ("tokens: []\n", 1, "no token: list at least one"),
])
def test_a_bad_token_file_names_the_file_and_line(tmp_path: Path, text: str, line: int, says: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as caught:
        read_token_file(path)
    message = str(caught.value)
    assert message.count("line ") == 1, message  # one mistake, one complaint
    assert message.startswith(f"token file {path}") and f"line {line}:" in message, message
    assert says in message, message
    assert "abc" not in message  # the value is a secret: never quoted
    assert caught.value.kind is ErrorKind.INVALID_SETTINGS


def test_an_empty_or_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "tokens.txt"
    empty.write_text("# nothing yet\n")
    with pytest.raises(SettingsError, match=f"token file {empty} holds no token"):
        read_token_file(empty)
    with pytest.raises(SettingsError, match="cannot read token file .*missing"):
        read_token_file(tmp_path / "missing")


def test_the_file_accepts_exactly_the_actions() -> None:
    item, _ = get_args(Grant.model_fields["actions"].annotation)
    assert get_args(item) == (*ACTIONS, "*")


def test_a_json_file_and_a_yaml_file_without_suffix_are_scoped(tmp_path: Path) -> None:
    json_file = tmp_path / "tokens.json"
    json_file.write_text('{"tokens": [{"token": "j", "models": ["a"], "actions": ["ui", "infer"]}]}')
    assert read_token_file(json_file).grants[0].actions == ("ui", "infer")
    plain_name = tmp_path / "tokens"
    plain_name.write_text("# comment\ntokens:\n  - token: y\n")
    assert read_token_file(plain_name).grants[0].models == ("*",)


def test_the_documented_example_is_a_valid_file(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "gateway.md").read_text()
    example = doc.split("### Security", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "tokens.yaml"
    path.write_text(example.replace("sha256:…", hash_token("ops-token")))
    grants = read_token_file(path).grants
    assert [(g.name, g.models, g.actions) for g in grants] == [
        ("digits-app", ("digits",), ("infer", "feedback")), ("ops", ("*",), ("*",))]
    assert grants[0].rate == RateLimit(per_s=20, burst=40)
    auth = Authorizer(grants=grants, served=("digits", "echo"))
    assert auth.check("/v2/models/echo/infer", bearer("ops-token")) is None
