"""What the LOCAL handler's gRPC service and the REMOTE proxy agree on beyond the proto file.

`pinmq.grouping.v1.GroupingHandler` is served by `handler/service.py` and called by
`handler/remote.py` and `handler/proposals.py`; the constants and conversions both sides must
read the same way live here, so the proxy depends on the contract, not on the LOCAL handler.
"""

from __future__ import annotations

from handler.api import RemovalReason
from handler.records import Binding
from pinmq_pb import grouping_pb2 as pb

SUBSCRIBED = ("pinmq-subscribed", "1")  # initial metadata of a Removals stream once it is live
HEARTBEAT_S = 5.0  # an idle Removals stream sends an empty Removal this often

REASON_TO_PB = {
    RemovalReason.REAPED: pb.REASON_REAPED,
    RemovalReason.UNBOUND: pb.REASON_UNBOUND,
    RemovalReason.INSTANCE_DELETED: pb.REASON_INSTANCE_DELETED,
    RemovalReason.INSTANCE_ABSENT: pb.REASON_INSTANCE_ABSENT,
}
PB_TO_REASON = {v: k for k, v in REASON_TO_PB.items()}


def to_binding(message: pb.BindingReply | pb.Removal | pb.BindingInfo) -> Binding:
    return Binding(message.group, message.queue, message.node, message.epoch)
