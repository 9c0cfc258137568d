"""The `pinmq` verbs that talk to a node through the Python client: send, consume, wait,
queues, groups, reset-groups and status (`pinmq/cli.py` parses the command line).

Progress bars appear only on a terminal, so piped output stays machine-readable.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from broker.client import CALL_TIMEOUT_S, Client, ClusterStatus, PinmqError, Received
from broker.tls import TlsError, TlsFiles

Printer = Callable[[str], None]


class UsageError(PinmqError):
    """A combination of arguments argparse cannot reject by itself (exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "INVALID_ARGUMENT")


@contextmanager
def _progress(label: str, total: int | None) -> Iterator[tuple[Callable[[int], None], Printer]]:
    """An advance(n) callback and a line printer; a progress bar only on a terminal."""
    if not sys.stdout.isatty() or total == 1:
        yield (lambda _n: None), print
        return
    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield (
            (lambda n: bar.advance(task, n)),
            (lambda line: bar.console.print(line, markup=False, highlight=False)),
        )


# ---- client verbs ---------------------------------------------------------------------------


async def _send(client: Client, args: argparse.Namespace) -> None:
    producer = client.producer(
        args.address,
        group_id=args.group,
        auto_group=args.auto_group,
        persistent=not args.non_persistent,
    )
    headers = dict(args.header)
    if args.stdin:
        items: Any = ((line.rstrip("\n"), headers) for line in sys.stdin)
        total = None
    else:
        items = ((args.body, headers) for _ in range(args.count))
        total = args.count
    with _progress(f"sending to {args.address}", total) as (advance, _):
        ids = await producer.send_many(items, on_sent=advance)
    group = f" in group {producer.group_id}" if producer.group_id else ""
    print(f"sent {len(ids)} messages to {args.address}{group}")


async def _consume(client: Client, args: argparse.Namespace) -> None:
    prefetch = min(args.prefetch, args.count) if args.count else args.prefetch
    timeout = args.timeout or None
    received = 0
    with _progress(f"consuming {args.queue}", args.count) as (advance, emit):
        async with client.consumer(args.queue, name=args.name, prefetch=prefetch) as consumer:
            while args.count is None or received < args.count:
                message = await consumer.receive(timeout)
                if message is None:
                    break
                emit(_json_line(message) if args.json else _text_line(message))
                await message.ack()
                received += 1
                advance(1)
    if not args.json:
        print(f"received {received} messages from {args.queue}", file=sys.stderr)


def _json_line(m: Received) -> str:
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    return json.dumps(
        {
            "msg_id": m.msg_id,
            "queue": m.queue,
            "group": m.group_id,
            "group_seq": m.group_seq,
            "delivery_count": m.delivery_count,
            "headers": m.headers,
            "body": body,
            "encoding": encoding,
        }
    )


def _text_line(m: Received) -> str:
    group = f" group={m.group_id} seq={m.group_seq}" if m.group_id else ""
    return f"#{m.msg_id}{group}: {m.body.decode('utf-8', 'replace')}"


async def _wait(client: Client, args: argparse.Namespace) -> None:
    """Poll until the queue has enough consumers: scripts start workers, then send."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    while (seen := await _consumers_seen(client, args.queue)) < args.consumers:
        if loop.time() >= deadline:
            raise PinmqError(
                f"timed out after {args.timeout:g} s: {args.queue} has {seen} of "
                f"{args.consumers} consumers as {args.url} sees it",
                "DEADLINE_EXCEEDED",
            )
        await asyncio.sleep(0.1)
    print(f"{args.queue}: {seen} consumer(s)")


async def _consumers_seen(client: Client, queue: str) -> int:
    """Consumers of `queue` on this node, plus on the peers it is linked to when clustered."""
    try:
        status = await client.cluster_status()
    except PinmqError as err:
        if err.code != "FAILED_PRECONDITION":  # a standalone node
            raise
        return sum(q.consumer_count for q in await client.queues() if q.name == queue)
    return sum(
        counts.get(queue, 0)
        for node_id, counts in status.consumers.items()
        if status.connected.get(node_id)
    )


async def _queues(client: Client, _args: argparse.Namespace) -> None:
    table = Table("queue", "address", "depth", "consumers", "settings")
    for q in await client.queues():
        s = q.settings
        summary = f"{s['group_mode']}, buckets {s['group_buckets']}"
        if s["group_rebalance"]:
            summary += ", rebalance"
        table.add_row(q.name, q.address, str(q.depth), str(q.consumer_count), summary)
    stdout_console().print(table)


def stdout_console() -> Console:
    """Tables at their natural width when piped, so no cell is cut (scripts grep them)."""
    return Console() if sys.stdout.isatty() else Console(width=400)


def _owner(owner: str | None, name: str | None) -> str:
    return f"{name} ({owner})" if owner else "-"


def _ago(when: datetime | None, now: datetime) -> str:
    return f"{(now - when).total_seconds():.1f}s ago" if when else "-"


async def _groups(client: Client, args: argparse.Namespace) -> None:
    if args.cluster:
        await _cluster_groups(client, args)
        return
    if args.queue is None:
        raise UsageError("groups: a QUEUE is required without --cluster")
    table = Table("group", "owner", "pending", "oldest pending", "outstanding", "last use")
    now = datetime.now(UTC)
    for g in await client.groups(args.queue):
        table.add_row(
            g.group,
            _owner(g.owner, g.owner_name),
            str(g.pending),
            _ago(g.oldest_pending, now),
            str(g.outstanding),
            _ago(g.last_use, now),
        )
    stdout_console().print(table)
    consumers = Table("consumer", "prefetch", "unacked", "groups", "stalled")
    for c in await client.consumers(args.queue):
        stalled = f"{c.stalled_ms / 1000:.1f}s: gets no new group" if c.stalled_ms else "-"
        consumers.add_row(
            _owner(c.consumer_id, c.name), *map(str, (c.prefetch, c.unacked, c.groups)), stalled
        )
    stdout_console().print(consumers)


async def _cluster_groups(client: Client, args: argparse.Namespace) -> None:
    listing = await client.cluster_groups(args.queue)
    table = Table(
        "group",
        "queue@node",
        "bound",
        "owner",
        "pending",
        "oldest pending",
        "outstanding",
        "last use",
    )
    now = datetime.now(UTC)
    for g in listing.groups:
        table.add_row(
            g.group,
            f"{g.queue}@{g.node}",
            "yes" if g.bound else "no",
            _owner(g.owner, g.owner_name),
            str(g.pending),
            _ago(g.oldest_pending, now),
            str(g.outstanding),
            _ago(g.last_use, now),
        )
    console = stdout_console()
    console.print(table)
    for problem in listing.problems:
        console.print(f"cluster problem: {problem}", style="bold red", markup=False)
    for who in listing.unreachable:
        console.print(f"not answering: {who}", style="yellow", markup=False)


async def _warn_forced_move(client: Client, group: str, queue: str | None) -> None:
    """Say what moving a group off a node that is away costs, before doing it."""
    listing = await client.cluster_groups(queue, group=group)
    away = {who.split(":", 1)[0] for who in listing.unreachable}
    for g in listing.groups:
        if g.bound and g.node in away:
            print(
                f"warning: {group} is bound to {g.queue}@{g.node}, which is not connected. Its "
                f"messages held on {g.node}, and in store-and-forward toward it, wait until "
                f"{g.node} returns; {g.node} then sends them on to the group's new binding, "
                "where they arrive after the group's newer messages (audited as moved). The "
                "group's order is not kept across this move.",
                file=sys.stderr,
            )


async def _reset_groups(client: Client, args: argparse.Namespace) -> None:
    if args.force and not args.cluster:
        raise UsageError("reset-groups: --force goes with --cluster")
    if args.cluster:
        if args.group is None:
            raise UsageError("reset-groups --cluster: --group G is required")
        if args.force:
            await _warn_forced_move(client, args.group, args.queue)
        removed = await client.cluster_reset_group(args.group, args.queue, force=args.force)
        where = f" on {args.queue}" if args.queue else ""
        print(f"unbound group {args.group}{where} cluster-wide ({removed} binding(s) removed)")
        return
    if args.queue is None:
        raise UsageError("reset-groups: a QUEUE is required without --cluster")
    await client.reset_groups(args.queue, args.group)
    which = f"group {args.group}" if args.group else "all groups"
    print(f"reset {which} of {args.queue}")


async def _status(client: Client, args: argparse.Namespace) -> None:
    status = await client.cluster_status()
    shown = status.connected if args.cluster else {status.node_id: True}
    if args.json:
        print(
            json.dumps(
                {
                    "node": status.node_id,
                    "nodes": {
                        n: {"connected": status.connected[n], "handler": status.handlers[n]}
                        for n in shown
                    },
                    "ha": [dataclasses.asdict(p) for p in status.ha],
                    "problems": status.problems,
                    "not_ready": status.not_ready,
                }
            )
        )
        return
    table = Table("node", "linked", "grouping handler", "consumers")
    for node in shown:
        consumers = sum(status.consumers.get(node, {}).values())
        linked = "yes" if status.connected[node] else "no"
        table.add_row(node, linked, status.handlers[node] or "-", str(consumers))
    console = stdout_console()
    console.print(table)
    for p in status.ha:
        sync = "in sync" if p.backup_in_sync else "NOT in sync"
        source = "says the active process" if p.from_active else f"as {status.node_id} last heard"
        console.print(
            f"ha {p.logical}: active process {p.active}, epoch {p.epoch}, "
            f"backup {p.backup or '-'} {sync} ({source})",
            markup=False,
        )
    for problem in status.problems:
        console.print(f"cluster problem: {problem}", style="bold red", markup=False)
    for reason in _not_ready(status):
        console.print(f"not ready: {reason}", style="bold red", markup=False)


def _not_ready(status: ClusterStatus) -> list[str]:
    """Why the answering node is not ready, but the cluster problems (printed already)."""
    return [r for r in dict.fromkeys(status.not_ready) if r not in status.problems]


_VERBS = {
    "status": _status,
    "send": _send,
    "consume": _consume,
    "wait": _wait,
    "queues": _queues,
    "groups": _groups,
    "reset-groups": _reset_groups,
}


def tls_files(args: argparse.Namespace) -> TlsFiles | None:
    """The client's TLS files from --tls-ca/--tls-cert/--tls-key (or $PINMQ_TLS_CA, ...):
    None (plain text) without a CA."""
    if not args.tls_ca:
        if args.tls_cert or args.tls_key:
            raise UsageError("--tls-cert and --tls-key need --tls-ca (or $PINMQ_TLS_CA)")
        return None
    try:
        files = TlsFiles(
            Path(args.tls_ca),
            Path(args.tls_cert) if args.tls_cert else None,
            Path(args.tls_key) if args.tls_key else None,
        )
        files.check()
    except TlsError as err:
        raise UsageError(str(err).replace("tls.", "--tls-")) from None
    return files


def credentials(args: argparse.Namespace) -> tuple[str, str] | None:
    """The user and password from --user and --password-file (or $PINMQ_USER and
    $PINMQ_PASSWORD): None without a user. A password is never taken from argv."""
    if not args.user:
        if args.password_file:
            raise UsageError("--password-file needs --user (or $PINMQ_USER)")
        return None
    if args.password_file:
        try:
            lines = Path(args.password_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise UsageError(f"--password-file {args.password_file}: {reason}") from None
        password = lines[0] if lines else ""
    else:
        password = os.environ.get("PINMQ_PASSWORD", "")
    if not password:
        raise UsageError(
            f"no password for user {args.user!r}: give --password-file or set $PINMQ_PASSWORD"
        )
    return args.user, password


def client_of(args: argparse.Namespace, **options: Any) -> Client:
    """A client of the node `args.url` names, with the command line's TLS files,
    credentials, deadline and audit directory: every verb connects the same way. `options`:
    more of `Client`'s, or others than these (`tls`, `user` and `password` given: the files
    are not read again, as for the many clients of `pinmq load`)."""
    settings: dict[str, Any] = {
        "audit": getattr(args, "audit", None),
        "call_timeout": getattr(args, "call_timeout", CALL_TIMEOUT_S),
        "on_blocked": _notice(every_s=10.0),
        "on_failover": _notice(),
    }
    if "tls" not in options:
        settings["tls"] = tls_files(args)
    if "user" not in options:
        settings["user"], settings["password"] = credentials(args) or (None, None)
    return Client(args.url, **{**settings, **options})


async def run_client(args: argparse.Namespace) -> None:
    """Connect to the node `args.url` names and run the verb on it."""
    async with client_of(args) as client:
        await _VERBS[args.verb](client, args)


def _notice(every_s: float = 0.0) -> Callable[[str], None]:
    """Tell the user on stderr what the client met (the node holds the sends for room, the
    client moved to another node), at most every `every_s` seconds."""
    last = -every_s

    def notice(text: str) -> None:
        nonlocal last
        if time.monotonic() - last >= every_s:
            last = time.monotonic()
            print(f"pinmq: {text}", file=sys.stderr, flush=True)

    return notice
