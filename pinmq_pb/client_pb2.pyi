from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Message(_message.Message):
    __slots__ = ("address", "body", "headers", "persistent")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    address: str
    body: bytes
    headers: _containers.ScalarMap[str, str]
    persistent: bool
    def __init__(self, address: _Optional[str] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., persistent: _Optional[bool] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: Message
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("msg_id",)
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    msg_id: int
    def __init__(self, msg_id: _Optional[int] = ...) -> None: ...

class SendBatchRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class SendBatchResponse(_message.Message):
    __slots__ = ("msg_ids",)
    MSG_IDS_FIELD_NUMBER: _ClassVar[int]
    msg_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, msg_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("batch", "msg_ids", "error_code", "error_message", "blocked")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MSG_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    batch: int
    msg_ids: _containers.RepeatedScalarFieldContainer[int]
    error_code: str
    error_message: str
    blocked: bool
    def __init__(self, batch: _Optional[int] = ..., msg_ids: _Optional[_Iterable[int]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., blocked: _Optional[bool] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("queue", "consumer_name", "prefetch")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    queue: str
    consumer_name: str
    prefetch: int
    def __init__(self, queue: _Optional[str] = ..., consumer_name: _Optional[str] = ..., prefetch: _Optional[int] = ...) -> None: ...

class Settle(_message.Message):
    __slots__ = ("delivery_ids", "want_receipt")
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    WANT_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    want_receipt: bool
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., want_receipt: _Optional[bool] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("subscribe", "ack", "release", "reject")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    ack: Settle
    release: Settle
    reject: Settle
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., ack: _Optional[_Union[Settle, _Mapping]] = ..., release: _Optional[_Union[Settle, _Mapping]] = ..., reject: _Optional[_Union[Settle, _Mapping]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("delivery_id", "msg_id", "address", "queue", "body", "headers", "delivery_count", "group_id", "group_seq", "persistent")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SEQ_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    delivery_id: int
    msg_id: int
    address: str
    queue: str
    body: bytes
    headers: _containers.ScalarMap[str, str]
    delivery_count: int
    group_id: str
    group_seq: int
    persistent: bool
    def __init__(self, delivery_id: _Optional[int] = ..., msg_id: _Optional[int] = ..., address: _Optional[str] = ..., queue: _Optional[str] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., delivery_count: _Optional[int] = ..., group_id: _Optional[str] = ..., group_seq: _Optional[int] = ..., persistent: _Optional[bool] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("consumer_id",)
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    def __init__(self, consumer_id: _Optional[str] = ...) -> None: ...

class Deliveries(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class Settled(_message.Message):
    __slots__ = ("delivery_ids",)
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("subscribed", "deliveries", "settled")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    deliveries: Deliveries
    settled: Settled
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., deliveries: _Optional[_Union[Deliveries, _Mapping]] = ..., settled: _Optional[_Union[Settled, _Mapping]] = ...) -> None: ...

class QueueSettings(_message.Message):
    __slots__ = ("durable", "group_header", "group_mode", "group_buckets", "group_rebalance", "group_rebalance_pause_dispatch", "group_first_key", "default_group", "max_delivery_attempts", "dead_letter_address", "consumers_before_dispatch", "delay_before_dispatch", "slow_consumer_threshold")
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    GROUP_HEADER_FIELD_NUMBER: _ClassVar[int]
    GROUP_MODE_FIELD_NUMBER: _ClassVar[int]
    GROUP_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    GROUP_REBALANCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_REBALANCE_PAUSE_DISPATCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIRST_KEY_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_BEFORE_DISPATCH_FIELD_NUMBER: _ClassVar[int]
    DELAY_BEFORE_DISPATCH_FIELD_NUMBER: _ClassVar[int]
    SLOW_CONSUMER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    durable: bool
    group_header: str
    group_mode: str
    group_buckets: int
    group_rebalance: bool
    group_rebalance_pause_dispatch: bool
    group_first_key: str
    default_group: str
    max_delivery_attempts: int
    dead_letter_address: str
    consumers_before_dispatch: int
    delay_before_dispatch: int
    slow_consumer_threshold: int
    def __init__(self, durable: _Optional[bool] = ..., group_header: _Optional[str] = ..., group_mode: _Optional[str] = ..., group_buckets: _Optional[int] = ..., group_rebalance: _Optional[bool] = ..., group_rebalance_pause_dispatch: _Optional[bool] = ..., group_first_key: _Optional[str] = ..., default_group: _Optional[str] = ..., max_delivery_attempts: _Optional[int] = ..., dead_letter_address: _Optional[str] = ..., consumers_before_dispatch: _Optional[int] = ..., delay_before_dispatch: _Optional[int] = ..., slow_consumer_threshold: _Optional[int] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("address", "queue", "settings")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    address: str
    queue: str
    settings: QueueSettings
    def __init__(self, address: _Optional[str] = ..., queue: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class CreateQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ("removed_messages",)
    REMOVED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    removed_messages: int
    def __init__(self, removed_messages: _Optional[int] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("name", "address", "depth", "consumer_count", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_COUNT_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    depth: int
    consumer_count: int
    settings: QueueSettings
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., depth: _Optional[int] = ..., consumer_count: _Optional[int] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "owner_consumer_id", "owner_name", "pending", "outstanding", "last_use_unix_ms", "oldest_pending_unix_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OWNER_CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_NAME_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    owner_consumer_id: str
    owner_name: str
    pending: int
    outstanding: int
    last_use_unix_ms: int
    oldest_pending_unix_ms: int
    def __init__(self, group: _Optional[str] = ..., owner_consumer_id: _Optional[str] = ..., owner_name: _Optional[str] = ..., pending: _Optional[int] = ..., outstanding: _Optional[int] = ..., last_use_unix_ms: _Optional[int] = ..., oldest_pending_unix_ms: _Optional[int] = ...) -> None: ...

class ConsumerInfo(_message.Message):
    __slots__ = ("consumer_id", "name", "prefetch", "unacked", "groups", "stalled_ms", "delivered", "acked")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    STALLED_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    name: str
    prefetch: int
    unacked: int
    groups: int
    stalled_ms: int
    delivered: int
    acked: int
    def __init__(self, consumer_id: _Optional[str] = ..., name: _Optional[str] = ..., prefetch: _Optional[int] = ..., unacked: _Optional[int] = ..., groups: _Optional[int] = ..., stalled_ms: _Optional[int] = ..., delivered: _Optional[int] = ..., acked: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups", "consumers")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[ConsumerInfo, _Mapping]]] = ...) -> None: ...

class ResetGroupsRequest(_message.Message):
    __slots__ = ("queue", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ResetGroupsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterGroupsRequest(_message.Message):
    __slots__ = ("queue", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ClusterGroupInfo(_message.Message):
    __slots__ = ("group", "queue", "node", "bound", "owner_consumer_id", "owner_name", "pending", "outstanding", "last_use_unix_ms", "oldest_pending_unix_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    OWNER_CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_NAME_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    node: str
    bound: bool
    owner_consumer_id: str
    owner_name: str
    pending: int
    outstanding: int
    last_use_unix_ms: int
    oldest_pending_unix_ms: int
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., node: _Optional[str] = ..., bound: _Optional[bool] = ..., owner_consumer_id: _Optional[str] = ..., owner_name: _Optional[str] = ..., pending: _Optional[int] = ..., outstanding: _Optional[int] = ..., last_use_unix_ms: _Optional[int] = ..., oldest_pending_unix_ms: _Optional[int] = ...) -> None: ...

class ClusterGroupsResponse(_message.Message):
    __slots__ = ("groups", "unreachable", "problems")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ClusterGroupInfo]
    unreachable: _containers.RepeatedScalarFieldContainer[str]
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, groups: _Optional[_Iterable[_Union[ClusterGroupInfo, _Mapping]]] = ..., unreachable: _Optional[_Iterable[str]] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterResetGroupRequest(_message.Message):
    __slots__ = ("group", "queue", "force")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    force: bool
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class ClusterResetGroupResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterNodeStatus(_message.Message):
    __slots__ = ("node_id", "connected", "handler", "consumers")
    class ConsumersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    connected: bool
    handler: str
    consumers: _containers.ScalarMap[str, int]
    def __init__(self, node_id: _Optional[str] = ..., connected: _Optional[bool] = ..., handler: _Optional[str] = ..., consumers: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("node_id", "nodes", "problems", "ha", "not_ready")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    HA_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[ClusterNodeStatus]
    problems: _containers.RepeatedScalarFieldContainer[str]
    ha: _containers.RepeatedCompositeFieldContainer[HaPairStatus]
    not_ready: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[ClusterNodeStatus, _Mapping]]] = ..., problems: _Optional[_Iterable[str]] = ..., ha: _Optional[_Iterable[_Union[HaPairStatus, _Mapping]]] = ..., not_ready: _Optional[_Iterable[str]] = ...) -> None: ...

class HaPairStatus(_message.Message):
    __slots__ = ("logical", "epoch", "active", "backup", "backup_in_sync", "from_active")
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    BACKUP_FIELD_NUMBER: _ClassVar[int]
    BACKUP_IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    FROM_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    logical: str
    epoch: int
    active: str
    backup: str
    backup_in_sync: bool
    from_active: bool
    def __init__(self, logical: _Optional[str] = ..., epoch: _Optional[int] = ..., active: _Optional[str] = ..., backup: _Optional[str] = ..., backup_in_sync: _Optional[bool] = ..., from_active: _Optional[bool] = ...) -> None: ...

class MetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricsResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...
