"""The STOMP load client's answers to a node that misbehaves: a SEND never receipted, and a
SEND answered with an ERROR frame. The node is a stand-in speaking STOMP with the node's own
frame codec, since a real node does neither on cue; everything above the socket is the client's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from broker.client import OutcomeUnknown, Refused
from broker.message import DUPLICATE_ID_HEADER
from pinmq import stomp_client
from pinmq.stomp.frames import Frame, FrameParser, encode_frame
from pinmq.stomp_client import StompClient


class SilentOrRefusingNode:
    """Connects every client; a SEND is never receipted (`refuse` None) or answered with an
    ERROR carrying its receipt id and `refuse` as its message. Other frames are receipted."""

    def __init__(self, refuse: str | None) -> None:
        self.refuse = refuse
        self.sends: list[Frame] = []
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        parser = FrameParser()
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (frame := parser.next()) is not None:
                    self.answer(frame, writer)
                    parser.escaping = True
        except ConnectionError:
            pass
        finally:
            writer.close()

    def answer(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        receipt = frame.headers.get("receipt", "")
        if frame.command == "CONNECT":
            writer.write(encode_frame("CONNECTED", {"version": "1.2"}))
        elif frame.command == "SEND":
            self.sends.append(frame)
            if self.refuse is not None:
                error = {"message": self.refuse, "receipt-id": receipt}
                writer.write(encode_frame("ERROR", error))
        elif receipt:
            writer.write(encode_frame("RECEIPT", {"receipt-id": receipt}))


@asynccontextmanager
async def node(refuse: str | None) -> AsyncIterator[tuple[SilentOrRefusingNode, str]]:
    stand_in = SilentOrRefusingNode(refuse)
    server = await asyncio.start_server(stand_in.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield stand_in, f"127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def send_one(url: str) -> None:
    async with StompClient(url, failover_timeout=1.0) as client:
        await client.producer("orders", "g1").send(b"x")


async def test_a_send_never_receipted_goes_again_with_its_id_then_is_of_unknown_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stomp_client, "RECEIPT_TIMEOUT_S", 0.3)
    async with node(refuse=None) as (stand_in, url):
        with pytest.raises(OutcomeUnknown, match="no receipt within"):
            await send_one(url)
    assert len(stand_in.sends) >= 2, "an unreceipted SEND is sent again"
    assert stand_in.connections == len(stand_in.sends)  # each on a connection of its own
    ids = {frame.headers[DUPLICATE_ID_HEADER] for frame in stand_in.sends}
    assert len(ids) == 1, "a copy carries the first one's duplicate id, for the node to drop"


async def test_a_send_answered_with_an_error_frame_is_refused_and_not_sent_again() -> None:
    async with node(refuse="address full") as (stand_in, url):
        with pytest.raises(Refused, match="address full"):
            await send_one(url)
    assert len(stand_in.sends) == 1
