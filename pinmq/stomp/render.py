"""MESSAGE frames for a STOMP session's deliveries: the per-message cost of consuming over STOMP.

Headers are built as text in one pass (the destination line cached per address), the body is
appended as is, and the ack bookkeeping of each subscription's mode is done on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.effects import Delivery
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from pinmq.stomp.protocol import AUTO, CLIENT, DELIVERY_COUNT_HEADER, MESSAGE_OWN, Subscription


class RenderState(Protocol):
    """What rendering needs of a session (`pinmq/stomp/session.py`)."""

    version: str | None
    by_consumer: dict[str, Subscription]
    by_msg_id: dict[int, tuple[Subscription, int]]
    dests: dict[str, str]
    esc_key: Callable[[str], str]
    esc_value: Callable[[str], str]


def render_messages(
    state: RenderState,
    deliveries: list[Delivery],
    parts: list[bytes],
    auto: dict[Subscription, list[int]] | None,
) -> dict[Subscription, list[int]] | None:
    """Append MESSAGE frames for `deliveries` to `parts`; returns auto-mode ids to ack.

    Deliveries of a subscription that has ended meanwhile are dropped: closing its
    consumer already returned them to the queue.
    """
    by_consumer, dests = state.by_consumer, state.dests
    esc_key, esc_value = state.esc_key, state.esc_value
    track_msg_ids = state.version != "1.2"
    for d in deliveries:
        sub = by_consumer.get(d.consumer_id)
        if sub is None:
            continue
        m = d.message
        did = d.delivery_id
        dest = dests.get(m.address)
        if dest is None:
            dest = dests[m.address] = f"destination:/queue/{esc_value(m.address)}\n"
        extra = "" if sub.ack_prefix is None else f"{sub.ack_prefix}{did}\n"
        if m.persistent:
            extra += "persistent:true\n"
        if m.delivery_count:
            extra += f"redelivered:true\n{DELIVERY_COUNT_HEADER}:{m.delivery_count + 1}\n"
        h = m.headers
        if m.group is not None:
            if GROUP_ID_HEADER not in h:
                extra += f"{GROUP_ID_HEADER}:{esc_value(m.group)}\n"
            if GROUP_SEQ_HEADER not in h and m.group_seq:
                extra += f"{GROUP_SEQ_HEADER}:{m.group_seq}\n"
        if d.first_in_group and sub.first_line is not None:
            extra += sub.first_line
        user = "".join(
            [f"{esc_key(k)}:{esc_value(v)}\n" for k, v in h.items() if k not in MESSAGE_OWN]
        )
        body = m.body
        text = f"{sub.head}message-id:{m.msg_id}\n{dest}{extra}{user}content-length:{len(body)}\n\n"
        if "\0" in text:
            text = text.replace("\0", "\ufffd")
        parts += (text.encode(), body, b"\0")
        mode = sub.mode
        if mode == AUTO:
            if auto is None:
                auto = {}
            ids = auto.get(sub)
            if ids is None:
                auto[sub] = [did]
            else:
                ids.append(did)
            continue
        if mode == CLIENT:
            sub.outstanding.append((did, m.msg_id))
        if track_msg_ids:
            state.by_msg_id[m.msg_id] = (sub, did)
    return auto
