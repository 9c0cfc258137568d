"""Node configuration: the YAML contract, validated with pydantic.

`NodeConfig` and its sections are the contract; `broker/config_file.py` reads a YAML file
into a frozen `NodeConfig`, or says what is wrong with it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from broker import wildcard
from broker.config_base import Strict, check_pattern, size_bytes
from broker.config_metrics import MetricsSection
from broker.config_security import SecuritySection, TlsSection
from broker.config_store import StoreSection
from broker.tls import TlsFiles


class QueueConfig(Strict):
    """Group semantics of one queue (Artemis address-settings / queue attributes)."""

    durable: bool = True
    group_header: str = "JMSXGroupID"
    group_mode: Literal["sticky", "shared"] = "sticky"
    group_buckets: int = Field(default=-1, ge=-1)
    group_rebalance: bool = False
    group_rebalance_pause_dispatch: bool = False
    group_first_key: str | None = None
    default_group: str | None = None
    max_delivery_attempts: int = Field(default=10, ge=1)
    dead_letter_address: str | None = "DLQ"
    consumers_before_dispatch: int = Field(default=0, ge=0)
    delay_before_dispatch: int = Field(default=-1, ge=-1)
    # ms a consumer may hold unacknowledged messages without settling any before it gets no
    # new group (it keeps its own); -1: never
    slow_consumer_threshold: int = Field(default=10_000, ge=-1)

    @field_validator("group_header")
    @classmethod
    def _header_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty header name")
        return value


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError("host:port with a port in 1..65535")
    return value


HostPort = Annotated[str, AfterValidator(_host_port)]
_WILDCARDS = {"0.0.0.0", "::", "[::]"}  # bind every interface
_NODE_ID = re.compile(r"[A-Za-z0-9_.-]+")


class NodeSection(Strict):
    """Identity of this node; the id also names its default data directory."""

    id: str
    data_dir: Path

    @model_validator(mode="before")
    @classmethod
    def _default_data_dir(cls, data: Any) -> Any:
        # Filled even when the id is missing or bad, so only the id itself gets reported.
        if isinstance(data, dict) and not {"data-dir", "data_dir"} & data.keys():
            return {**data, "data-dir": Path("data") / str(data.get("id", ""))}
        return data

    @field_validator("id")
    @classmethod
    def _id_chars(cls, value: str) -> str:
        if not _NODE_ID.fullmatch(value):
            raise ValueError("a non-empty id of letters, digits, '_', '.' and '-'")
        return value


def on_loopback(address: str) -> bool:
    """Whether a listen address (host:port) binds the loopback interface only: `localhost`,
    127.0.0.0/8 or ::1. Any other host (a wildcard, another address, a host name) may be
    reached from other machines."""
    host = address.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ListenSection(Strict):
    """Listener endpoints (host:port) for each protocol the node serves.

    Without `tls`, a listener off loopback is refused at start unless `allow-insecure` is
    true: plain text where other machines can reach it must be asked for.
    """

    client: HostPort = "127.0.0.1:7601"
    stomp: HostPort = "127.0.0.1:61613"
    cluster: HostPort = "127.0.0.1:7701"
    http: HostPort = "127.0.0.1:8161"
    allow_insecure: bool = False


class AddressConfig(Strict):
    """A statically declared address and the queues bound to it."""

    routing_type: Literal["anycast", "multicast"] = "anycast"
    queues: dict[str, QueueConfig] = Field(default_factory=dict)


class AddressSettings(Strict):
    """Artemis address-settings: what auto-created addresses and queues get."""

    auto_create_queues: bool = True
    auto_create_addresses: bool = True
    default_group_buckets: int = Field(default=-1, ge=-1)
    default_group_rebalance: bool = False
    default_group_rebalance_pause_dispatch: bool = False
    default_group_first_key: str | None = None
    # Extensions beyond Artemis' address-settings, mirroring QueueConfig's fields.
    default_group_mode: Literal["sticky", "shared"] = "sticky"
    default_group_header: str = "JMSXGroupID"
    max_delivery_attempts: int = Field(default=10, ge=1)
    dead_letter_address: str | None = "DLQ"
    default_consumers_before_dispatch: int = Field(default=0, ge=0)
    default_delay_before_dispatch: int = Field(default=-1, ge=-1)
    default_slow_consumer_threshold: int = Field(default=10_000, ge=-1)
    # Artemis: an auto-created queue that is empty and has no consumer for this long is deleted.
    auto_delete_queues: bool = True
    auto_delete_queues_delay: int = Field(default=30_000, ge=0)
    # Bytes of messages an address may hold in memory (-1: no limit but the node's
    # limits.global-max-size), and what a send beyond it gets: BLOCK waits for room, FAIL is
    # refused, PAGE keeps persistent messages on disk only until there is room for them.
    max_size_bytes: Annotated[int, BeforeValidator(size_bytes), Field(ge=-1)] = -1
    address_full_policy: Literal["PAGE", "BLOCK", "FAIL"] = "PAGE"
    # The same for auto-created addresses only (null: as above), like the other default- keys.
    default_max_size_bytes: Annotated[int | None, BeforeValidator(size_bytes), Field(ge=-1)] = None
    default_address_full_policy: Literal["PAGE", "BLOCK", "FAIL"] | None = None

    def memory_limit(self, auto_created: bool) -> tuple[int, Literal["PAGE", "BLOCK", "FAIL"]]:
        """(max-size-bytes, address-full-policy) of an address under these settings."""
        if not auto_created:
            return self.max_size_bytes, self.address_full_policy
        size = self.default_max_size_bytes
        policy = self.default_address_full_policy
        return (
            self.max_size_bytes if size is None else size,
            self.address_full_policy if policy is None else policy,
        )

    @field_validator("default_group_header")
    @classmethod
    def _header_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty header name")
        return value

    def queue_config(self) -> QueueConfig:
        """The QueueConfig an auto-created queue gets under these settings."""
        return QueueConfig(
            group_header=self.default_group_header,
            group_mode=self.default_group_mode,
            group_buckets=self.default_group_buckets,
            group_rebalance=self.default_group_rebalance,
            group_rebalance_pause_dispatch=self.default_group_rebalance_pause_dispatch,
            group_first_key=self.default_group_first_key,
            max_delivery_attempts=self.max_delivery_attempts,
            dead_letter_address=self.dead_letter_address,
            consumers_before_dispatch=self.default_consumers_before_dispatch,
            delay_before_dispatch=self.default_delay_before_dispatch,
            slow_consumer_threshold=self.default_slow_consumer_threshold,
        )


def default_global_max_size() -> int:
    """Half the memory this process may use: the machine's, or its cgroup's limit if lower."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            memory = min(memory, int(text))
    return memory // 2


class LimitsSection(Strict):
    """Resource limits enforced at the edge, before a message enters a queue."""

    max_message_size: int = Field(default=10 * 1024 * 1024, gt=0)
    # Deliveries a consumer may hold unacknowledged; a larger prefetch asked for is cut to it.
    max_prefetch: int = Field(default=10_000, gt=0)
    # Messages in one gRPC batch or STOMP transaction: each is routed in one go, and a larger
    # one would hold up every other client meanwhile.
    max_batch_messages: int = Field(default=1_000, gt=0)
    # Queues a node holds (its internal store-and-forward queues not counted).
    max_queues: int = Field(default=10_000, gt=0)
    # Bytes of messages the node holds in memory, all addresses together; beyond it each
    # address's address-full-policy applies. Default: half the memory the node may use.
    global_max_size: Annotated[int, BeforeValidator(size_bytes), Field(gt=0)] = Field(
        default_factory=default_global_max_size
    )
    # Percent of the data volume in use above which persistent sends are refused (blocked
    # under BLOCK); acks and removals go on. 100 turns the check off.
    max_disk_usage: int = Field(default=90, ge=1, le=100)
    # Kept allocated in the data dir and given up when the disk is full, so that acks,
    # removals and the store's checkpoints still have room (capped at 5% of the volume).
    disk_reserve: Annotated[int, BeforeValidator(size_bytes), Field(ge=0)] = 16 * 1024 * 1024
    # Duplicate detection (`_AMQ_DUPL_ID`, broker/duplicates.py): the most recent ids each
    # address remembers, in memory and (those of persistent messages) in the store; 0: off.
    id_cache_size: int = 20_000

    @field_validator("id_cache_size")
    @classmethod
    def _id_cache_size(cls, value: int) -> int:
        if value < 0:
            raise ValueError("a number of ids per address, 0 (duplicate detection off) or more")
        return value


class StompSection(Strict):
    """STOMP listener limits and defaults (its address is `listen.stomp`).

    A frame breaking a limit gets an ERROR frame naming it and the connection is closed.
    """

    max_frame_size: int = Field(default=10 * 1024 * 1024, gt=0)
    max_headers: int = Field(default=1000, gt=0)
    max_header_size: int = Field(default=64 * 1024, gt=0)
    # SUBSCRIBE without activemq.prefetchSize / prefetch-count (ActiveMQ's queue prefetch).
    default_prefetch: int = Field(default=1000, gt=0)
    # Shortest heart-beat interval offered either way; 0 turns heart-beats off.
    heart_beat_ms: int = Field(default=1000, ge=0)
    # A connection that has not sent CONNECT by then is closed.
    connect_timeout_ms: int = Field(default=10_000, gt=0)
    # A frame must be complete this long after its first byte, whatever the heart-beat.
    frame_timeout_ms: int = Field(default=30_000, gt=0)
    # Connections the kernel queues before the node accepts them (capped by net.core.somaxconn).
    listen_backlog: int = Field(default=4096, gt=0)


class ClusterSection(Strict):
    """Cluster connections: who the peers are and how ungrouped messages are balanced."""

    name: str = Field(default="pinmq", pattern=r"^[A-Za-z0-9_.-]+$")
    address: str = ""  # clustered address prefix; "" = every address
    load_balancing: Literal["OFF", "STRICT", "ON_DEMAND"] = "ON_DEMAND"
    # Connectors form a full mesh, so every peer is one hop away and a forwarded message is
    # never forwarded again: any value from 1 up routes the same way.
    max_hops: int = 1
    connectors: list[HostPort] = Field(default_factory=list)
    reconnect_interval: int = Field(default=500, gt=0)
    # The address peers reach this node's listen.cluster at, named to them in gossip, when it
    # is not listen.cluster itself: a wildcard bind (0.0.0.0:7701 in a container, whose own
    # address may change when it reconnects to its network), NAT. Default: listen.cluster.
    advertise: HostPort | None = None

    @field_validator("max_hops")
    @classmethod
    def _forwarding_allowed(cls, value: int) -> int:
        # Artemis reads 0 as "forward nothing"; a group bound to a peer's queue could then not
        # be served at all, so refuse it instead of silently breaking grouped routing.
        if value < 1:
            raise ValueError(
                "must be at least 1: a node must forward the groups bound to its peers' queues "
                "(use load-balancing: OFF to keep ungrouped messages local)"
            )
        return value

    def covers(self, address: str) -> bool:
        return address.startswith(self.address)


class GroupingHandlerSection(Strict):
    """Artemis-style grouping handler: LOCAL decides bindings, REMOTE asks the LOCAL node."""

    name: str = "grouping-handler"
    type: Literal["LOCAL", "REMOTE"]
    address: str = ""  # the cluster address it governs; "" = every address
    timeout: int = Field(default=5000, gt=0)
    group_timeout: int = Field(default=-1, ge=-1)
    reaper_period: int = Field(default=30000, gt=0)
    # LOCAL only: ms a binding's instance may be missing (its node down or cut off) before the
    # binding goes and the group may be bound elsewhere; -1 (default): never, its messages wait.
    rebind_absent_after: int = Field(default=-1, ge=-1)
    # LOCAL only, read when rebind-absent-after is set: ms a REMOTE node's lease lasts (it
    # delivers grouped messages only while it holds one, renewed every third of it), and the
    # margin the LOCAL node waits beyond a lease before re-binding that node's groups.
    lease: int = Field(default=4000, gt=0)
    lease_margin: int = Field(default=1000, ge=0)

    def covers(self, address: str) -> bool:
        return address.startswith(self.address)


class LogSection(Strict):
    """Logging; format `auto` picks console on a terminal and json otherwise."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class AuditSection(Strict):
    """Audit log (broker/audit.py): one JSON line per message event, read by `pinmq check`."""

    enabled: bool = False
    dir: Path | None = None  # default: <data-dir>/audit
    segment_bytes: Annotated[int, BeforeValidator(size_bytes), Field(gt=0)] = 64 * 1024 * 1024
    flush_ms: int = Field(default=100, gt=0)  # how often buffered events are written


class HaSection(Strict):
    """A node as a pair of processes: a primary and its replicated backup.

    Both have a `cluster` section and the same `grouping-handler` type (LOCAL or REMOTE). The
    backup follows the primary's stores over `listen.cluster` (cluster/replication.py) and
    serves no clients.
    """

    role: Literal["primary", "backup"]
    primary: HostPort | None = None  # backup only: its primary's listen.cluster
    # The address the other process of the pair reaches this one's listen.cluster at, when it
    # is not the cluster address (a proxy, NAT); default: cluster.advertise, else listen.cluster.
    advertise: HostPort | None = None
    allow_failback: bool = False
    heartbeat_interval: int = Field(default=200, gt=0)  # ms between primary <-> backup heartbeats
    failure_timeout: int = Field(default=1000, gt=0)  # ms without heartbeats: ask for a vote

    @model_validator(mode="after")
    def _consistent(self) -> HaSection:
        if self.role == "backup" and self.primary is None:
            raise PydanticCustomError(
                "pinmq", "a backup needs ha.primary: its primary's listen.cluster address"
            )
        if self.role == "primary" and self.primary is not None:
            raise PydanticCustomError(
                "pinmq", "ha.primary is for a backup (role: backup); a primary has none"
            )
        if self.failure_timeout < 2 * self.heartbeat_interval:
            raise PydanticCustomError(
                "pinmq",
                f"ha.failure-timeout ({self.failure_timeout} ms) must be at least twice "
                f"ha.heartbeat-interval ({self.heartbeat_interval} ms): one lost heartbeat "
                "must not look like a failure",
            )
        return self


def _default_address_settings() -> dict[str, AddressSettings]:
    return {wildcard.ANY_WORDS: AddressSettings()}


class NodeConfig(Strict):
    """The whole node configuration file."""

    node: NodeSection
    listen: ListenSection = Field(default_factory=ListenSection)
    addresses: dict[str, AddressConfig] = Field(default_factory=dict)
    address_settings: dict[str, AddressSettings] = Field(default_factory=_default_address_settings)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    store: StoreSection = Field(default_factory=StoreSection)
    stomp: StompSection = Field(default_factory=StompSection)
    cluster: ClusterSection | None = None
    grouping_handler: GroupingHandlerSection | None = None
    log: LogSection = Field(default_factory=LogSection)
    audit: AuditSection = Field(default_factory=AuditSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    ha: HaSection | None = None
    tls: TlsSection | None = None
    security: SecuritySection = Field(default_factory=SecuritySection)
    # Store a message's delivery count before it goes out (Artemis's setting of that name,
    # with a choice of messages): after a crash, a message that was out but not acked comes
    # back marked redelivered. `grouped`: persistent messages of a group on a queue that groups
    # (not the store-and-forward queues); `all`; `none`.
    persist_delivery_count_before_delivery: Literal["none", "grouped", "all"] = "grouped"

    @field_validator("addresses")
    @classmethod
    def _queue_names_unique(cls, value: dict[str, AddressConfig]) -> dict[str, AddressConfig]:
        # Queues are looked up by name alone, so a name may be bound to one address only.
        owner: dict[str, str] = {}
        for address, cfg in value.items():
            for queue in cfg.queues:
                if queue in owner:
                    raise PydanticCustomError(
                        "pinmq",
                        f"queue name {queue!r} is declared twice: "
                        f"addresses.{owner[queue]}.queues.{queue} and "
                        f"addresses.{address}.queues.{queue}",
                    )
                owner[queue] = address
                if cfg.queues[queue].dead_letter_address == address:
                    raise PydanticCustomError(
                        "pinmq",
                        f"addresses.{address}.queues.{queue}: dead-letter-address is the queue's "
                        "own address, where a rejected message could only be dropped; name "
                        "another address (DLQ by default) or null to drop on purpose",
                    )
        return value

    @field_validator("address_settings")
    @classmethod
    def _patterns_well_formed(cls, value: dict[str, AddressSettings]) -> dict[str, AddressSettings]:
        for pattern in value:
            check_pattern(pattern)
            if value[pattern].dead_letter_address == pattern:  # an address, not a wildcard
                raise PydanticCustomError(
                    "pinmq",
                    f"address-settings.{pattern}: dead-letter-address is the address itself, "
                    "where a rejected message could only be dropped; name another address "
                    "(DLQ by default) or null to drop on purpose",
                )
        return value

    @model_validator(mode="after")
    def _ha_needs_a_cluster(self) -> NodeConfig:
        if self.ha is not None and self.cluster is None:
            raise PydanticCustomError(
                "pinmq",
                "ha: a pair's processes need a cluster section: they reach each other and "
                "the nodes that vote between them over listen.cluster",
            )
        return self

    @model_validator(mode="after")
    def _ha_replicates_sqlite(self) -> NodeConfig:
        if self.ha is not None and self.store.format == "journal":
            raise PydanticCustomError(
                "pinmq",
                "ha: an ha pair replicates the sqlite store format only; "
                "remove store.format: journal",
            )
        return self

    @model_validator(mode="after")
    def _peers_can_reach_the_cluster_listener(self) -> NodeConfig:
        if self.cluster is not None and self.cluster.advertise is None:
            host = self.listen.cluster.rpartition(":")[0]
            if host in _WILDCARDS:
                raise PydanticCustomError(
                    "pinmq",
                    f"listen.cluster {self.listen.cluster} binds every interface, an address "
                    "no peer can dial: set cluster.advertise to the host:port peers reach "
                    "this node at",
                )
        return self

    def listeners(self) -> dict[str, str]:
        """The listeners the node binds, by key (`listen.client`: host:port, ...):
        listen.cluster only with a cluster section (an ha pair's traffic rides on it too)."""
        listen = self.listen
        bound = {"listen.client": listen.client, "listen.stomp": listen.stomp}
        if self.cluster is not None:
            bound["listen.cluster"] = listen.cluster
        return {**bound, "listen.http": listen.http}

    @property
    def tls_files(self) -> TlsFiles | None:
        """The node's TLS files (its listeners, its channels to peers), or None: plain text."""
        return self.tls.files() if self.tls is not None else None

    @property
    def cluster_address(self) -> str:
        """The address peers reach this node's listen.cluster at (gossiped to them)."""
        advertised = self.cluster.advertise if self.cluster is not None else None
        return advertised or self.listen.cluster

    @property
    def pair_address(self) -> str:
        """The address the other process of an ha pair reaches this one at."""
        return (self.ha.advertise if self.ha is not None else None) or self.cluster_address

    def settings_for(self, address: str) -> AddressSettings:
        """Settings from the most specific matching entry; built-in defaults if none match."""
        pattern = wildcard.most_specific(self.address_settings, address)
        return self.address_settings[pattern] if pattern is not None else AddressSettings()

    def queue_config_for(self, address: str) -> QueueConfig:
        """The QueueConfig of a queue auto-created on `address`."""
        return self.settings_for(address).queue_config()
