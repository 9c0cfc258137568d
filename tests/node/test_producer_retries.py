"""A send whose stream ended under a write, its status lost by grpcio (grpc/grpc#36066), is
asked again: the answer the node gives the second time is the one the caller gets, and when
no answer comes the outcome stays unknown (the layer above the connection, with a stand-in
connection that answers as scripted)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from broker.client.errors import (
    ConnectionLost,
    EndedUnderWrite,
    OutcomeUnknown,
    PinmqError,
    Unauthenticated,
)
from broker.client.producer import ASK_AGAIN, Producer

T = TypeVar("T")
LOST_STATUS = EndedUnderWrite("the stream to n1 ended under a write", "UNAVAILABLE")


class Scripted:
    """A connection whose attempts end as `answers` says, in turn (None: the send went)."""

    def __init__(self, *answers: PinmqError | None) -> None:
        self.answers = list(answers)
        self.attempts = 0

    async def _with_failover(
        self, attempt: Callable[[], Awaitable[T]], *, repeat_unknown: bool
    ) -> Any:
        assert repeat_unknown
        self.attempts += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def producer(link: Scripted) -> Producer:
    return Producer(link, "orders", "g", "JMSXGroupID", True)  # type: ignore[arg-type]


async def test_a_refusal_whose_status_grpcio_lost_is_asked_again_and_told() -> None:
    link = Scripted(LOST_STATUS, Unauthenticated("refused by n1: authentication failed"))
    with pytest.raises(Unauthenticated):
        await producer(link).send_batch(["x"])
    assert link.attempts == 2


async def test_a_node_gone_after_the_lost_status_leaves_the_outcome_unknown() -> None:
    link = Scripted(LOST_STATUS, ConnectionLost("no connection to n1", "UNAVAILABLE"))
    with pytest.raises(OutcomeUnknown, match="ended under a write"):
        await producer(link).send_batch(["x"])


async def test_the_lost_status_asked_again_a_bounded_number_of_times() -> None:
    link = Scripted(*[LOST_STATUS] * ASK_AGAIN)
    with pytest.raises(OutcomeUnknown, match="ended under a write"):
        await producer(link).send_batch(["x"])
    assert link.attempts == ASK_AGAIN


async def test_a_send_that_goes_the_second_time_succeeds() -> None:
    link = Scripted(LOST_STATUS, None)
    assert await producer(link).send_batch(["x"]) == []  # the stand-in confirms no ids
    assert link.attempts == 2


async def test_a_connection_lost_first_is_reported_as_such() -> None:
    link = Scripted(ConnectionLost("no connection to n1", "UNAVAILABLE"))
    with pytest.raises(ConnectionLost):
        await producer(link).send_batch(["x"])
