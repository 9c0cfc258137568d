"""The grouping handler a node's config asks for: LOCAL (the arbiter) or REMOTE (its proxy)."""

from __future__ import annotations

from collections.abc import Callable

from grpc import aio

from broker.config import NodeConfig
from handler.api import GroupingHandler
from handler.local import LocalHandler
from handler.remote import RemoteHandler
from handler.service import GroupingServicer

# Registers a service on the cluster's gRPC server: `cluster.member.ClusterMember.add_servicer`
Host = Callable[[Callable[[aio.Server], None]], None]


def make_handler(
    config: NodeConfig, locate_local: Callable[[], str | None], host: Host, epoch: int = 1
) -> GroupingHandler | None:
    """None without a grouping-handler section.

    `locate_local` returns the LOCAL node's cluster address (host:port) from the topology,
    or None while it is unknown; only a REMOTE handler calls it. `host` registers a service on
    the cluster's gRPC server: a LOCAL handler's (REMOTE nodes ask it there). `epoch`: a LOCAL
    handler's arbiter epoch (the ha pair's failover epoch of the process it runs in).
    """
    section = config.grouping_handler
    if section is None:
        return None
    if section.type == "LOCAL":
        handler = LocalHandler(section, config.node.id, config.node.data_dir, epoch=epoch)
        host(GroupingServicer(handler).add_to_server)
        return handler
    reconnect = config.cluster.reconnect_interval if config.cluster is not None else 500
    return RemoteHandler(
        locate_local,
        section,
        config.node.id,
        reconnect_interval_ms=reconnect,
        tls=config.tls_files,
    )
