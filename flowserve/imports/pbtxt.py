"""Read protobuf text format (Triton's ``config.pbtxt``) without its schema: fields to lists of values.

Why not protobuf's own ``text_format`` with Triton's ``model_config.proto``: the compiled schema ships in
``tritonclient.grpc.model_config_pb2``, whose package refuses to import without ``grpcio`` (a 19 MB native
wheel, and 0.6 s to import with protobuf), and a schema-bound parse rejects any field newer than the
installed client. The importer reads a dozen fields; the grammar below is the whole of text format's
syntax that configs use, so a config with fields this reader does not know still parses.

>>> config = parse('name: "m"  max_batch_size: 8\\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]')
>>> one(config, "max_batch_size"), one(many(config, "input")[0], "data_type"), many(many(config, "input")[0], "dims")
(8, 'TYPE_FP32', [4])
"""

from __future__ import annotations

import re
from typing import Any

from flowserve.errors import ErrorKind, FlowserveError

#: A message: each field name with every value it was given, in order (text format repeats a field by
#: writing it again or as a ``[a, b]`` list). A value is a str (strings and enum names), int, float,
#: bool or a nested message.
Message = dict[str, list[Any]]

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?)(?![A-Za-z_]))
  | (?P<word>-?[A-Za-z_][A-Za-z0-9_.]*|\[[A-Za-z_][A-Za-z0-9_./]*\])
  | (?P<punct>[{}\[\]<>:,;])
""", re.VERBOSE)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "?": "?"}
_CLOSE = {"{": "}", "<": ">"}


class PbtxtError(FlowserveError):
    """A text that is not protobuf text format; the message names the file, line and column."""

    kind = ErrorKind.INVALID_SETTINGS


def parse(text: str, source: str = "<pbtxt>") -> Message:
    """The top-level message of ``text``; :class:`PbtxtError` naming ``source``, line and column if malformed."""
    return _Parser(text, source).top()


def one(message: Message, field: str, default: Any = None) -> Any:
    """A singular field's value (the last one given, as protobuf's parser keeps), or ``default``."""
    values = message.get(field)
    return values[-1] if values else default


def many(message: Message, field: str) -> list[Any]:
    """A repeated field's values, in order ([] when absent)."""
    return list(message.get(field, []))


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.text, self.source = text, source
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, offset)
        offset = 0
        while offset < len(text):
            match = _TOKEN.match(text, offset)
            if match is None:
                quote = text[offset] in "\"'"
                raise self.fail(offset, "a string that does not end on its line" if quote
                                else f"unexpected character {text[offset]!r}")
            kind = match.lastgroup or ""
            if kind != "space":
                self.tokens.append((kind, match.group(), offset))
            offset = match.end()
        self.at = 0

    def fail(self, offset: int, why: str) -> PbtxtError:
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return PbtxtError(f"{self.source}:{line}:{column}: {why}")

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "", len(self.text))

    def take(self, *texts: str) -> tuple[str, str, int]:
        token = self.peek()
        if texts and token[1] not in texts:
            raise self.fail(token[2], f"expected {' or '.join(repr(t) for t in texts)}, found "
                            f"{token[1]!r}" if token[0] != "end" else f"expected {texts[0]!r}, found the end")
        self.at += 1
        return token

    def top(self) -> Message:
        message = self.fields(None)
        if self.peek()[0] != "end":
            raise self.fail(self.peek()[2], f"unexpected {self.peek()[1]!r}")
        return message

    def fields(self, close: str | None) -> Message:
        message: Message = {}
        while True:
            kind, text, offset = self.peek()
            if kind == "end":
                if close is not None:
                    raise self.fail(offset, f"expected {close!r} before the end")
                return message
            if close is not None and text == close:
                self.at += 1
                return message
            if kind != "word":
                raise self.fail(offset, f"expected a field name, found {text!r}")
            self.at += 1
            colon = self.peek()[1] == ":"
            if colon:
                self.at += 1
            message.setdefault(text, []).extend(self.values(text, colon))
            if self.peek()[1] in (",", ";"):
                self.at += 1

    def values(self, field: str, colon: bool) -> list[Any]:
        kind, text, offset = self.peek()
        if text == "[":
            self.at += 1
            items: list[Any] = []
            while self.peek()[1] != "]":
                items.append(self.value(field, colon))
                if self.peek()[1] != "]":
                    self.take(",")
            self.at += 1
            return items
        return [self.value(field, colon)]

    def value(self, field: str, colon: bool) -> Any:
        kind, text, offset = self.peek()
        if text in _CLOSE:
            self.at += 1
            return self.fields(_CLOSE[text])
        if not colon:
            raise self.fail(offset, f"field '{field}' needs ':' before a scalar value, or '{{' for a message")
        self.at += 1
        if kind == "string":
            parts = [text]
            while self.peek()[0] == "string":  # adjacent strings concatenate
                parts.append(self.take()[1])
            return "".join(_unquote(p) for p in parts)
        if kind == "number":
            return _number(text)
        if kind == "word" and "." not in text:
            lowered = text.lower()
            if lowered in ("true", "t"):
                return True
            if lowered in ("false", "f"):
                return False
            if lowered in ("inf", "infinity", "-inf", "-infinity", "nan"):
                return float(lowered)
            return text  # an enum value's name
        raise self.fail(offset, f"field '{field}': expected a value, found {text!r}")


def _number(text: str) -> int | float:
    body = text.rstrip("fF") if not text.lower().startswith(("0x", "-0x", "+0x")) else text
    if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", body):
        return int(body, 16)
    if re.fullmatch(r"[-+]?\d+", body):
        return int(body)
    return float(body)


def _unquote(token: str) -> str:
    body, out, i = token[1:-1], [], 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            octal = re.match(r"[0-7]{1,3}", body[i + 1:])
            if octal:
                out.append(chr(int(octal.group(), 8)))
                i += 1 + len(octal.group())
                continue
            hexa = re.match(r"[xX]([0-9a-fA-F]{1,2})", body[i + 1:])
            if hexa:
                out.append(chr(int(hexa.group(1), 16)))
                i += 1 + len(hexa.group())
                continue
        out.append(char)
        i += 1
    return "".join(out)
