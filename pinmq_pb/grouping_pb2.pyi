from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_UNSPECIFIED: _ClassVar[Reason]
    REASON_REAPED: _ClassVar[Reason]
    REASON_UNBOUND: _ClassVar[Reason]
    REASON_INSTANCE_DELETED: _ClassVar[Reason]
    REASON_INSTANCE_ABSENT: _ClassVar[Reason]
REASON_UNSPECIFIED: Reason
REASON_REAPED: Reason
REASON_UNBOUND: Reason
REASON_INSTANCE_DELETED: Reason
REASON_INSTANCE_ABSENT: Reason

class LeaseRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("lease_ms", "arbiter_epoch")
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    ARBITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    lease_ms: int
    arbiter_epoch: int
    def __init__(self, lease_ms: _Optional[int] = ..., arbiter_epoch: _Optional[int] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("group", "queue", "node", "id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    node: str
    id: int
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., node: _Optional[str] = ..., id: _Optional[int] = ...) -> None: ...

class ProposeBatch(_message.Message):
    __slots__ = ("proposals",)
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    proposals: _containers.RepeatedCompositeFieldContainer[ProposeRequest]
    def __init__(self, proposals: _Optional[_Iterable[_Union[ProposeRequest, _Mapping]]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("id", "binding", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    binding: BindingReply
    error: str
    def __init__(self, id: _Optional[int] = ..., binding: _Optional[_Union[BindingReply, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class DecisionBatch(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class BindingReply(_message.Message):
    __slots__ = ("group", "queue", "node", "epoch", "accepted", "arbiter_epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ARBITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    node: str
    epoch: int
    accepted: bool
    arbiter_epoch: int
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., node: _Optional[str] = ..., epoch: _Optional[int] = ..., accepted: _Optional[bool] = ..., arbiter_epoch: _Optional[int] = ...) -> None: ...

class Key(_message.Message):
    __slots__ = ("group", "queue", "node")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    node: str
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class TouchRequest(_message.Message):
    __slots__ = ("keys", "validate_only")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[Key]
    validate_only: bool
    def __init__(self, keys: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class TouchReply(_message.Message):
    __slots__ = ("stale", "arbiter_epoch")
    STALE_FIELD_NUMBER: _ClassVar[int]
    ARBITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    stale: _containers.RepeatedCompositeFieldContainer[Key]
    arbiter_epoch: int
    def __init__(self, stale: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., arbiter_epoch: _Optional[int] = ...) -> None: ...

class RemovalsRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class Removal(_message.Message):
    __slots__ = ("group", "queue", "node", "epoch", "reason", "arbiter_epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ARBITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    node: str
    epoch: int
    reason: Reason
    arbiter_epoch: int
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., node: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[_Union[Reason, str]] = ..., arbiter_epoch: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("group", "limit")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    group: str
    limit: int
    def __init__(self, group: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class BindingInfo(_message.Message):
    __slots__ = ("group", "queue", "node", "epoch", "last_use_unix_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    node: str
    epoch: int
    last_use_unix_ms: int
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ..., node: _Optional[str] = ..., epoch: _Optional[int] = ..., last_use_unix_ms: _Optional[int] = ...) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("bindings",)
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[BindingInfo]
    def __init__(self, bindings: _Optional[_Iterable[_Union[BindingInfo, _Mapping]]] = ...) -> None: ...

class UnbindRequest(_message.Message):
    __slots__ = ("group", "queue")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    group: str
    queue: str
    def __init__(self, group: _Optional[str] = ..., queue: _Optional[str] = ...) -> None: ...

class UnbindReply(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...
