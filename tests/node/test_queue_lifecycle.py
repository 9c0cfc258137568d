"""Queues a client creates by using them do not pile up: auto-created queues left empty and
unused are deleted after `auto-delete-queues-delay` (also after a restart), declared and
explicitly created ones stay, and `limits.max-queues` caps how many a node holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import NodeProcess, unique
from stomp_helpers import Raw
from waiting import until

from broker.client import Client, PinmqError
from pinmq.stomp.frames import encode_frame

SETTINGS = {"#": {"auto-delete-queues-delay": 300}, "keep.#": {"auto-delete-queues": False}}


async def _names(client: Client) -> set[str]:
    return {q.name for q in await client.queues()}


async def _until_gone(client: Client, names: set[str]) -> None:
    async def gone() -> bool:
        return not names & await _names(client)

    await until(f"queues {sorted(names)} deleted", gone, every=0.1)


@pytest.mark.slow
async def test_auto_created_queues_go_once_empty_and_unused(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path, {"address-settings": SETTINGS}).start()
    try:
        sent, subscribed, kept, made = (unique(p) for p in ("sent", "sub", "keep.q", "made"))
        async with Client(node.url) as client:
            await client.create_queue(made)  # explicit: stays
            await client.producer(sent).send(b"one")  # auto-created by a send
            await client.producer(kept).send(b"one")  # auto-created, auto-delete off
            r = Raw(node.stomp_port)  # auto-created by a SUBSCRIBE
            r.connect()
            r.send(encode_frame("SUBSCRIBE", {"destination": subscribed, "id": "1",
                                              "receipt": "r"}, version="1.2"))  # fmt: skip
            assert r.frame().command == "RECEIPT"
            # A queue created after them, emptied at once, goes: the sweep ran past the delay
            # for them too, and each still holds a message or a consumer.
            control = unique("control")
            await client.producer(control).send(b"one")
            async with client.consumer(control) as consumer:
                m = await consumer.receive(timeout=5)
                assert m is not None
                await m.ack(wait=True)
            await _until_gone(client, {control})
            assert {sent, subscribed, kept, made} <= await _names(client)
            r.close()  # the subscriber goes
            async with client.consumer(sent) as consumer:  # `sent` is emptied
                m = await consumer.receive(timeout=5)
                assert m is not None
                await m.ack(wait=True)
            await _until_gone(client, {sent, subscribed})
            assert {kept, made} <= await _names(client)
            await client.producer(sent).send(b"again")  # a later send creates it again
            assert sent in await _names(client)
        # Restarted, the queue is still known as auto-created: it goes once emptied.
        node.stop()
        node.start()
        async with Client(node.url) as client:
            async with client.consumer(sent) as consumer:
                m = await consumer.receive(timeout=5)
                assert m is not None and m.body == b"again"
                await m.ack(wait=True)
            await _until_gone(client, {sent})
    finally:
        node.kill()


async def test_max_queues_caps_the_queues_a_node_holds(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path, {"limits": {"max-queues": 3}}).start()
    try:
        async with Client(node.url) as client:
            for i in range(3):
                await client.create_queue(unique(f"q{i}"))
            with pytest.raises(PinmqError, match=r"holds 3 queues \(limits.max-queues\)") as err:
                await client.producer(unique("one-too-many")).send(b"x")
            assert err.value.code == "RESOURCE_EXHAUSTED"
            with pytest.raises(PinmqError, match=r"limits\.max-queues"):
                await client.create_queue(unique("q3"))
            assert len(await client.queues()) == 3
    finally:
        node.kill()
