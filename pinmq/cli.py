"""The `pinmq` command: run a node, or talk to one (send, consume, inspect queues and groups).

Errors print one line `pinmq: error: ...` and exit 1 (2 for usage and config errors).
`pinmq check` (pipeline/) exits 0 when the history is clean, 1 on violations, 2 on bad input.
`pinmq user` (pinmq/users_cli.py) adds, removes and lists the users of a users file.
`pinmq certs` (pinmq/certs.py) writes a development CA and node certificates.
The verbs that talk to a node are `pinmq/verbs.py`, and `pinmq top` is `pinmq/top.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console

from broker.client import CALL_TIMEOUT_S, DEFAULT_URL, PinmqError
from pinmq.verbs import UsageError, run_client

TOP_TIMEOUT_S = 5.0  # `pinmq top`'s deadline per poll


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pinmq", description="pinmq message broker")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    node = verbs.add_parser("node", help="run a broker node in the foreground")
    node.add_argument(
        "--config",
        required=True,
        action="append",
        metavar="FILE",
        help="node YAML config; again for an overlay whose keys override the earlier files'",
    )

    up = verbs.add_parser("up", help="start nodes in the background and wait until healthy")
    up.add_argument("configs", nargs="+", metavar="CONFIG", help="node YAML configs")
    up.add_argument("--run-dir", default="run", help="pid and log files (default: %(default)s)")
    up.add_argument(
        "--audit-dir",
        metavar="DIR",
        help="every node's audit log goes here instead of its config's audit dir",
    )
    down = verbs.add_parser("down", help="stop the nodes that `pinmq up` started")
    down.add_argument("--run-dir", default="run", help="pid and log files (default: %(default)s)")

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--url",
        default=os.environ.get("PINMQ_URL", DEFAULT_URL),
        help="host:port[,host:port...]: with several, the client moves to the next that answers "
        "when its node goes (default: $PINMQ_URL or %(default)s)",
    )
    for name, what in (
        ("ca", "the CA certificate (PEM) the nodes' certificates are checked against: TLS on"),
        ("cert", "a client certificate (PEM), for a node with client-auth"),
        ("key", "the client certificate's private key (PEM)"),
    ):
        env = f"PINMQ_TLS_{name.upper()}"
        client.add_argument(
            f"--tls-{name}",
            default=os.environ.get(env) or None,
            metavar="FILE",
            help=f"{what} (default: ${env})",
        )

    client.add_argument(
        "--user",
        default=os.environ.get("PINMQ_USER") or None,
        help="the user to connect as, for a node with security on (default: $PINMQ_USER); "
        "the password comes from --password-file or $PINMQ_PASSWORD, never from argv",
    )
    client.add_argument(
        "--password-file",
        default=None,
        metavar="FILE",
        help="a file whose first line is --user's password (default: $PINMQ_PASSWORD's value)",
    )

    # consume and wait have a --timeout of their own (how long to wait); their calls keep the
    # default deadline.
    deadline = _deadline(CALL_TIMEOUT_S)

    send = verbs.add_parser("send", parents=[client, deadline], help="send messages to an address")
    send.add_argument("address")
    grouping = send.add_mutually_exclusive_group()
    grouping.add_argument("--group", metavar="G", help="put every message in group G")
    grouping.add_argument("--auto-group", action="store_true", help="one random group")
    source = send.add_mutually_exclusive_group(required=True)
    source.add_argument("--body", metavar="TEXT", help="message body")
    source.add_argument("--stdin", action="store_true", help="one message per stdin line")
    send.add_argument("--count", type=_positive, default=1, help="send --body N times")
    send.add_argument(
        "--header", action="append", default=[], metavar="K=V", type=_header, help="repeatable"
    )
    send.add_argument("--non-persistent", action="store_true")
    send.add_argument("--audit", metavar="DIR", help="append client audit events to DIR")

    consume = verbs.add_parser("consume", parents=[client], help="receive and ack messages")
    consume.add_argument("queue")
    consume.add_argument("--count", type=_positive, help="stop after N messages")
    consume.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="stop after S seconds without a message; 0 waits forever (default: %(default)s)",
    )
    consume.add_argument("--prefetch", type=int, default=100)
    consume.add_argument("--name", help="consumer name shown by `pinmq groups`")
    consume.add_argument("--json", action="store_true", help="one JSON object per message")
    consume.add_argument("--audit", metavar="DIR", help="append client audit events to DIR")

    wait = verbs.add_parser(
        "wait",
        parents=[client],
        help="wait until a queue has N consumers (in a cluster: as this node's routing sees them)",
    )
    wait.add_argument("queue")
    wait.add_argument("--consumers", type=_positive, required=True, metavar="N")
    wait.add_argument(
        "--timeout",
        type=float,
        # It returns as soon as the consumers are seen: a long default costs nothing then, and
        # workers started together on a loaded machine can take more than 10 s to subscribe.
        default=30.0,
        metavar="S",
        help="give up after S seconds (exit 1; default: %(default)s)",
    )

    verbs.add_parser("queues", parents=[client, deadline], help="list queues")
    groups = verbs.add_parser(
        "groups", parents=[client, deadline], help="list the groups of a queue"
    )
    groups.add_argument("queue", nargs="?", help="required without --cluster")
    groups.add_argument(
        "--cluster", action="store_true", help="every node's groups and bindings, in one call"
    )
    reset = verbs.add_parser(
        "reset-groups", parents=[client, deadline], help="unpin groups of a queue"
    )
    reset.add_argument("queue", nargs="?", help="required without --cluster")
    reset.add_argument("--group", metavar="G", help="only this group (default: all)")
    reset.add_argument(
        "--cluster", action="store_true", help="unbind --group G everywhere (every node unpins it)"
    )
    reset.add_argument(
        "--force",
        action="store_true",
        help="with --cluster: move G even while it is bound to a node that is down "
        "(refused otherwise; prints what it costs, then acts)",
    )

    status = verbs.add_parser(
        "status",
        parents=[client, deadline],
        help="this node (or every node) and the LOCAL node's active process, epoch and backup",
    )
    status.add_argument(
        "--cluster", action="store_true", help="every node as this node sees it, not only itself"
    )
    status.add_argument("--json", action="store_true", help="one JSON object")

    top = verbs.add_parser(
        "top",
        # A frozen node shows as "stopped answering" after a few seconds, not after 30.
        parents=[client, _deadline(TOP_TIMEOUT_S)],
        help="a live view of the node's queues, rates, most lagging groups and stalled "
        "consumers, until Ctrl-C (needs manage on every address, as /metrics)",
    )
    top.add_argument(
        "--every",
        type=_positive_float,
        default=2.0,
        metavar="S",
        help="poll every S seconds (default: %(default)s)",
    )
    top.add_argument(
        "--groups",
        type=_positive,
        default=10,
        metavar="N",
        help="the N groups with the most messages waiting and the N whose oldest waited "
        "longest, across the queues (default: %(default)s)",
    )
    frames = top.add_mutually_exclusive_group()
    frames.add_argument(
        "--iterations", type=_positive, metavar="N", help="stop after N polls (default: never)"
    )
    frames.add_argument(
        "--once", dest="iterations", action="store_const", const=1, help="one poll, then exit"
    )

    load = verbs.add_parser(
        "load", parents=[client], help="an audited grouped load, for `pinmq check` to judge"
    )
    load.add_argument("--queue", required=True, help="created if it does not exist")
    load.add_argument(
        "--groups", type=_positive, default=12, metavar="N", help="default: %(default)s"
    )
    load.add_argument(
        "--producers", type=_positive, default=2, metavar="P", help="clients that send"
    )
    load.add_argument(
        "--consumers", type=_positive, default=2, metavar="C", help="clients that ack"
    )
    load.add_argument(
        "--rate",
        type=_positive_float,
        default=100.0,
        metavar="R",
        help="messages a second, all groups together (default: %(default)s)",
    )
    load.add_argument(
        "--duration",
        type=_not_negative,
        default=60.0,
        metavar="S",
        help="seconds of sending; 0: until Ctrl-C (default: %(default)s)",
    )
    load.add_argument(
        "--drain",
        type=_not_negative,
        default=30.0,
        metavar="S",
        help="then wait up to S seconds for every confirmed message's ack (default: %(default)s)",
    )
    load.add_argument(
        "--size", type=_positive, default=100, metavar="BYTES", help="of each message's filler"
    )
    load.add_argument("--audit", metavar="DIR", help="the clients' audit logs (the history)")
    load.add_argument(
        "--protocol",
        choices=("grpc", "stomp"),
        default="grpc",
        help="what the clients speak; with stomp, --url lists STOMP host:ports "
        "(default: %(default)s)",
    )

    check = verbs.add_parser(
        "check", help="check audit logs for loss, duplicates, order and exclusivity (PySpark)"
    )
    check.add_argument(
        "history",
        metavar="HISTORY_DIR",
        help="directory of audit segments: a path, a glob or a URI Hadoop reads (hdfs://...)",
    )
    check.add_argument(
        "--master", default="local[*]", metavar="URL", help="Spark master (default: %(default)s)"
    )
    check.add_argument("--report", metavar="DIR", help="write summary.json and an HTML report")
    check.add_argument(
        "--cache",
        metavar="DIR",
        help="keep the parsed events there (Parquet; a path or URI every executor reaches) and "
        "read them from there while the history's segments are unchanged",
    )

    user = verbs.add_parser("user", help="add, remove or list the users of a users file")
    actions = user.add_subparsers(dest="user_verb", required=True, metavar="ACTION")
    users_file = argparse.ArgumentParser(add_help=False)
    where = users_file.add_mutually_exclusive_group()
    where.add_argument(
        "--users-file", metavar="PATH", help="the users file (default: $PINMQ_USERS_FILE)"
    )
    where.add_argument(
        "--config", metavar="FILE", help="a node's YAML config: the users file it names"
    )
    add = actions.add_parser(
        "add", parents=[users_file], help="add a user, or set its password and roles"
    )
    add.add_argument("name", type=_non_empty, metavar="NAME")
    add.add_argument(
        "--role", action="append", required=True, type=_non_empty, metavar="R", help="repeatable"
    )
    remove = actions.add_parser("remove", parents=[users_file], help="remove a user")
    remove.add_argument("name", metavar="NAME")
    actions.add_parser("list", parents=[users_file], help="the users and their roles")

    certs = verbs.add_parser(
        "certs", help="write a development CA and a key and certificate per node (mutual TLS)"
    )
    certs.add_argument(
        "directory", metavar="DIR", help="where ca.crt, ca.key, NAME.crt, NAME.key go (0700)"
    )
    certs.add_argument(
        "--nodes",
        type=_names,
        default=[],
        metavar="LIST",
        help="comma-separated node names: each gets a certificate for serving and connecting "
        "(CN and DNS name: the node's name); required unless --clients",
    )
    certs.add_argument(
        "--hosts",
        type=_names,
        default=[],
        metavar="LIST",
        help="comma-separated DNS names or IP addresses added to every node certificate "
        "(localhost, 127.0.0.1 and ::1 always are)",
    )
    certs.add_argument(
        "--clients",
        type=_names,
        default=[],
        metavar="LIST",
        help="comma-separated user names: a client certificate each (CN: the user)",
    )
    certs.add_argument(
        "--reuse-ca",
        action="store_true",
        help="sign with the CA already in DIR: how a node certificate is rotated (an existing "
        "CA is never overwritten)",
    )
    certs.add_argument(
        "--days",
        type=_positive,
        default=825,
        metavar="N",
        help="validity of the node and client certificates (default: %(default)s)",
    )
    return parser


def _deadline(default: float) -> argparse.ArgumentParser:
    """`--timeout S`: the deadline of each call to the node."""
    deadline = argparse.ArgumentParser(add_help=False)
    deadline.add_argument(
        "--timeout",
        dest="call_timeout",
        type=_positive_float,
        default=default,
        metavar="S",
        help="give up on the node's answer after S seconds: the outcome is then unknown "
        "(default: %(default)s)",
    )
    return deadline


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _not_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",")]  # an empty one is refused by name


def _non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


def _run_node(config_paths: list[str]) -> int:
    from broker.config_file import load_config
    from pinmq.process import run_node

    return run_node(load_config(*config_paths))


def _run_local(args: argparse.Namespace) -> int:
    """The verbs that run nodes on this machine rather than talk to one."""
    from broker.config_file import ConfigError
    from pinmq import launcher

    try:
        if args.verb == "node":
            return _run_node(args.config)
        console = Console() if sys.stdout.isatty() else Console(width=200)  # no cut columns
        if args.verb == "up":
            audit = Path(args.audit_dir) if args.audit_dir else None
            return launcher.up(args.configs, Path(args.run_dir), console, audit_dir=audit)
        return launcher.down(Path(args.run_dir), console)
    except ConfigError as err:
        print("pinmq: error: invalid config:", file=sys.stderr)
        for problem in err.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2


def _run_certs(args: argparse.Namespace) -> int:
    """`pinmq certs`: print the files written, one path a line, never what is in them."""
    from pinmq.certs import CertsError, write_certs  # loads cryptography: only for this verb

    if not args.nodes and not args.clients:
        print("pinmq: error: certs: --nodes is required unless --clients is given", file=sys.stderr)
        return 2
    try:
        written = write_certs(
            Path(args.directory),
            args.nodes,
            hosts=args.hosts,
            clients=args.clients,
            reuse_ca=args.reuse_ca,
            days=args.days,
        )
    except (CertsError, OSError) as err:
        print(f"pinmq: error: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.verb in ("node", "up", "down"):
        sys.exit(_run_local(args))
    if args.verb == "check":  # exit 0 clean, 1 violations, 2 unusable input
        from pipeline.cli import run_check

        sys.exit(run_check(args.history, master=args.master, report=args.report, cache=args.cache))
    if args.verb == "user":  # exit 0 done, 1 refused, 2 usage
        from pinmq.users_cli import run as run_user

        sys.exit(run_user(args))
    if args.verb == "certs":  # exit 0 written, 1 refused, 2 usage
        sys.exit(_run_certs(args))
    if args.verb == "load":  # exit 0 done, 1 confirmed messages not acked
        from pinmq.load import run_load

        verb: Callable[[argparse.Namespace], Awaitable[int | None]] = run_load
    elif args.verb == "top":  # loads rich's live display and the metrics parser
        from pinmq.top import run_top

        verb = run_top
    else:
        verb = run_client
    try:
        status = asyncio.run(verb(args))
    except PinmqError as err:
        print(f"pinmq: error: {err}", file=sys.stderr)
        sys.exit(2 if isinstance(err, UsageError) else 1)
    except KeyboardInterrupt:  # how `top` ends
        sys.exit(0 if args.verb == "top" else 130)
    sys.exit(status)


if __name__ == "__main__":
    main()
