"""Producing: single sends, batches, and pipelined streams of batches, with group numbering.

Every message carries a duplicate id (`_AMQ_DUPL_ID`) fixed when it is made, so a send cut
short by a drop goes again, after a failover, as the very same messages: a node that took
them already drops the copies, and a group's JMSXGroupSeq is never renumbered.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from grpc._cython import cygrpc  # the error grpcio's own half-close lets out (see _stream)

from broker.audit_schema import MID_HEADER, Kind
from broker.client.base import BATCH_BYTES, Body, Item, Link
from broker.client.errors import (
    ConnectionLost,
    EndedUnderWrite,
    OutcomeUnknown,
    PinmqError,
    error_for,
    from_rpc,
    moved_under,
)
from broker.message import DUPLICATE_ID_HEADER, GROUP_SEQ_HEADER
from pinmq_pb import client_pb2 as pb


@dataclass(slots=True)
class _Backlog:
    """What a send still owes: the batches taken but not confirmed, in order, then the rest.

    A batch joins `unconfirmed` before it is written and leaves it with its result, so after
    a drop the next stream starts with exactly what may not have been taken."""

    rest: Iterator[list[pb.Message]]
    unconfirmed: deque[list[pb.Message]] = field(default_factory=deque)
    ids: list[int] = field(default_factory=list)

    def batches(self) -> Iterator[list[pb.Message]]:
        yield from list(self.unconfirmed)
        for batch in self.rest:
            self.unconfirmed.append(batch)
            yield batch

    def resend_hint(self) -> str:
        """How to send again safely what the node may or may not have taken."""
        messages = [m for batch in self.unconfirmed for m in batch]
        if not messages:
            return ""
        first, last = (m.headers[DUPLICATE_ID_HEADER] for m in (messages[0], messages[-1]))
        return (
            f"; the messages may be sent again safely with the same {DUPLICATE_ID_HEADER} "
            f"headers ({first} to {last}): a node drops a copy of one it already took"
        )


# Attempts of a send whose stream ended under a write with its status lost (EndedUnderWrite).
ASK_AGAIN = 3


class Producer:
    """Sends to one address; when grouped, numbers its messages with JMSXGroupSeq 1, 2, 3...

    Each message gets a `_AMQ_DUPL_ID` header, `<producer uuid>:<n>`, unless it has one.
    """

    def __init__(
        self,
        client: Link,
        address: str,
        group_id: str | None,
        group_header: str,
        persistent: bool,
    ) -> None:
        self.address = address
        self.group_id = group_id
        self.group_header = group_header
        self.persistent = persistent
        self._client = client
        self._seq = itertools.count(1)
        self.producer_id: str | None = None  # set when the client audits: mids are <id>/<n>
        self._mids = itertools.count(1)
        self._uuid = uuid.uuid4().hex  # duplicate ids are <uuid>:<n>
        self._made = itertools.count(1)

    def _message(self, body: Body, headers: Mapping[str, str] | None) -> pb.Message:
        hdrs = dict(headers) if headers else {}
        if self.group_id is not None:
            hdrs[self.group_header] = self.group_id
            hdrs[GROUP_SEQ_HEADER] = str(next(self._seq))
        if self.producer_id is not None:
            hdrs[MID_HEADER] = f"{self.producer_id}/{next(self._mids)}"
        if DUPLICATE_ID_HEADER not in hdrs:
            hdrs[DUPLICATE_ID_HEADER] = f"{self._uuid}:{next(self._made)}"
        data = body.encode() if isinstance(body, str) else body
        return pb.Message(address=self.address, body=data, headers=hdrs, persistent=self.persistent)

    def _item(self, item: Item) -> pb.Message:
        if isinstance(item, tuple):
            return self._message(item[0], item[1])
        return self._message(item, None)

    async def send(self, body: Body, headers: Mapping[str, str] | None = None) -> int:
        """Send one message; returns its id once the node has it (on disk if persistent)."""
        return (await self._send(iter([[self._message(body, headers)]]), window=1))[0]

    async def send_batch(self, items: Sequence[Item]) -> list[int]:
        """Send several messages in one request: all are accepted or none."""
        return await self._send(iter([[self._item(i) for i in items]]), window=1)

    async def send_many(
        self,
        items: Iterable[Item],
        *,
        batch_size: int = 500,
        window: int = 8,
        on_sent: Callable[[int], None] | None = None,
    ) -> list[int]:
        """Stream many messages, `window` batches in flight; returns the ids in order.

        `on_sent(n)` is called as each batch of n messages is confirmed. On the first failed
        batch this raises; the batches confirmed before it are enqueued. While the node holds
        a batch for room (address-full-policy BLOCK) no deadline runs.
        """
        return await self._send(self._batches(items, batch_size), window, on_sent)

    async def _send(
        self,
        batches: Iterator[list[pb.Message]],
        window: int,
        on_sent: Callable[[int], None] | None = None,
    ) -> list[int]:
        """Send `batches` on a SendStream; after a drop, what was not confirmed goes again on
        the node the client moved to. A batch the node refused is never sent again."""
        backlog = _Backlog(batches)
        unknown: OutcomeUnknown | None = None
        for _ in range(ASK_AGAIN):
            try:
                await self._client._with_failover(
                    lambda: self._stream(backlog, window, on_sent), repeat_unknown=True
                )
                return backlog.ids
            except EndedUnderWrite as err:
                # grpcio lost the status that ended the stream: ask again (duplicate ids make
                # a second copy harmless); a refusal comes back with its own status this time.
                unknown = unknown or err
            except ConnectionLost:
                if unknown is None:
                    raise
                break  # the node is gone: what the first attempt did stays unknown
            except OutcomeUnknown as err:
                unknown = err
                break
        assert unknown is not None
        raise OutcomeUnknown(f"{unknown}{backlog.resend_hint()}", unknown.code) from None

    async def _stream(
        self, backlog: _Backlog, window: int, on_sent: Callable[[int], None] | None
    ) -> None:
        """One SendStream, `window` batches awaiting results at most. Unlike a unary call, it
        says at once that the node holds a batch for room (address-full-policy BLOCK, a full
        disk), and then no deadline runs while it waits; `on_blocked` of the client hears of
        it."""
        client = self._client
        target = client.target  # the node of this stream, wherever the client moves meanwhile
        call = client._broker.SendStream(metadata=client.metadata)
        credit = asyncio.Semaphore(window)
        failure: list[PinmqError] = []
        timer: list[asyncio.Timeout] = []  # the deadline now waited on: lifted while blocked
        blocked = False  # the node holds a batch for room (address-full-policy BLOCK)

        async def read_results() -> None:
            nonlocal blocked
            try:
                async for result in call:
                    if result.blocked:
                        blocked = True
                        client._blocked()
                        for limit in timer:
                            limit.reschedule(None)
                        continue
                    blocked = False
                    if result.error_code:
                        message = f"refused by {target}: {result.error_message}"
                        raise error_for(result.error_code, message)
                    backlog.ids.extend(result.msg_ids)
                    self._audit_sent(backlog.unconfirmed.popleft(), result.msg_ids, target)
                    if on_sent is not None:
                        on_sent(len(result.msg_ids))
                    credit.release()
            except grpc.RpcError as err:
                failure.append(from_rpc(err, target))
            except PinmqError as err:
                failure.append(err)
            except asyncio.CancelledError:  # the stream, not this reader, was cancelled
                failure.append(moved_under("send stream", target))
            if failure:
                for _ in range(window):  # unblock the writer so it sees the failure
                    credit.release()

        reader = asyncio.create_task(read_results())
        deadline = client.call_timeout
        try:
            for batch in backlog.batches():
                # A result frees a slot, or none comes; the write has the deadline too: a
                # stream its connection never carries must fail like a call, never hang.
                async with asyncio.timeout(None if blocked else deadline) as limit:
                    timer[:] = [limit]
                    await credit.acquire()
                    if failure:
                        break
                    await call.write(pb.SendBatchRequest(messages=batch))
                timer.clear()  # past its block a timeout cannot be lifted: `blocked` says it
            async with asyncio.timeout(None if blocked else deadline) as limit:
                timer[:] = [limit]
                if not failure:
                    await call.done_writing()
                await reader
        except TimeoutError:
            failure.append(
                OutcomeUnknown(
                    f"no result from {target} within {deadline:g} s: the outcome is unknown",
                    "DEADLINE_EXCEEDED",
                )
            )
        except grpc.RpcError as err:
            await reader
            if not failure:
                failure.append(from_rpc(err, target))
        except (asyncio.InvalidStateError, cygrpc.InternalError):
            # The stream ended before this write or half-close (grpcio raises its own internal
            # error for a half-close on an ended call): the reader says why.
            await reader
        finally:
            if not reader.done():
                reader.cancel()
            call.cancel()
        if failure:
            raise failure[0]
        if backlog.unconfirmed:
            raise OutcomeUnknown(
                f"the send stream to {target} ended without a result: the outcome is unknown",
                "UNAVAILABLE",
            )

    def _audit_sent(self, messages: Sequence[pb.Message], ids: Sequence[int], node: str) -> None:
        """`client_sent` for messages `node` confirmed (audit log only)."""
        audit = self._client.audit
        if audit is None or self.producer_id is None:
            return
        group = self.group_id
        for m, msg_id in zip(messages, ids, strict=False):
            seq = m.headers.get(GROUP_SEQ_HEADER)
            audit.record(
                Kind.CLIENT_SENT,
                node=node,
                msg_id=msg_id,
                mid=m.headers.get(MID_HEADER),
                address=m.address,
                group=group,
                group_seq=int(seq) if seq else None,
                producer=self.producer_id,
                user=self._client.user,
            )

    def _batches(self, items: Iterable[Item], batch_size: int) -> Iterator[list[pb.Message]]:
        batch: list[pb.Message] = []
        size = 0
        for item in items:
            message = self._item(item)
            batch.append(message)
            size += len(message.body)
            if len(batch) >= batch_size or size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch
