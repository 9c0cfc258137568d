"""Input checked where it enters: names and the headers the broker interprets, on gRPC and
STOMP alike, against a real node; a refused message is enqueued nowhere, and a message that
cannot be encoded for a consumer never sinks the rest of its batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from conftest import unique
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from stomp_helpers import NODE_STOMP, Connect, Raw, StompNode, queue_depth, subscribe

from broker.client import InvalidArgument, SyncClient
from broker.effects import Delivery
from broker.message import DUPLICATE_ID_HEADER, Message
from broker.validation import (
    MAX_NAME_LENGTH,
    InvalidInput,
    check_headers,
    check_name,
    group_seq,
    persistent,
)
from pinmq.grpc_api import _pack
from pinmq.stomp.frames import encode_frame
from pinmq.stomp.protocol import MESSAGE_OWN

# ---- the rules --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["orders", "a.b.c", "x" * MAX_NAME_LENGTH, "ünïcode-q"])
def test_good_names_pass(name: str) -> None:
    check_name(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "blank"),
        ("   ", "blank"),
        ("x" * (MAX_NAME_LENGTH + 1), "more than 255"),
        ("a\x00b", "NUL"),
        ("orders.*", "wildcards"),
        ("#", "wildcards"),
    ],
)
def test_bad_names_are_refused_with_the_reason(name: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        check_name(name, "queue name")


@pytest.mark.parametrize(
    ("raw", "value"), [("1", 1), ("-1", -1), (" 42 ", 42), (str(2**63 - 1), 2**63 - 1)]
)
def test_group_seq_takes_a_64_bit_integer(raw: str, value: int) -> None:
    assert group_seq(raw) == value


@pytest.mark.parametrize("raw", ["abc", "", "1.5", "1_000", "٣", str(2**63), "1" * 31, "0x10"])
def test_group_seq_refuses_anything_else(raw: str) -> None:
    with pytest.raises(InvalidInput, match="JMSXGroupSeq"):
        group_seq(raw)


def test_persistent_is_true_or_false_only() -> None:
    assert persistent(None) is False
    assert persistent("TRUE") is True and persistent("false") is False
    for value in ("1", "yes", "", "on"):
        with pytest.raises(InvalidInput, match="persistent must be true or false"):
            persistent(value)


def test_header_count_and_size_limits() -> None:
    check_headers({"a": "b"}, max_headers=1, max_header_size=2)
    with pytest.raises(InvalidInput, match="2 headers, more than the limit of 1"):
        check_headers({"a": "b", "c": "d"}, max_headers=1, max_header_size=10)
    with pytest.raises(InvalidInput, match="more than the limit of 2"):
        check_headers({"a": "bc"}, max_headers=5, max_header_size=2)


# ---- gRPC and STOMP on a real node -------------------------------------------------------


def test_grpc_refuses_bad_values_and_enqueues_nothing(snode: StompNode, admin: SyncClient) -> None:
    queue = unique("v")
    admin.create_queue(queue)
    refusals = {
        "JMSXGroupSeq 10^30": {"JMSXGroupID": "g", "JMSXGroupSeq": "1" + "0" * 30},
        "JMSXGroupSeq abc": {"JMSXGroupSeq": "abc"},
        "too many headers": {f"h{i}": "v" for i in range(NODE_STOMP["max-headers"] + 1)},
        "a header too large": {"big": "x" * NODE_STOMP["max-header-size"]},
        "a NUL in a header": {"a\x00b": "v"},
    }
    for what, headers in refusals.items():
        with pytest.raises(InvalidArgument) as err:
            admin.send(queue, b"x", headers=headers)
        assert "refused" not in what and str(err.value), what
    for name in ("bad*name", "nul\x00name", "n" * (MAX_NAME_LENGTH + 1)):
        with pytest.raises(InvalidArgument):
            admin.send(name, b"x")  # would auto-create it
        with pytest.raises(InvalidArgument):
            admin.create_queue(name)
    assert queue_depth(admin, queue) == 0
    assert not {"bad*name", "nul\x00name"} & {q.name for q in admin.queues()}


def _stomp_send(r: Raw, headers: dict[str, str]) -> Any:
    r.connect()
    r.send(encode_frame("SEND", {**headers, "receipt": "r1"}, b"x", version="1.2"))
    return r.frame()


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"JMSXGroupID": "g", "JMSXGroupSeq": "1" + "0" * 30}, "outside the signed 64-bit range"),
        ({"JMSXGroupSeq": "abc"}, "must be an integer"),
        ({"persistent": "yes"}, "persistent must be true or false"),
        ({"persistent": "1"}, "persistent must be true or false"),
    ],
)
def test_stomp_refuses_bad_values_with_an_error_and_enqueues_nothing(
    raw: Callable[..., Raw], admin: SyncClient, headers: dict[str, str], reason: str
) -> None:
    queue = unique("sv")
    admin.create_queue(queue)
    frame = _stomp_send(raw(), {"destination": f"/queue/{queue}", **headers})
    assert frame.command == "ERROR" and reason in frame.headers["message"], frame
    assert queue_depth(admin, queue) == 0


def test_stomp_refuses_a_wildcard_destination(raw: Callable[..., Raw], admin: SyncClient) -> None:
    frame = _stomp_send(raw(), {"destination": "/queue/auto.*"})
    assert frame.command == "ERROR" and "wildcards" in frame.headers["message"], frame
    assert "auto.*" not in {q.name for q in admin.queues()}


def test_the_poison_message_of_the_report_is_refused_and_consumers_live_on(
    raw: Callable[..., Raw], admin: SyncClient
) -> None:
    queue = unique("poison")
    admin.create_queue(queue)
    poison = {"destination": f"/queue/{queue}", "JMSXGroupID": "g"}
    frame = _stomp_send(raw(), {**poison, "JMSXGroupSeq": "1" + "0" * 30})
    assert frame.command == "ERROR"
    for _ in range(3):
        admin.send(queue, b"fine", group_id="other")
    got = admin.consume(queue, 3)
    assert [m.body for m in got] == [b"fine"] * 3


# ---- encoding for a consumer ------------------------------------------------------------


def test_a_delivery_that_cannot_be_encoded_is_left_out_and_the_rest_go() -> None:
    def delivery(did: int, seq: int) -> Delivery:
        m = Message(did, "q", "q", b"b", {}, group="g", group_seq=seq)
        return Delivery(did, "c1", m, False)

    good1, bad, good2 = delivery(1, 1), delivery(2, 10**30), delivery(3, 3)
    responses, unsendable = _pack([[good1, bad, good2]], None)
    sent = [d.delivery_id for r in responses for d in r.deliveries.deliveries]
    assert sent == [1, 3]
    assert [(d.delivery_id, "out of range" in why) for d, why in unsendable] == [(2, True)]


# ---- any header map: accepted means consumable by both clients ---------------------------

_RESERVED = {
    "destination",
    "receipt",
    "transaction",
    "content-length",
    "content-type",
    "persistent",
    "message-id",
    "subscription",
    "ack",
    "id",
    "expires",
    "priority",
    # The same headers are sent twice to each queue: with a duplicate-detection id the second
    # is a duplicate, dropped by design (tests/node/test_duplicates_node.py).
    DUPLICATE_ID_HEADER.lower(),
    # A MESSAGE frame's own headers: the node writes them, a sender's value is not passed on.
    *(name.lower() for name in MESSAGE_OWN),
}
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
# stomp.py escapes header values but not names: a name with one of these breaks its frames.
_name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=":\n\r\\"))
_keys = st.one_of(st.sampled_from(["JMSXGroupID", "JMSXGroupSeq", "_AMQ_GROUP_ID"]), _name)
_values = st.one_of(
    _text, st.integers(min_value=-(2**70), max_value=2**70).map(str), st.just(" 7 ")
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(headers=st.dictionaries(_keys, _values, max_size=6))
def test_any_accepted_header_map_is_consumable_over_grpc_and_stomp(
    connect: Connect,
    admin: SyncClient,
    headers: dict[str, str],
) -> None:
    """Sent over both protocols to two queues; one is read by stomp.py, one by the gRPC client."""
    headers = {k: v for k, v in headers.items() if k and k.lower() not in _RESERVED}
    to_stomp, to_grpc = (f"prop-{uuid.uuid4().hex[:10]}" for _ in range(2))
    for queue in (to_stomp, to_grpc):
        admin.create_queue(queue)
    try:
        admin.send(to_stomp, b"over-grpc", headers=headers)
    except InvalidArgument:  # refused: for a reason the rules give, and over STOMP as well
        event("refused")
        with pytest.raises(InvalidInput):
            check_headers(headers, NODE_STOMP["max-headers"], NODE_STOMP["max-header-size"])
        return
    event("accepted")
    admin.send(to_grpc, b"over-grpc", headers=headers)
    conn, rec = connect()
    for queue in (to_stomp, to_grpc):
        conn.send(f"/queue/{queue}", "over-stomp", headers={**headers, "receipt": queue})
        rec.wait(lambda q=queue: q in rec.receipts or bool(rec.errors), "receipt or error")
        assert not rec.errors, rec.errors[0].headers  # gRPC took it: STOMP takes it too
    subscribe(conn, rec, to_stomp, "s1")
    for n in (1, 2):  # acked one by one: a negative JMSXGroupSeq holds the group until then
        m = rec.wait_messages(n)[-1]
        assert {k: m.headers.get(k) for k in headers} == headers
        conn.ack(m.headers["ack"])
    assert sorted(m.body for m in rec.messages) == ["over-grpc", "over-stomp"]
    via_grpc = admin.consume(to_grpc, 1) + admin.consume(to_grpc, 1)  # one by one, as above
    assert sorted(m.body for m in via_grpc) == [b"over-grpc", b"over-stomp"]
    for m in via_grpc:
        assert {k: m.headers.get(k) for k in headers} == headers
