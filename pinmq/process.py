"""The `pinmq node` process: logging, memory tuning, and what it runs until told to stop.

A node with an `ha` section runs as one process of its pair (`pinmq/pair.py`),
any other as a plain `Node`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import signal

from broker import logs
from broker.config import NodeConfig, on_loopback
from broker.engine import StartupError
from broker.tls import TlsError
from pinmq.node import Node
from pinmq.pair import PairProcess

log = logs.get("node")


def check_transport(config: NodeConfig) -> None:
    """Before anything binds: read the TLS files (StartupError naming a file that cannot be
    used, rather than failed handshakes later); without `tls`, refuse listeners that other
    machines may reach unless `listen.allow-insecure` says to serve them unencrypted."""
    tls = config.tls_files
    if tls is not None:
        try:
            tls.check()
        except TlsError as err:
            raise StartupError(str(err)) from None
        return
    exposed = _exposed(config)
    if exposed and not config.listen.allow_insecure:
        verb = "is" if len(exposed) == 1 else "are"
        raise StartupError(
            f"{', '.join(exposed)} {verb} not on loopback and the node has no tls: configure "
            "tls, or set listen.allow-insecure: true to serve unencrypted"
        )


def warn_unencrypted(config: NodeConfig) -> None:
    """Once, when a node without `tls` has started: its listeners serve plain text."""
    if config.tls is not None:
        return
    exposed = _exposed(config)
    if exposed:
        log.warning(
            "serving unencrypted off loopback (listen.allow-insecure: true): no tls",
            listeners=exposed,
        )
    else:
        log.warning(
            "serving unencrypted on loopback: no tls",
            listeners=[f"{key} {address}" for key, address in config.listeners().items()],
        )


def _exposed(config: NodeConfig) -> list[str]:
    """`listen.KEY host:port` of each listener not on loopback."""
    return [
        f"{key} {address}"
        for key, address in config.listeners().items()
        if not on_loopback(address)
    ]


async def serve(config: NodeConfig) -> int:
    """Run a node until SIGTERM/SIGINT (exit 0) or a fatal error (exit 1)."""
    loop = asyncio.get_running_loop()
    node: Node | PairProcess = PairProcess(config) if config.ha is not None else Node(config)
    try:
        check_transport(config)
        await node.start()
    except StartupError as err:
        log.error("cannot start node", error=str(err))
        return 1
    warn_unencrypted(config)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([stopping, node.failed], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    await node.stop()
    return 1 if node.failed.done() else 0


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD = 128 * 1024


def return_large_blocks_to_the_system() -> None:
    """Allocate every block over 128 KiB with mmap, so freeing it gives the memory back.

    glibc raises its mmap threshold after the first large block is freed, and later large
    blocks (partial STOMP frames, big bodies) come from the heap, which keeps the memory after
    they are freed: a node's RSS would stay at its peak. Setting the threshold fixes it.
    Best effort: nothing happens where there is no glibc.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


# CPython's cycle collector, tuned for a backlog of millions of message objects: a young
# collection every 100,000 allocations instead of 700, and a full one after 50 x 50 of those
# instead of 10 x 10. With the defaults a full collection (which walks every message held)
# came every few seconds under load and stalled every client for 100-150 ms at a time
# (bench/canary.py); now it comes every few minutes under the heaviest load.
GC_THRESHOLDS = (100_000, 50, 50)


def run_node(config: NodeConfig) -> int:
    """Entry point of `pinmq node`: configure logging, serve, return the exit code."""
    logs.configure(config.node.id, config.log.level, config.log.format)
    return_large_blocks_to_the_system()
    gc.set_threshold(*GC_THRESHOLDS)
    return asyncio.run(serve(config))
