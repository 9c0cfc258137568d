"""Unit and property tests of the sans-IO STOMP frame parser and serializer."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pinmq.stomp.frames import (
    Frame,
    FrameError,
    FrameParser,
    Limits,
    encode,
    encode_frame,
)


def parse_all(data: bytes, *, escaping: bool = True, limits: Limits | None = None) -> list[Frame]:
    parser = FrameParser(limits, escaping=escaping)
    parser.feed(data)
    frames = []
    while (frame := parser.next()) is not None:
        frames.append(frame)
    return frames


def parse_chunked(
    chunks: list[bytes], *, escaping: bool = True, limits: Limits | None = None
) -> list[Frame]:
    parser = FrameParser(limits, escaping=escaping)
    frames = []
    for chunk in chunks:
        parser.feed(chunk)
        while (frame := parser.next()) is not None:
            frames.append(frame)
    return frames


# ---- examples -------------------------------------------------------------------------------


def test_simple_frame_and_null_terminated_body() -> None:
    [f] = parse_all(b"SEND\ndestination:/queue/a\nx:1\n\nhello\0")
    assert f == Frame("SEND", {"destination": "/queue/a", "x": "1"}, b"hello")


def test_crlf_line_endings_and_heart_beats_between_frames() -> None:
    data = b"\n\r\n\nSEND\r\ndestination:a\r\n\r\nbody\0\r\n\n\nACK\r\nid:7\r\n\r\n\0\n"
    frames = parse_all(data)
    assert frames == [Frame("SEND", {"destination": "a"}, b"body"), Frame("ACK", {"id": "7"})]


def test_content_length_body_may_hold_nul_bytes() -> None:
    body = b"\0a\0\nb\0"
    [f] = parse_all(b"SEND\ncontent-length:%d\n\n%s\0" % (len(body), body))
    assert f.body == body


def test_frame_without_headers() -> None:
    assert parse_all(b"DISCONNECT\n\n\0") == [Frame("DISCONNECT")]


def test_stomp_12_escapes() -> None:
    [f] = parse_all(b"SEND\na\\cb:c\\\\d\\ne\\rf\n\n\0")
    assert f.headers == {"a:b": "c\\d\ne\rf"}


def test_no_unescaping_in_connect_frames_or_before_1_1() -> None:
    [f] = parse_all(b"CONNECT\nlogin:a\\b\n\n\0", escaping=True)
    assert f.headers == {"login": "a\\b"}
    [f] = parse_all(b"SEND\nx:a\\b\n\n\0", escaping=False)
    assert f.headers == {"x": "a\\b"}


def test_first_of_repeated_headers_wins() -> None:
    [f] = parse_all(b"SEND\nx:1\nx:2\n\n\0")
    assert f.headers == {"x": "1"}


def test_value_may_contain_colons() -> None:
    [f] = parse_all(b"SEND\nx:a:b\n\n\0", escaping=False)
    assert f.headers == {"x": "a:b"}


def test_frames_arrive_byte_by_byte() -> None:
    data = encode_frame("SEND", {"destination": "q", "k": "v"}, b"\0\0body") * 3
    frames = parse_chunked([data[i : i + 1] for i in range(len(data))])
    assert len(frames) == 3
    assert all(f.body == b"\0\0body" for f in frames)


def test_parser_reports_partial_frames_as_buffered() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\ncontent-length:10\n\n12345")
    assert parser.next() is None
    assert parser.buffered > 0


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "invalid command line"),
        (b"SEND\nno-colon\n\n\0", "without ':'"),
        (b"SEND\n:value\n\n\0", "empty header name"),
        (b"SEND\nx:\\t\n\n\0", "invalid escape sequence"),
        (b"SEND\nx:\\\n\n\0", "invalid escape sequence"),
        (b"SEND\ncontent-length:abc\n\n\0", "invalid content-length"),
        (b"SEND\ncontent-length:-1\n\n\0", "invalid content-length"),
        (b"SEND\ncontent-length:2\n\nabc\0", "longer than its content-length"),
        (b"SEND\nx:1\0\n\n\0", "before its headers did"),
        (b"SEND\nx:1\0", "before its headers did"),
        (b"\0", "before its headers did"),
        (b"SEND\nx:\xff\xfe\n\n\0", "not valid UTF-8"),
    ],
)
def test_malformed_frames_name_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(FrameError, match=problem):
        parse_all(data)


def test_limits() -> None:
    limits = Limits(max_frame_size=100, max_headers=3, max_header_size=20)
    with pytest.raises(FrameError, match="max-headers"):
        parse_all(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\0", limits=limits)
    with pytest.raises(FrameError, match="max-header-size"):
        parse_all(b"SEND\na:" + b"x" * 30 + b"\n\n\0", limits=limits)
    with pytest.raises(FrameError, match="max-header-size"):  # before the line is complete
        parse_all(b"SEND\na:" + b"x" * 30, limits=limits)
    with pytest.raises(FrameError, match="max-frame-size"):  # announced: refused at once
        parse_all(b"SEND\ncontent-length:1000\n\n", limits=limits)
    with pytest.raises(FrameError, match="max-frame-size"):  # NUL-terminated, still arriving
        parse_all(b"SEND\n\n" + b"x" * 200, limits=limits)
    with pytest.raises(FrameError, match="max-frame-size"):  # NUL-terminated, complete
        parse_all(b"SEND\n\n" + b"x" * 200 + b"\0", limits=limits)
    assert parse_all(b"SEND\na:1\nb:2\nc:3\n\n" + b"x" * 50 + b"\0", limits=limits)


def test_encode_escapes_by_version() -> None:
    headers = {"k:1": "a\nb:c\\"}
    assert encode_frame("MESSAGE", headers, version="1.2").startswith(
        b"MESSAGE\nk\\c1:a\\nb\\cc\\\\"
    )
    # 1.0 has no escaping: only what would break the frame apart is escaped.
    assert encode_frame("MESSAGE", headers, version="1.0").startswith(b"MESSAGE\nk\\c1:a\\nb:c\\\n")
    # CONNECTED is never escaped.
    assert encode_frame("CONNECTED", {"a": "b:c"}, version="1.2") == b"CONNECTED\na:b:c\n\n\0"


def test_encode_adds_content_length_and_never_emits_nul_in_headers() -> None:
    data = encode_frame("MESSAGE", {"x": "a\0b", "content-length": "99"}, b"\0")
    assert data == "MESSAGE\nx:a\ufffdb\ncontent-length:1\n\n".encode() + b"\0\0"


# ---- properties ------------------------------------------------------------------------------

_COMMANDS = st.sampled_from(["SEND", "MESSAGE", "ACK", "NACK", "SUBSCRIBE", "ERROR", "RECEIPT"])


def _chars(exclude: str) -> st.SearchStrategy[str]:
    """Any character a header can carry (UTF-8, so no surrogates) except `exclude`."""
    return st.characters(blacklist_categories=("Cs",), blacklist_characters=exclude)


_ANY_TEXT = st.text(_chars("\0"), max_size=20)
_KEY_12 = st.text(_chars("\0"), min_size=1, max_size=10)
_KEY_10 = st.text(_chars("\0\n\r:"), min_size=1, max_size=10)
_VALUE_10 = st.text(_chars("\0\n\r"), max_size=20)


@st.composite
def frames(draw: st.DrawFn, version: str) -> Frame:
    keys, values = (_KEY_10, _VALUE_10) if version == "1.0" else (_KEY_12, _ANY_TEXT)
    headers = draw(st.dictionaries(keys.filter(lambda k: k != "content-length"), values))
    return Frame(draw(_COMMANDS), headers, draw(st.binary(max_size=50)))


def _expected(frame: Frame) -> Frame:
    headers = dict(frame.headers)
    if frame.body:
        headers["content-length"] = str(len(frame.body))
    return Frame(frame.command, headers, frame.body)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=10)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from(["1.0", "1.1", "1.2"]),
    data=st.data(),
)
def test_serialize_then_parse_in_any_chunking_gives_the_same_frames(
    version: str, data: st.DataObject
) -> None:
    sent = data.draw(st.lists(frames(version), min_size=1, max_size=4))
    eols = data.draw(st.lists(st.sampled_from([b"", b"\n", b"\r\n", b"\n\n"]), min_size=len(sent)))
    stream = b"".join(eol + encode(f, version) for f, eol in zip(sent, eols, strict=False))
    got = parse_chunked(data.draw(chunked(stream)), escaping=version != "1.0")
    assert got == [_expected(f) for f in sent]


_PIECES = st.sampled_from(
    [
        b"SEND",
        b"CONNECT",
        b"\n",
        b"\r\n",
        b"\0",
        b":",
        b"\\",
        b"\\c",
        b"\\t",
        b"content-length:",
        b"content-length:3",
        b"destination:/queue/a",
        b"x" * 40,
        b"\xff",
    ]
)


@settings(max_examples=500)
@given(
    pieces=st.lists(st.one_of(_PIECES, st.binary(max_size=20)), max_size=30),
    escaping=st.booleans(),
    data=st.data(),
)
def test_garbage_never_raises_anything_but_frame_error(
    pieces: list[bytes], escaping: bool, data: st.DataObject
) -> None:
    stream = b"".join(pieces)
    limits = Limits(max_frame_size=120, max_headers=4, max_header_size=30)
    try:
        frames_ = parse_chunked(data.draw(chunked(stream)), escaping=escaping, limits=limits)
    except FrameError:
        return
    for f in frames_:
        assert isinstance(f, Frame)
        assert f.command.isascii() and f.command.isalpha()
        assert len(f.headers) <= limits.max_headers
        assert len(f.body) <= limits.max_frame_size
