"""Producing: single sends, batches, and pipelined streams of batches, with group numbering."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import grpc

from broker.audit import MID_HEADER
from broker.client.base import BATCH_BYTES, Body, Item, Link
from broker.client.errors import OutcomeUnknown, PinmqError, error_for, from_rpc
from broker.message import GROUP_SEQ_HEADER
from pinmq_pb import client_pb2 as pb


class Producer:
    """Sends to one address; when grouped, numbers its messages with JMSXGroupSeq 1, 2, 3..."""

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

    def _message(self, body: Body, headers: Mapping[str, str] | None) -> pb.Message:
        hdrs = dict(headers) if headers else {}
        if self.group_id is not None:
            hdrs[self.group_header] = self.group_id
            hdrs[GROUP_SEQ_HEADER] = str(next(self._seq))
        if self.producer_id is not None:
            hdrs[MID_HEADER] = f"{self.producer_id}/{next(self._mids)}"
        data = body.encode() if isinstance(body, str) else body
        return pb.Message(address=self.address, body=data, headers=hdrs, persistent=self.persistent)

    def _item(self, item: Item) -> pb.Message:
        if isinstance(item, tuple):
            return self._message(item[0], item[1])
        return self._message(item, None)

    async def send(self, body: Body, headers: Mapping[str, str] | None = None) -> int:
        """Send one message; returns its id once the node has it (on disk if persistent)."""
        return (await self._send_one_batch([self._message(body, headers)]))[0]

    async def send_batch(self, items: Sequence[Item]) -> list[int]:
        """Send several messages in one request: all are accepted or none."""
        return await self._send_one_batch([self._item(i) for i in items])

    async def _send_one_batch(self, messages: list[pb.Message]) -> list[int]:
        """One batch on a SendStream: unlike a unary call, the stream can say at once that
        the node holds the batch for room (address-full-policy BLOCK, a full disk), and then
        no deadline runs while it waits; `on_blocked` of the client hears of it."""
        client = self._client
        call = client._broker.SendStream()
        try:
            async with asyncio.timeout(client.call_timeout) as limit:
                await call.write(pb.SendBatchRequest(messages=messages))
                await call.done_writing()
                async for result in call:
                    if result.blocked:
                        limit.reschedule(None)
                        client._blocked()
                        continue
                    if result.error_code:
                        message = f"refused by {client.target}: {result.error_message}"
                        raise error_for(result.error_code, message)
                    self._audit_sent(messages, result.msg_ids)
                    return list(result.msg_ids)
        except grpc.RpcError as err:
            raise from_rpc(err, client.target) from None
        except TimeoutError:
            raise OutcomeUnknown(
                f"no answer from {client.target} in time: the outcome is unknown",
                "DEADLINE_EXCEEDED",
            ) from None
        finally:
            call.cancel()
        raise OutcomeUnknown(
            f"the send stream to {client.target} ended without a result: the outcome is unknown",
            "UNAVAILABLE",
        )

    def _audit_sent(self, messages: Sequence[pb.Message], ids: Sequence[int]) -> None:
        """`client_sent` for messages the node confirmed (audit log only)."""
        audit = self._client.audit
        if audit is None or self.producer_id is None:
            return
        group = self.group_id
        for m, msg_id in zip(messages, ids, strict=False):
            seq = m.headers.get(GROUP_SEQ_HEADER)
            audit.record(
                "client_sent",
                msg_id=msg_id,
                mid=m.headers.get(MID_HEADER),
                address=m.address,
                group=group,
                group_seq=int(seq) if seq else None,
                producer=self.producer_id,
            )

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
        call = self._client._broker.SendStream()
        credit = asyncio.Semaphore(window)
        ids: list[int] = []
        failure: list[BaseException] = []
        in_flight: deque[list[pb.Message]] = deque()  # batches awaiting results (audit log)
        auditing = self._client.audit is not None and self.producer_id is not None
        timer: list[asyncio.Timeout] = []  # the deadline now waited on: lifted while blocked
        blocked = False  # the node holds a batch for room (address-full-policy BLOCK)

        async def read_results() -> None:
            nonlocal blocked
            try:
                async for result in call:
                    if result.blocked:
                        blocked = True
                        self._client._blocked()
                        for limit in timer:
                            limit.reschedule(None)
                        continue
                    blocked = False
                    if result.error_code:
                        message = f"refused by {self._client.target}: {result.error_message}"
                        raise error_for(result.error_code, message)
                    ids.extend(result.msg_ids)
                    if auditing:
                        self._audit_sent(in_flight.popleft(), result.msg_ids)
                    if on_sent is not None:
                        on_sent(len(result.msg_ids))
                    credit.release()
            except grpc.RpcError as err:
                failure.append(from_rpc(err, self._client.target))
            except PinmqError as err:
                failure.append(err)
            if failure:
                for _ in range(window):  # unblock the writer so it sees the failure
                    credit.release()

        reader = asyncio.create_task(read_results())
        deadline = self._client.call_timeout
        try:
            for batch in self._batches(items, batch_size):
                # a result frees a slot, or none comes
                async with asyncio.timeout(None if blocked else deadline) as limit:
                    timer[:] = [limit]
                    await credit.acquire()
                if failure:
                    break
                if auditing:
                    in_flight.append(batch)
                await call.write(pb.SendBatchRequest(messages=batch))
            if not failure:
                await call.done_writing()
            async with asyncio.timeout(None if blocked else deadline) as limit:
                timer[:] = [limit]
                await reader
        except TimeoutError:
            failure.append(
                OutcomeUnknown(
                    f"no result from {self._client.target} within {deadline:g} s: the outcome "
                    "of the batches in flight is unknown",
                    "DEADLINE_EXCEEDED",
                )
            )
        except grpc.RpcError as err:
            await reader
            if not failure:
                failure.append(from_rpc(err, self._client.target))
        except asyncio.InvalidStateError:  # the stream ended before this write: the reader says why
            await reader
            if not failure:
                failure.append(
                    OutcomeUnknown(
                        f"the send stream to {self._client.target} ended: the outcome of the "
                        "batches in flight is unknown",
                        "UNAVAILABLE",
                    )
                )
        finally:
            if not reader.done():
                reader.cancel()
            call.cancel()
        if failure:
            raise failure[0]
        return ids

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
