from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HandlerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDLER_NONE: _ClassVar[HandlerType]
    HANDLER_LOCAL: _ClassVar[HandlerType]
    HANDLER_REMOTE: _ClassVar[HandlerType]
HANDLER_NONE: HandlerType
HANDLER_LOCAL: HandlerType
HANDLER_REMOTE: HandlerType

class QueueInstance(_message.Message):
    __slots__ = ("address", "queue", "consumers")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    address: str
    queue: str
    consumers: int
    def __init__(self, address: _Optional[str] = ..., queue: _Optional[str] = ..., consumers: _Optional[int] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("cluster_name", "node_id", "cluster_address", "handler", "instances", "incarnation", "version")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    node_id: str
    cluster_address: str
    handler: HandlerType
    instances: _containers.RepeatedCompositeFieldContainer[QueueInstance]
    incarnation: int
    version: int
    def __init__(self, cluster_name: _Optional[str] = ..., node_id: _Optional[str] = ..., cluster_address: _Optional[str] = ..., handler: _Optional[_Union[HandlerType, str]] = ..., instances: _Optional[_Iterable[_Union[QueueInstance, _Mapping]]] = ..., incarnation: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("state", "connected", "local", "down_since_unix_ms")
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    DOWN_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    state: NodeState
    connected: bool
    local: bool
    down_since_unix_ms: int
    def __init__(self, state: _Optional[_Union[NodeState, _Mapping]] = ..., connected: _Optional[bool] = ..., local: _Optional[bool] = ..., down_since_unix_ms: _Optional[int] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("node_id", "nodes", "problems")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class ForwardedMessage(_message.Message):
    __slots__ = ("seq", "queue", "address", "body", "headers", "persistent")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    queue: str
    address: str
    body: bytes
    headers: _containers.ScalarMap[str, str]
    persistent: bool
    def __init__(self, seq: _Optional[int] = ..., queue: _Optional[str] = ..., address: _Optional[str] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., persistent: _Optional[bool] = ...) -> None: ...

class ForwardBatch(_message.Message):
    __slots__ = ("origin", "origin_store", "target_node", "messages")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_STORE_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    origin: str
    origin_store: int
    target_node: str
    messages: _containers.RepeatedCompositeFieldContainer[ForwardedMessage]
    def __init__(self, origin: _Optional[str] = ..., origin_store: _Optional[int] = ..., target_node: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ForwardedMessage, _Mapping]]] = ...) -> None: ...

class ForwardAck(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class GroupsRequest(_message.Message):
    __slots__ = ("queue", "group")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class GroupRow(_message.Message):
    __slots__ = ("queue", "group", "owner_consumer_id", "owner_name", "pending", "outstanding", "last_use_unix_ms", "oldest_pending_unix_ms")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OWNER_CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_NAME_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    group: str
    owner_consumer_id: str
    owner_name: str
    pending: int
    outstanding: int
    last_use_unix_ms: int
    oldest_pending_unix_ms: int
    def __init__(self, queue: _Optional[str] = ..., group: _Optional[str] = ..., owner_consumer_id: _Optional[str] = ..., owner_name: _Optional[str] = ..., pending: _Optional[int] = ..., outstanding: _Optional[int] = ..., last_use_unix_ms: _Optional[int] = ..., oldest_pending_unix_ms: _Optional[int] = ...) -> None: ...

class GroupsReply(_message.Message):
    __slots__ = ("node_id", "groups")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupRow]
    def __init__(self, node_id: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupRow, _Mapping]]] = ...) -> None: ...

class ReplicaReport(_message.Message):
    __slots__ = ("hello", "durable")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    hello: ReplicaHello
    durable: int
    def __init__(self, hello: _Optional[_Union[ReplicaHello, _Mapping]] = ..., durable: _Optional[int] = ...) -> None: ...

class ReplicaHello(_message.Message):
    __slots__ = ("node_id", "cluster_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster_address: str
    def __init__(self, node_id: _Optional[str] = ..., cluster_address: _Optional[str] = ...) -> None: ...

class ReplicationFrame(_message.Message):
    __slots__ = ("begin", "rows", "end", "ops")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    begin: SnapshotBegin
    rows: SnapshotRows
    end: SnapshotEnd
    ops: ReplicatedOps
    def __init__(self, begin: _Optional[_Union[SnapshotBegin, _Mapping]] = ..., rows: _Optional[_Union[SnapshotRows, _Mapping]] = ..., end: _Optional[_Union[SnapshotEnd, _Mapping]] = ..., ops: _Optional[_Union[ReplicatedOps, _Mapping]] = ...) -> None: ...

class SnapshotBegin(_message.Message):
    __slots__ = ("seq", "primary", "epoch")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    primary: str
    epoch: int
    def __init__(self, seq: _Optional[int] = ..., primary: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class SnapshotRows(_message.Message):
    __slots__ = ("file", "table", "rows")
    FILE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    file: str
    table: str
    rows: bytes
    def __init__(self, file: _Optional[str] = ..., table: _Optional[str] = ..., rows: _Optional[bytes] = ...) -> None: ...

class SnapshotEnd(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicatedOp(_message.Message):
    __slots__ = ("seq", "file", "kind", "payload")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    file: str
    kind: int
    payload: bytes
    def __init__(self, seq: _Optional[int] = ..., file: _Optional[str] = ..., kind: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ReplicatedOps(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[ReplicatedOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[ReplicatedOp, _Mapping]]] = ...) -> None: ...

class FailoverEnvelope(_message.Message):
    __slots__ = ("logical", "failure_timeout_ms", "to_peer", "heartbeat", "heartbeat_reply", "vote_request", "vote_reply", "handover")
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    FAILURE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TO_PEER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_REPLY_FIELD_NUMBER: _ClassVar[int]
    VOTE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    VOTE_REPLY_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_FIELD_NUMBER: _ClassVar[int]
    logical: str
    failure_timeout_ms: int
    to_peer: bool
    heartbeat: HaHeartbeat
    heartbeat_reply: HaHeartbeatReply
    vote_request: HaVoteRequest
    vote_reply: HaVoteReply
    handover: HaHandover
    def __init__(self, logical: _Optional[str] = ..., failure_timeout_ms: _Optional[int] = ..., to_peer: _Optional[bool] = ..., heartbeat: _Optional[_Union[HaHeartbeat, _Mapping]] = ..., heartbeat_reply: _Optional[_Union[HaHeartbeatReply, _Mapping]] = ..., vote_request: _Optional[_Union[HaVoteRequest, _Mapping]] = ..., vote_reply: _Optional[_Union[HaVoteReply, _Mapping]] = ..., handover: _Optional[_Union[HaHandover, _Mapping]] = ...) -> None: ...

class FailoverReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[FailoverEnvelope]
    def __init__(self, replies: _Optional[_Iterable[_Union[FailoverEnvelope, _Mapping]]] = ...) -> None: ...

class HaRecord(_message.Message):
    __slots__ = ("epoch", "active", "backup", "backup_in_sync", "seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    BACKUP_FIELD_NUMBER: _ClassVar[int]
    BACKUP_IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    active: str
    backup: str
    backup_in_sync: bool
    seq: int
    def __init__(self, epoch: _Optional[int] = ..., active: _Optional[str] = ..., backup: _Optional[str] = ..., backup_in_sync: _Optional[bool] = ..., seq: _Optional[int] = ...) -> None: ...

class HaHeartbeat(_message.Message):
    __slots__ = ("sender", "epoch", "seq", "backup", "backup_in_sync", "releasing")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BACKUP_FIELD_NUMBER: _ClassVar[int]
    BACKUP_IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    RELEASING_FIELD_NUMBER: _ClassVar[int]
    sender: str
    epoch: int
    seq: int
    backup: str
    backup_in_sync: bool
    releasing: bool
    def __init__(self, sender: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., backup: _Optional[str] = ..., backup_in_sync: _Optional[bool] = ..., releasing: _Optional[bool] = ...) -> None: ...

class HaHeartbeatReply(_message.Message):
    __slots__ = ("sender", "epoch", "seq", "accepted", "known_epoch", "wants_failback")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WANTS_FAILBACK_FIELD_NUMBER: _ClassVar[int]
    sender: str
    epoch: int
    seq: int
    accepted: bool
    known_epoch: int
    wants_failback: bool
    def __init__(self, sender: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., accepted: _Optional[bool] = ..., known_epoch: _Optional[int] = ..., wants_failback: _Optional[bool] = ...) -> None: ...

class HaVoteRequest(_message.Message):
    __slots__ = ("candidate", "epoch", "data_epoch", "pre")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DATA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRE_FIELD_NUMBER: _ClassVar[int]
    candidate: str
    epoch: int
    data_epoch: int
    pre: bool
    def __init__(self, candidate: _Optional[str] = ..., epoch: _Optional[int] = ..., data_epoch: _Optional[int] = ..., pre: _Optional[bool] = ...) -> None: ...

class HaVoteReply(_message.Message):
    __slots__ = ("sender", "epoch", "granted", "known_epoch", "record", "pre")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    PRE_FIELD_NUMBER: _ClassVar[int]
    sender: str
    epoch: int
    granted: bool
    known_epoch: int
    record: HaRecord
    pre: bool
    def __init__(self, sender: _Optional[str] = ..., epoch: _Optional[int] = ..., granted: _Optional[bool] = ..., known_epoch: _Optional[int] = ..., record: _Optional[_Union[HaRecord, _Mapping]] = ..., pre: _Optional[bool] = ...) -> None: ...

class HaHandover(_message.Message):
    __slots__ = ("sender", "epoch")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    sender: str
    epoch: int
    def __init__(self, sender: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
