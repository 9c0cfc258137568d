"""What the broker takes from a client, checked where it enters; gRPC and STOMP share the rules.

Names and the headers the broker itself interprets are refused with a reason before anything
is enqueued or created: a value stored unchecked would break every consumer of it later (a
`JMSXGroupSeq` of 10^30 does not fit the int64 a delivery carries it in). Pure functions; the
shells turn `InvalidInput` into a STOMP ERROR or gRPC INVALID_ARGUMENT, the core into
`InvalidRequest`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from broker.message import GROUP_SEQ_HEADER
from broker.wildcard import ANY_WORDS, ONE_WORD

MAX_NAME_LENGTH = 255  # characters of a queue or address name
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_WILDCARDS = frozenset(ANY_WORDS + ONE_WORD)
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


class InvalidInput(ValueError):
    """A value the broker refuses; `str()` says which and why, for the client."""


def check_name(name: str, what: str = "name") -> None:
    """A queue or address name: not blank, no NUL, no wildcard, at most MAX_NAME_LENGTH."""
    if not name or not name.strip():
        raise InvalidInput(f"{what} must not be blank")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(
            f"{what} {name[:40]!r}... is {len(name)} characters long, more than {MAX_NAME_LENGTH}"
        )
    if "\x00" in name:
        raise InvalidInput(f"{what} {name!r} contains a NUL character")
    if _WILDCARDS.intersection(name):
        raise InvalidInput(
            f"{what} {name!r} contains {ONE_WORD!r} or {ANY_WORDS!r}: wildcards belong in "
            "address-settings patterns, not in the name of a queue or address"
        )


def group_seq(raw: str) -> int:
    """`JMSXGroupSeq` as the broker reads it: a decimal integer in the signed 64-bit range."""
    if len(raw) > 40 or not _INTEGER.fullmatch(raw):
        raise InvalidInput(f"{GROUP_SEQ_HEADER} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidInput(f"{GROUP_SEQ_HEADER} {raw[:40]} is outside the signed 64-bit range")
    return value


def check_size(body: bytes, headers: Mapping[str, str], limit: int) -> None:
    """`limits.max-message-size`: the body's bytes plus its header names and values."""
    size = len(body)
    if size + 4096 > limit:  # headers rarely add up to more: count them only near the limit
        size += sum(len(k) + len(v) for k, v in headers.items())
        if size > limit:
            raise InvalidInput(
                f"message of {size} bytes (body and headers) exceeds the max-message-size of "
                f"{limit} bytes"
            )


def check_headers(headers: Mapping[str, str], max_headers: int, max_header_size: int) -> None:
    """Count and size of a message's headers, and the values the broker interprets."""
    if len(headers) > max_headers:
        raise InvalidInput(f"{len(headers)} headers, more than the limit of {max_headers}")
    for key, value in headers.items():
        if "\x00" in key or "\x00" in value:  # STOMP frames end at a NUL: no consumer there
            raise InvalidInput(f"header {key[:40]!r} contains a NUL character")
        if len(key) + len(value) > max_header_size:
            raise InvalidInput(
                f"header {key[:40]!r} is {len(key) + len(value)} characters, more than the "
                f"limit of {max_header_size}"
            )
    raw = headers.get(GROUP_SEQ_HEADER)
    if raw is not None:
        group_seq(raw)


def persistent(raw: str | None) -> bool:
    """A STOMP `persistent` header: absent, `true` or `false` (any case); nothing else."""
    if raw is None:
        return False
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidInput(f"persistent must be true or false, got {raw[:40]!r}")
    return value == "true"
