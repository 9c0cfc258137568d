"""Load for tests/node/test_crash.py, run as its own process so the test's bookkeeping survives.

    python tests/crash_load.py URL QUEUE RECORD_FILE --groups 20 --seq-base 0

Producers send persistent grouped messages (one task per group, one batch in flight per
group, JMSXGroupSeq seq_base+1, +2, ... in order) and a consumer acks with receipts. Every
step is appended to RECORD_FILE as one line, written and flushed only once the step is known
to have happened:

    T group seq                     about to send (the outcome is unknown until an S line)
    S msg_id group seq              the send was acknowledged: the message is on disk
    D msg_id group seq count        delivered to the consumer (delivery_count `count`)
    A msg_id msg_id ...             ack sent, receipt not (yet) in
    R msg_id msg_id ...             ack receipt arrived: the ack is on disk

The consumer always keeps its newest `--hold` deliveries unacked, so a crash finds messages
delivered but not acked. With --kill-pid the load itself SIGKILLs the node the moment an ack
receipt arrives once --kill-after-sends sends and --kill-after-receipts ack receipts are in
(the instant at which a receipt sent ahead of its commit would show). The process ends by
itself at the first error (the node was killed), or after --max-seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import traceback
from collections import deque
from typing import TextIO

from broker.client import Client, PinmqError, Received

GROUP_ID = "JMSXGroupID"
GROUP_SEQ = "JMSXGroupSeq"


class Recorder:
    """Appends whole lines, flushed at once (one write call per line)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.sends = 0
        self.receipts = 0

    def line(self, *fields: object) -> None:
        self.out.write(" ".join(str(f) for f in fields) + "\n")
        self.out.flush()


async def produce(
    client: Client, queue: str, group: str, seq_base: int, batch: int, pad: int, rec: Recorder
) -> None:
    producer = client.producer(queue)  # group headers are set by hand, seq_base + 1, ...
    seq = seq_base
    while True:
        seqs = list(range(seq + 1, seq + batch + 1))
        for s in seqs:
            rec.line("T", group, s)
        items = [(f"{group}:{s}:" + "x" * pad, {GROUP_ID: group, GROUP_SEQ: str(s)}) for s in seqs]
        ids = await producer.send_batch(items)
        for msg_id, s in zip(ids, seqs, strict=True):
            rec.line("S", msg_id, group, s)
        rec.sends += len(ids)
        seq = seqs[-1]


async def consume(
    client: Client,
    queue: str,
    hold: int,
    ack_batch: int,
    rec: Recorder,
    kill: tuple[int, int, int] | None,
) -> None:
    async with client.consumer(queue, name="crash-load", prefetch=hold + 2 * ack_batch) as c:
        held: deque[Received] = deque()
        while True:
            m = await c.receive(5.0)
            if m is None:
                raise PinmqError("the consumer stream ended or stayed idle", "UNAVAILABLE")
            while m is not None:
                rec.line("D", m.msg_id, m.group_id, m.group_seq, m.delivery_count)
                held.append(m)
                m = await c.receive(0) if len(held) < hold + ack_batch else None
            if len(held) <= hold:
                continue
            n = min(ack_batch, len(held) - hold)
            batch = [held.popleft() for _ in range(n)]
            ids = " ".join(str(x.msg_id) for x in batch)
            rec.line("A", ids)
            await asyncio.wait_for(c.ack_many(batch, wait=True), 10.0)
            rec.line("R", ids)
            rec.receipts += len(batch)
            if kill is not None and rec.sends >= kill[1] and rec.receipts >= kill[2]:
                os.kill(kill[0], signal.SIGKILL)
                kill = None


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("record")
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--seq-base", type=int, default=0)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--pad", type=int, default=0, help="body bytes added to each message")
    parser.add_argument("--hold", type=int, default=30)
    parser.add_argument("--ack-batch", type=int, default=20)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--kill-pid", type=int)
    parser.add_argument("--kill-after-sends", type=int, default=2000)
    parser.add_argument("--kill-after-receipts", type=int, default=200)
    args = parser.parse_args()
    with open(args.record, "a", buffering=1) as out:
        rec = Recorder(out)
        kill = None
        if args.kill_pid is not None:
            kill = (args.kill_pid, args.kill_after_sends, args.kill_after_receipts)
        async with Client(args.url) as client:
            tasks = [
                asyncio.create_task(
                    produce(
                        client, args.queue, f"g{i:02d}", args.seq_base, args.batch, args.pad, rec
                    )
                )
                for i in range(args.groups)
            ]
            tasks.append(
                asyncio.create_task(
                    consume(client, args.queue, args.hold, args.ack_batch, rec, kill)
                )
            )
            done, pending = await asyncio.wait(
                tasks, timeout=args.max_seconds, return_when=asyncio.FIRST_EXCEPTION
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            errors = [t.exception() for t in done if not t.cancelled() and t.exception()]
    for err in errors:
        if isinstance(err, PinmqError | TimeoutError):
            print(f"load ended: {type(err).__name__}: {err}", file=sys.stderr)
        else:
            traceback.print_exception(err)
    return 0 if all(isinstance(e, PinmqError | TimeoutError) for e in errors) else 2


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
