"""The Python client of pinmq: producers, consumers and queue administration over gRPC.

Everything is batched on the wire: `Producer.send_many` pipelines batches on one stream,
a consumer receives every ready delivery in one message, and acks made between two reads
go out together in one Settle. `SyncClient` is a small blocking facade for scripts. The
client imports nothing of the server side (a contract in pyproject.toml says so).
"""

from broker.channels import REFUSED_METADATA
from broker.client.base import CALL_TIMEOUT_S, DEFAULT_URL, Body, Item
from broker.client.connection import Client
from broker.client.consumer import Consumer, Received
from broker.client.errors import (
    AlreadyExists,
    ConnectionLost,
    Forbidden,
    Full,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    PinmqError,
    Refused,
    RefusedForNow,
    Unauthenticated,
    Unavailable,
)
from broker.client.info import ClusterGroups, ClusterStatus
from broker.client.producer import Producer
from broker.client.sync import SyncClient
from broker.info import ClusterGroupInfo, ConsumerInfo, GroupInfo, HaPairStatus, QueueInfo
from broker.tls import TlsFiles

__all__ = [
    "CALL_TIMEOUT_S",
    "DEFAULT_URL",
    "REFUSED_METADATA",
    "AlreadyExists",
    "Body",
    "Client",
    "ClusterGroupInfo",
    "ClusterGroups",
    "ClusterStatus",
    "ConnectionLost",
    "Consumer",
    "ConsumerInfo",
    "Forbidden",
    "Full",
    "GroupInfo",
    "HaPairStatus",
    "InvalidArgument",
    "Item",
    "NotFound",
    "OutcomeUnknown",
    "PinmqError",
    "Producer",
    "QueueInfo",
    "Received",
    "Refused",
    "RefusedForNow",
    "SyncClient",
    "TlsFiles",
    "Unauthenticated",
    "Unavailable",
]
