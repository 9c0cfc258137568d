"""STOMP on a real node: group scenarios, interoperability with gRPC clients, heart-beats."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from conftest import unique
from stomp_helpers import (
    Connect,
    Raw,
    send_group,
    seqs,
    subscribe,
)
from waiting import wait

from broker.client import SyncClient
from pinmq.stomp.frames import encode_frame

# ---- group scenarios -----------------------------------------------------------------------------


def test_order_per_group_with_one_consumer(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    receipt = unique("r")
    for seq in range(1, 31):
        for g in ("a", "b", "c"):
            last = seq == 30 and g == "c"
            conn.send(
                f"/queue/{q}",
                f"{g}{seq}",
                headers={"JMSXGroupID": g, "JMSXGroupSeq": str(seq)}
                | ({"receipt": receipt} if last else {}),
            )
    rec.wait_receipt(receipt)
    subscribe(conn, rec, q, "s", ack="auto", **{"activemq.prefetchSize": "7"})
    per: dict[str, list[int]] = defaultdict(list)
    for m in rec.wait_messages(90):
        per[m.headers["JMSXGroupID"]].append(int(m.headers["JMSXGroupSeq"]))
    assert per == {g: list(range(1, 31)) for g in ("a", "b", "c")}


def test_each_group_is_consumed_by_one_consumer_in_order(connect: Connect) -> None:
    q = unique()
    consumers = []
    for i in range(3):
        holder: dict[str, Any] = {}

        def ack(frame: Any, holder: dict[str, Any] = holder) -> None:
            holder["conn"].ack(frame.headers["ack"])

        conn, rec = connect(on_message=ack)
        holder["conn"] = conn
        subscribe(conn, rec, q, f"c{i}", ack="client-individual", **{"prefetch-count": "5"})
        consumers.append(rec)
    producer, prec = connect()
    for g in range(9):
        send_group(producer, prec, q, f"g{g}", list(range(1, 21)))
    wait("180 messages", lambda: sum(len(r.messages) for r in consumers) >= 180)
    seen: dict[str, set[int]] = defaultdict(set)
    for i, rec in enumerate(consumers):
        per: dict[str, list[int]] = defaultdict(list)
        for m in rec.messages:
            per[m.headers["JMSXGroupID"]].append(int(m.headers["JMSXGroupSeq"]))
        for group, got in per.items():
            assert got == list(range(1, 21)), f"{group} at consumer {i}"
            seen[group].add(i)
    assert all(len(owners) == 1 for owners in seen.values()), seen
    assert {i for owners in seen.values() for i in owners} == {0, 1, 2}


@pytest.mark.parametrize("abrupt", [False, True])
def test_group_moves_when_its_consumer_leaves_with_unacked_messages(
    abrupt: bool, connect: Connect, raw: Callable[..., Raw]
) -> None:
    q = unique()
    a = raw()
    a.connect()
    a.send(
        encode_frame(
            "SUBSCRIBE", {"destination": f"/queue/{q}", "id": "a", "ack": "client-individual"}
        )
    )
    b, brec = connect()
    producer, prec = connect()
    send_group(producer, prec, q, "g", [1, 2, 3, 4, 5])
    got = [a.frame() for _ in range(5)]
    assert [f.headers["JMSXGroupSeq"] for f in got] == ["1", "2", "3", "4", "5"]
    a.send(encode_frame("ACK", {"id": got[0].headers["ack"]}))
    a.send(encode_frame("ACK", {"id": got[1].headers["ack"], "receipt": "acked"}))
    assert a.frame().headers["receipt-id"] == "acked"
    subscribe(b, brec, q, "b", ack="client-individual")  # g stays with a meanwhile
    if abrupt:
        a.close()
    else:
        a.send(encode_frame("DISCONNECT", {"receipt": "bye"}))
        assert a.frame().headers["receipt-id"] == "bye"
    moved = brec.wait_messages(3)
    assert seqs(moved) == [3, 4, 5]
    assert all(m.headers["redelivered"] == "true" for m in moved)
    assert all(m.headers["JMSXDeliveryCount"] == "2" for m in moved)


@pytest.mark.parametrize("close_group", [True, False])
def test_negative_sequence_closes_the_group(close_group: bool, connect: Connect) -> None:
    q = unique()
    a, arec = connect()
    subscribe(a, arec, q, "a", ack="client-individual")
    producer, prec = connect()
    send_group(producer, prec, q, "g", [1, 2, -3 if close_group else 3])
    for m in arec.wait_messages(3):
        a.ack(m.headers["ack"], receipt=f"ack-{m.headers['JMSXGroupSeq']}")
    arec.wait_receipt("ack--3" if close_group else "ack-3")
    send_group(producer, prec, q, "h", [1])  # a now owns h too, unacked
    arec.wait_messages(4)
    b, brec = connect()
    subscribe(b, brec, q, "b", ack="client-individual")
    send_group(producer, prec, q, "g", [4])
    if close_group:  # g was closed: it goes to the consumer with fewest groups
        [m] = brec.wait_messages(1)
    else:  # g is still pinned to a
        m = arec.wait_messages(5)[4]
    assert (m.headers["JMSXGroupID"], m.headers["JMSXGroupSeq"]) == ("g", "4")


def test_group_first_key_marks_the_first_message_of_each_group(
    connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    admin.create_queue(q, group_first_key="JMSXGroupFirstForConsumer")
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2])
    send_group(conn, rec, q, "h", [1])
    subscribe(conn, rec, q, "s", ack="auto")
    first = {
        (m.headers["JMSXGroupID"], m.headers["JMSXGroupSeq"]): m.headers.get(
            "JMSXGroupFirstForConsumer"
        )
        for m in rec.wait_messages(3)
    }
    assert first == {("g", "1"): "true", ("g", "2"): None, ("h", "1"): "true"}


# ---- interoperability with gRPC ------------------------------------------------------------------


def test_stomp_to_grpc(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3], **{"x-from": "stomp"})
    got = admin.consume(q, 3)
    assert [(m.group_id, m.group_seq, m.body) for m in got] == [
        ("g", i, f"g-{i}".encode()) for i in (1, 2, 3)
    ]
    assert all(m.persistent and m.headers["x-from"] == "stomp" for m in got)


def test_grpc_to_stomp(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    ids = [admin.send(q, f"b{i}", group_id="g", headers={"x-from": "grpc"}) for i in range(3)]
    conn, rec = connect()
    subscribe(conn, rec, q, "s", ack="client-individual")
    got = rec.wait_messages(3)
    assert [m.headers["message-id"] for m in got] == [str(i) for i in ids]
    assert [m.headers["JMSXGroupID"] for m in got] == ["g", "g", "g"]
    assert seqs(got) == [1, 2, 3]
    assert [m.body for m in got] == ["b0", "b1", "b2"]
    assert got[0].headers["x-from"] == "grpc"


# ---- heart-beats ---------------------------------------------------------------------------------


def test_heart_beats_both_ways_keep_an_idle_connection(connect: Connect) -> None:
    q = unique()
    # 500 ms: the node allows twice that between beats, so a beat a loaded machine delays by
    # a few hundred ms (tests run side by side) does not end the connection.
    conn, rec = connect(heartbeats=(500, 500))
    assert rec.connected["heart-beat"] == "500,500"
    rec.wait(lambda: rec.heartbeats >= 3, "3 heart-beats from the node")
    assert conn.is_connected() and not rec.disconnected
    send_group(conn, rec, q, "g", [1])  # still usable after idling past the node's allowance


def test_client_that_stops_heart_beating_is_closed(raw: Callable[..., Raw]) -> None:
    r = raw()
    connected = r.connect(**{"heart-beat": "100,0"})
    assert connected.headers["heart-beat"] == "0,100"
    frames = r.until_closed()  # the client promised a beat every 100 ms and sends nothing
    assert frames[-1].command == "ERROR"
    assert "heart-beat" in frames[-1].headers["message"]
