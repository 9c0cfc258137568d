"""STOMP on a real node through stomp.py and raw sockets: connecting, messages, ack modes and
prefetch, transactions, NACK."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import NodeProcess, unique
from ports import reserve_port
from stomp_helpers import (
    Connect,
    Raw,
    queue_depth,
    send_group,
    seqs,
    stomp_extra,
    subscribe,
)
from waiting import wait

from broker.client import SyncClient
from pinmq.stomp.frames import encode_frame

# ---- connecting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_each_version_sends_subscribes_acks_and_disconnects(
    version: str, connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    conn, rec = connect(version)
    assert rec.connected["version"] == version
    assert ("heart-beat" in rec.connected) == (version != "1.0")
    value = "plain" if version == "1.0" else "a:b\\c\nd"
    for i in range(3):
        conn.send(f"/queue/{q}", f"m{i}", headers={"x-custom": value, "persistent": "true"})
    if version == "1.0":
        conn.subscribe(f"/queue/{q}", ack="client")  # 1.0: the id defaults to the destination
    else:
        conn.subscribe(f"/queue/{q}", id="s1", ack="client")
    got = rec.wait_messages(3)
    assert [m.body for m in got] == ["m0", "m1", "m2"]
    for m in got:
        assert m.headers["x-custom"] == value
        assert m.headers["destination"] == f"/queue/{q}"
        assert m.headers["persistent"] == "true"
        assert ("ack" in m.headers) == (version == "1.2")
    last = got[-1]
    receipt = unique("ack")
    if version == "1.0":
        conn.ack(last.headers["message-id"], receipt=receipt)
    elif version == "1.1":
        conn.ack(last.headers["message-id"], last.headers["subscription"], receipt=receipt)
    else:
        conn.ack(last.headers["ack"], receipt=receipt)
    rec.wait_receipt(receipt)  # client mode: cumulative, all three are acknowledged
    assert queue_depth(admin, q) == 0
    receipt = unique("unsub")
    if version == "1.0":
        conn.unsubscribe(destination=f"/queue/{q}", headers={"receipt": receipt})
    else:
        conn.unsubscribe(id="s1", headers={"receipt": receipt})
    rec.wait_receipt(receipt)
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    assert not rec.errors


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_in_each_version(version: str, connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect(version)
    send_group(conn, rec, q, "g", [1, 2])
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    m1, _ = rec.wait_messages(2)
    if version == "1.1":
        conn.nack(m1.headers["message-id"], "s")
    else:
        conn.nack(m1.headers["ack"])
    again = rec.wait_messages(4)[2:]
    assert seqs(again) == [1, 2]
    assert again[0].headers["message-id"] == m1.headers["message-id"]
    for m in again:
        if version == "1.1":
            conn.ack(m.headers["message-id"], "s")
        else:
            conn.ack(m.headers["ack"])
    wait("acks of the redelivered messages", lambda: queue_depth(admin, q) == 0)


def test_stomp_10_unsubscribes_by_destination(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect("1.0")
    send_group(conn, rec, q, "g", [1])
    conn.subscribe(f"/queue/{q}", id="explicit", ack="client")
    rec.wait_messages(1)
    conn.unsubscribe(destination=f"/queue/{q}", headers={"receipt": "gone"})
    rec.wait_receipt("gone")
    assert [(x.depth, x.consumer_count) for x in admin.queues() if x.name == q] == [(1, 0)]


def test_version_negotiation_refuses_unknown_versions(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(encode_frame("CONNECT", {"accept-version": "2.0,3.1", "host": "h"}))
    [error] = r.until_closed()
    assert error.command == "ERROR"
    assert error.headers["version"] == "1.0,1.1,1.2"
    assert "supported protocol versions" in error.headers["message"]


def test_stomp_frame_picks_the_highest_common_version(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(encode_frame("STOMP", {"accept-version": "1.0,1.1", "host": "vhost"}))
    connected = r.frame()
    assert connected.command == "CONNECTED"
    assert connected.headers["version"] == "1.1"
    assert connected.headers["server"].startswith("pinmq/")
    assert connected.headers["session"]


def test_connect_without_accept_version_is_stomp_10(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(b"CONNECT\nlogin:guest\npasscode:guest\n\n\0")
    connected = r.frame()
    assert connected.headers["version"] == "1.0"
    assert "heart-beat" not in connected.headers


def test_no_connect_frame_in_time_closes_the_connection(raw: Callable[..., Raw]) -> None:
    [error] = raw().until_closed()
    assert "no CONNECT frame within 2000 ms" in error.headers["message"]


# ---- messages ------------------------------------------------------------------------------------


def test_message_frame_headers(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2], **{"content-type": "text/plain", "x-y": "z"})
    conn.send(f"/queue/{q}", "ungrouped", headers={"receipt": "r-ungrouped"})
    rec.wait_receipt("r-ungrouped")
    conn.send(f"/queue/{q}", "no seq", headers={"_AMQ_GROUP_ID": "h", "receipt": "r-noseq"})
    rec.wait_receipt("r-noseq")
    subscribe(conn, rec, q, "s1", ack="client-individual")
    m1, m2, m3, m4 = rec.wait_messages(4)
    assert m4.headers["JMSXGroupID"] == "h"  # the group key, whichever header named it
    assert "JMSXGroupSeq" not in m4.headers  # the sender set no sequence: none is made up
    assert m1.headers["subscription"] == "s1"
    assert m1.headers["destination"] == f"/queue/{q}"
    assert m1.headers["JMSXGroupID"] == "g"
    assert [m1.headers["JMSXGroupSeq"], m2.headers["JMSXGroupSeq"]] == ["1", "2"]
    assert m1.headers["content-type"] == "text/plain"
    assert m1.headers["x-y"] == "z"
    assert m1.headers["persistent"] == "true"
    assert "redelivered" not in m1.headers
    assert "JMSXGroupID" not in m3.headers
    assert "persistent" not in m3.headers
    ids = [m.headers["message-id"] for m in (m1, m2, m3)]
    acks = [m.headers["ack"] for m in (m1, m2, m3)]
    assert len(set(ids)) == 3
    assert len(set(acks)) == 3


def test_binary_bodies_with_nul_bytes(connect: Connect) -> None:
    q = unique()
    conn, rec = connect(auto_decode=False)
    body = bytes(range(256)) + b"\0\0end"
    conn.send(f"/queue/{q}", body, headers={"receipt": "r"})
    rec.wait_receipt("r")
    subscribe(conn, rec, q, "s", ack="auto")
    [m] = rec.wait_messages(1)
    assert m.body == body


def test_large_messages_in_order(connect: Connect) -> None:
    q = unique()
    conn, rec = connect(auto_decode=False)
    bodies = [bytes([i]) * (900 * 1024) for i in range(5)]  # written in slices, not all at once
    for i, body in enumerate(bodies):
        conn.send(f"/queue/{q}", body, headers={"JMSXGroupID": "g", "receipt": f"r{i}"})
    rec.wait_receipt("r4")
    subscribe(conn, rec, q, "s", ack="auto")
    assert [m.body for m in rec.wait_messages(5)] == bodies


def test_bare_destination_names_the_same_queue(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    conn.send(q, "bare", headers={"receipt": "r"})
    rec.wait_receipt("r")
    subscribe(conn, rec, q, "s", ack="auto")
    [m] = rec.wait_messages(1)
    assert m.body == "bare"


def test_persistent_send_receipt_means_on_disk(
    node_factory: Callable[..., NodeProcess], connect: Connect
) -> None:
    port = reserve_port()
    node = node_factory(stomp_extra(port))
    q = unique()
    conn, rec = connect(port=port)
    send_group(conn, rec, q, "g", [1, 2, 3])
    node.kill()  # kill -9 right after the receipt
    node.start()
    with SyncClient(node.url) as client:
        got = client.consume(q, 3)
    assert [(m.group_id, m.group_seq, m.body) for m in got] == [
        ("g", i, f"g-{i}".encode()) for i in (1, 2, 3)
    ]


def test_receipts_for_every_frame_type_in_order(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    conn.send(f"/queue/{q}", "a", headers={"receipt": "r1", "persistent": "true"})
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual", headers={"receipt": "r2"})
    [m] = rec.wait_messages(1)
    conn.begin("tx", headers={"receipt": "r3"})
    conn.send(f"/queue/{q}", "b", headers={"transaction": "tx", "receipt": "r4"})
    conn.commit("tx", headers={"receipt": "r5"})
    conn.begin("tx2", headers={"receipt": "r6"})
    conn.abort("tx2", headers={"receipt": "r7"})
    conn.ack(m.headers["ack"], receipt="r8")
    [_, m2] = rec.wait_messages(2)
    conn.nack(m2.headers["ack"], receipt="r9")
    conn.unsubscribe(id="s", headers={"receipt": "r10"})
    conn.disconnect(receipt="r11")
    rec.wait_receipt("r11")
    assert rec.receipts == [f"r{i}" for i in range(1, 12)]
    assert queue_depth(admin, q) == 1  # "b" was released, then returned by the unsubscribe


# ---- ack modes and prefetch ----------------------------------------------------------------------


def test_auto_ack_consumes_without_ack_frames(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3, 4])
    subscribe(conn, rec, q, "s", ack="auto")
    assert seqs(rec.wait_messages(4)) == [1, 2, 3, 4]
    wait("auto acks", lambda: queue_depth(admin, q) == 0)


def test_client_ack_is_cumulative(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3, 4, 5])
    subscribe(conn, rec, q, "s", ack="client")
    got = rec.wait_messages(5)
    conn.ack(got[2].headers["ack"], receipt="r")  # acknowledges 1, 2 and 3
    rec.wait_receipt("r")
    assert queue_depth(admin, q) == 2
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    conn2, rec2 = connect()
    subscribe(conn2, rec2, q, "s", ack="client")
    again = rec2.wait_messages(2)
    assert seqs(again) == [4, 5]
    assert all(m.headers["redelivered"] == "true" for m in again)


def test_client_individual_acks_only_the_named_message(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3, 4, 5])
    subscribe(conn, rec, q, "s", ack="client-individual")
    got = rec.wait_messages(5)
    conn.ack(got[1].headers["ack"])
    conn.ack(got[3].headers["ack"], receipt="r")
    rec.wait_receipt("r")
    assert queue_depth(admin, q) == 3
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    conn2, rec2 = connect()
    subscribe(conn2, rec2, q, "s", ack="client-individual")
    again = rec2.wait_messages(3)
    assert seqs(again) == [1, 3, 5]
    assert [m.headers["JMSXDeliveryCount"] for m in again] == ["2", "2", "2"]


@pytest.mark.parametrize("header", ["activemq.prefetchSize", "prefetch-count"])
def test_prefetch_bounds_unacknowledged_messages(
    header: str, connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", list(range(1, 11)))
    subscribe(conn, rec, q, "s", ack="client-individual", **{header: "3"})
    got = rec.wait_messages(3)
    [group] = admin.groups(q)
    assert (group.outstanding, group.pending) == (3, 7)
    conn.ack(got[0].headers["ack"])
    rec.wait_messages(4)
    [group] = admin.groups(q)
    assert (group.outstanding, group.pending) == (3, 6)


# ---- transactions --------------------------------------------------------------------------------


def test_transactional_sends_apply_on_commit_only(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    conn.begin("t1")
    for i in range(3):
        conn.send(f"/queue/{q}", f"m{i}", headers={"transaction": "t1", "persistent": "true"})
    conn.begin("t2")
    conn.send(f"/queue/{q}", "never", headers={"transaction": "t2"})
    conn.abort("t2", headers={"receipt": "aborted"})
    rec.wait_receipt("aborted")
    assert not queue_depth(admin, q)
    conn.commit("t1", headers={"receipt": "committed"})
    rec.wait_receipt("committed")
    assert queue_depth(admin, q) == 3


def test_transactional_acks_apply_on_commit_only(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3])
    subscribe(conn, rec, q, "s", ack="client-individual")
    m1, m2, _ = rec.wait_messages(3)
    conn.begin("t1")
    conn.ack(m1.headers["ack"], transaction="t1")
    conn.ack(m2.headers["ack"], transaction="t1")
    conn.abort("t1", headers={"receipt": "aborted"})
    rec.wait_receipt("aborted")
    assert queue_depth(admin, q) == 3
    conn.begin("t2")
    conn.ack(m1.headers["ack"], transaction="t2")
    conn.commit("t2", headers={"receipt": "committed"})
    rec.wait_receipt("committed")
    assert queue_depth(admin, q) == 2


def test_uncommitted_transaction_is_discarded_on_disconnect(
    connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    conn, rec = connect()
    conn.send(f"/queue/{q}", "kept", headers={"receipt": "r"})
    rec.wait_receipt("r")
    conn.begin("t")
    conn.send(f"/queue/{q}", "dropped", headers={"transaction": "t"})
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    assert queue_depth(admin, q) == 1


# ---- NACK ----------------------------------------------------------------------------------------


def test_nack_releases_to_the_group_head_in_order(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3])
    subscribe(conn, rec, q, "s", ack="client-individual")
    m1, m2, _ = rec.wait_messages(3)
    conn.ack(m1.headers["ack"])
    conn.nack(m2.headers["ack"])  # 2 and the later 3 come back, in order
    again = rec.wait_messages(5)[3:]
    assert seqs(again) == [2, 3]
    assert [m.headers["redelivered"] for m in again] == ["true", "true"]
    assert [m.headers["JMSXDeliveryCount"] for m in again] == ["2", "2"]


def test_nack_without_requeue_dead_letters(connect: Connect, admin: SyncClient) -> None:
    q, dla = unique(), unique("dla")
    admin.create_queue(q, dead_letter_address=dla)
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2])
    subscribe(conn, rec, q, "s", ack="client-individual")
    m1, m2 = rec.wait_messages(2)
    conn.nack(m1.headers["ack"], requeue="false")
    conn.ack(m2.headers["ack"], receipt="r")
    rec.wait_receipt("r")
    assert queue_depth(admin, q) == 0
    conn2, rec2 = connect()
    subscribe(conn2, rec2, dla, "d", ack="auto")
    [dead] = rec2.wait_messages(1)
    assert dead.body == "g-1"
    assert dead.headers["_AMQ_ORIG_QUEUE"] == q
