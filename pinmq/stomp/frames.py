"""STOMP frames: an incremental, sans-IO parser and a serializer (STOMP 1.0, 1.1 and 1.2).

The parser is fed bytes as they arrive and hands out one complete frame at a time, so the
session can turn header escaping on (after CONNECT) before the next frame is parsed. Every
problem with the input is a `FrameError` that names it; after one, the byte stream cannot be
resynchronised and the connection must be closed.

Accepted on input, as the specifications (and lenient brokers) do:
- EOLs (LF or CRLF, i.e. heart-beats) before a frame; lines ending in CRLF;
- a body delimited by `content-length` (it may hold NUL bytes) or by the first NUL;
- the first of repeated headers wins;
- escapes `\\n` `\\c` `\\\\` (1.1) and `\\r` (1.2; also accepted in 1.1) once escaping is on,
  never in CONNECT/STOMP/CONNECTED frames; any other escape is an error (1.2 says fatal).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
ESCAPING_VERSIONS = frozenset({"1.1", "1.2"})
_EOL = (10, 13)  # LF, CR
# Every command a client or a server sends: their command lines need no further checks.
_COMMANDS = frozenset(
    {
        "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT",
        "DISCONNECT", "CONNECT", "STOMP", "CONNECTED", "MESSAGE", "RECEIPT", "ERROR",
    }
)  # fmt: skip


class FrameError(Exception):
    """The bytes received are not a valid STOMP frame, or break a configured limit."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one frame may cost the node (all in bytes except `max_headers`)."""

    max_frame_size: int = 10 * 1024 * 1024
    max_headers: int = 1000
    max_header_size: int = 64 * 1024


@dataclass(slots=True)
class Frame:
    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class FrameParser:
    """Incremental parser: `feed(bytes)`, then call `next()` until it returns None.

    A frame whose head is parsed and whose body is still arriving is kept in `_command` (None
    when there is none), `_headers`, `_body_start` and `_length`: no object per frame.
    """

    __slots__ = (
        "_body_start",
        "_buf",
        "_command",
        "_headers",
        "_length",
        "_pos",
        "_scan",
        "escaping",
        "limits",
    )

    def __init__(self, limits: Limits | None = None, *, escaping: bool = False) -> None:
        self._buf = bytearray()
        self._pos = 0  # first byte not consumed yet
        self._scan = 0  # where the search for the header end or the NUL resumes
        self._command: str | None = None
        self._headers: dict[str, str] = {}
        self._body_start = 0
        self._length: int | None = None
        self.limits = limits or Limits()
        self.escaping = escaping  # STOMP 1.1+: header names and values are escaped

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as a frame (a partial frame, EOLs)."""
        return len(self._buf) - self._pos

    def release(self) -> None:
        """Drop whatever is buffered (the connection ended): its memory goes at once."""
        self._buf = bytearray()
        self._pos = self._scan = 0
        self._command = None
        self._headers = {}

    def feed(self, data: bytes) -> None:
        pos = self._pos
        if pos:
            del self._buf[:pos]  # only a partial frame is left: cheap
            self._scan -= pos
            self._body_start -= pos
            self._pos = 0
        self._buf += data

    def next(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive; raises FrameError."""
        if self._command is None and not self._read_head():
            return None
        return self._read_body()

    # ---- internals ----------------------------------------------------------------------

    def _read_head(self) -> bool:
        buf, limits = self._buf, self.limits
        n = len(buf)
        pos = self._pos
        while pos < n and buf[pos] in _EOL:
            pos += 1
        self._pos = pos
        if pos == n:
            self._scan = pos
            return False
        start = self._scan if self._scan > pos else pos
        lf = buf.find(b"\n\n", start)
        crlf = buf.find(b"\n\r\n", start, n if lf < 0 else lf + 2)  # never past the LF end
        if lf < 0 and crlf < 0:
            if buf.find(0, start) >= 0:
                raise FrameError("frame ended (NUL byte) before its headers did (no blank line)")
            self._scan = max(pos, n - 2)
            if n - pos > limits.max_frame_size:
                raise FrameError(f"frame exceeds max-frame-size of {limits.max_frame_size} bytes")
            nl = buf.rfind(b"\n", pos, n)
            if n - (pos if nl < 0 else nl + 1) > limits.max_header_size:
                raise FrameError(
                    f"header line exceeds max-header-size of {limits.max_header_size} bytes"
                )
            return False
        if crlf < 0 or 0 <= lf < crlf:
            head_end, body_start = lf, lf + 2
        else:
            head_end, body_start = crlf, crlf + 3
        if body_start - pos > limits.max_frame_size:
            raise FrameError(f"frame exceeds max-frame-size of {limits.max_frame_size} bytes")
        block = buf[pos:head_end]
        try:
            text = block.decode()
        except UnicodeDecodeError:
            raise FrameError("frame command or headers are not valid UTF-8") from None
        if "\0" in text:
            raise FrameError("frame ended (NUL byte) before its headers did (no blank line)")
        command, headers = self._parse_head(text, block)
        length = None
        raw = headers.get("content-length")
        if raw is not None:
            raw = raw.strip()
            if not (raw.isascii() and raw.isdigit()):
                raise FrameError(f"invalid content-length {raw[:20]!r}: expected a byte count")
            length = int(raw)
            size = body_start - pos + length + 1
            if size > limits.max_frame_size:
                raise FrameError(
                    f"frame of {size} bytes exceeds max-frame-size of {limits.max_frame_size} bytes"
                )
        self._command, self._headers = command, headers
        self._body_start, self._length = body_start, length
        self._scan = body_start
        return True

    def _parse_head(self, text: str, block: bytearray) -> tuple[str, dict[str, str]]:
        """The command and headers of a head block (`text`, decoded from `block`)."""
        limits = self.limits
        lines = text.split("\n")
        command = lines[0]
        if command not in _COMMANDS:
            command = command.removesuffix("\r")
            if not (command.isascii() and command.isalpha()):
                raise FrameError(f"invalid command line {command[:40]!r}")
        if len(lines) - 1 > limits.max_headers:
            raise FrameError(
                f"{command} frame has {len(lines) - 1} headers, more than max-headers "
                f"{limits.max_headers}"
            )
        if len(block) > limits.max_header_size:
            for raw_line in block.split(b"\n")[1:]:
                if len(raw_line) > limits.max_header_size:
                    raise FrameError(
                        f"header line of {len(raw_line)} bytes exceeds max-header-size of "
                        f"{limits.max_header_size} bytes"
                    )
        unescape = self.escaping and command not in UNESCAPED_COMMANDS
        if "\r" not in text and not (unescape and "\\" in text):
            # Fast path (the usual frame): no CRs, no escapes; dict() is all C.
            try:
                headers = dict([line.split(":", 1) for line in lines[1:]])
            except ValueError:
                pass  # a line without ':': the loop below names it
            else:
                if len(headers) == len(lines) - 1 and "" not in headers:
                    return command, headers
        headers = {}
        for line in lines[1:]:
            if line.endswith("\r"):
                line = line[:-1]
            key, sep, value = line.partition(":")
            if not sep:
                raise FrameError(f"header line without ':' in {command} frame: {line[:40]!r}")
            if unescape and "\\" in line:
                key, value = _unescape(key), _unescape(value)
            if not key:
                raise FrameError(f"empty header name in {command} frame")
            if key not in headers:
                headers[key] = value
        return command, headers

    def _read_body(self) -> Frame | None:
        buf, length, command = self._buf, self._length, self._command
        assert command is not None
        if length is not None:
            end = self._body_start + length
            if len(buf) <= end:
                return None
            if buf[end] != 0:
                raise FrameError(
                    f"{command} frame body is longer than its content-length of "
                    f"{length} bytes (no NUL after it)"
                )
        else:
            end = buf.find(0, self._scan)
            if end < 0:
                self._scan = len(buf)
                if len(buf) - self._pos > self.limits.max_frame_size:
                    raise FrameError(
                        f"frame exceeds max-frame-size of {self.limits.max_frame_size} bytes"
                    )
                return None
            if end + 1 - self._pos > self.limits.max_frame_size:
                raise FrameError(
                    f"frame exceeds max-frame-size of {self.limits.max_frame_size} bytes"
                )
        frame = Frame(command, self._headers, bytes(buf[self._body_start : end]))
        self._pos = self._scan = end + 1
        self._command = None
        return frame


_UNESCAPES = {"n": "\n", "c": ":", "\\": "\\", "r": "\r"}
_ESCAPE_SEQ = re.compile(r"\\(.?)", re.DOTALL)


def _unescape_one(match: re.Match[str]) -> str:
    out = _UNESCAPES.get(match.group(1))
    if out is None:
        raise FrameError(f"invalid escape sequence {match.group(0)!r} in a header")
    return out


def _unescape(text: str) -> str:
    return _ESCAPE_SEQ.sub(_unescape_one, text)


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", ":": "\\c"})
_ESCAPES_10_VALUE = str.maketrans({"\n": "\\n", "\r": "\\r"})
_ESCAPES_10_KEY = str.maketrans({"\n": "\\n", "\r": "\\r", ":": "\\c"})


def escape(text: str) -> str:
    """STOMP 1.2 header escaping (also used for 1.1, where a raw CR could not survive)."""
    if "\\" in text or ":" in text or "\n" in text or "\r" in text:
        return text.translate(_ESCAPES)
    return text


def escape_10_value(text: str) -> str:
    """STOMP 1.0 has no escaping; only line breaks are escaped so the frame stays intact."""
    if "\n" in text or "\r" in text:
        return text.translate(_ESCAPES_10_VALUE)
    return text


def escape_10_key(text: str) -> str:
    if "\n" in text or "\r" in text or ":" in text:
        return text.translate(_ESCAPES_10_KEY)
    return text


def encode_frame(
    command: str,
    headers: Mapping[str, str] = {},  # never mutated
    body: bytes = b"",
    version: str | None = "1.2",
) -> bytes:
    """Serialize a frame; a non-empty body always gets a `content-length` header.

    `version` None or "1.0" (and CONNECT/CONNECTED frames) write headers unescaped.
    """
    if version in ESCAPING_VERSIONS and command not in UNESCAPED_COMMANDS:
        esc_key = esc_value = escape
    else:
        esc_key, esc_value = escape_10_key, escape_10_value
    lines = [command]
    lines.extend(
        f"{esc_key(k)}:{esc_value(v)}" for k, v in headers.items() if k != "content-length"
    )
    if body:
        lines.append(f"content-length:{len(body)}")
    text = "\n".join(lines)
    if "\0" in text:  # no escape exists for NUL; it would end the frame early
        text = text.replace("\0", "\ufffd")
    return b"".join((text.encode(), b"\n\n", body, b"\0"))


def encode(frame: Frame, version: str | None = "1.2") -> bytes:
    return encode_frame(frame.command, frame.headers, frame.body, version)
