"""Password checks under a burst: taken in turn by host, bounded, and a user whose password the
node verified before is let in at once, until the users file changes (broker/login_queue.py,
broker/authenticator.py; real argon2id hashes, a real users file, the real worker thread)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from broker.authenticator import Authenticator
from broker.login_queue import FAILURES, REFILL_S, LoginQueue
from broker.permissions import Authorizer
from broker.users import UserEntry, Users, hash_password, write_users

pytestmark = pytest.mark.asyncio


async def test_a_burst_from_one_host_does_not_wait_in_front_of_another_host() -> None:
    queue: LoginQueue[str] = LoginQueue(per_host=16, total=64)
    gate = threading.Event()
    order: list[str] = []

    def check(name: str) -> str:
        if name == "a0":
            gate.wait(5)  # everything else queues behind the first check meanwhile
        order.append(name)
        return name

    burst = [
        asyncio.create_task(queue.run("10.0.0.1", lambda n=f"a{i}": check(n))) for i in range(8)
    ]
    await asyncio.sleep(0.05)
    other = asyncio.create_task(queue.run("10.0.0.2", lambda: check("b0")))
    await asyncio.sleep(0.05)
    gate.set()
    assert await other == "b0"
    assert [await task for task in burst] == [f"a{i}" for i in range(8)]
    assert order[:3] == ["a0", "a1", "b0"]  # the one running, the host's next turn, then b
    queue.close()


async def test_checks_past_a_hosts_bound_or_the_total_are_refused_at_once() -> None:
    queue: LoginQueue[None] = LoginQueue(per_host=2, total=3)
    gate = threading.Event()
    running = [asyncio.create_task(queue.run("a", lambda: gate.wait(5) and None))]
    await asyncio.sleep(0.05)  # a's first check is running, not waiting
    running += [asyncio.create_task(queue.run("a", lambda: None)) for _ in range(2)]
    await asyncio.sleep(0)
    assert queue.full("a") and not queue.full("b")
    running.append(asyncio.create_task(queue.run("b", lambda: None)))
    await asyncio.sleep(0)
    assert queue.full("b") and queue.full("c")  # 3 waiting in all
    gate.set()
    await asyncio.gather(*running)
    assert not queue.full("a") and not queue.full("c")
    queue.close()


async def test_a_check_ending_after_close_starts_nothing_and_later_ones_are_refused() -> None:
    """The node stopping closes the queue while a check runs and logins still arrive: the
    running check ends, no new one is started on the shut worker (that raised in a callback,
    which asyncio logged as an error), and every later check is refused (cancelled) at once."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    queue: LoginQueue[str] = LoginQueue()
    gate = threading.Event()
    running = asyncio.create_task(queue.run("a", lambda: gate.wait(5) and "a"))
    await asyncio.sleep(0.05)  # a's check is running
    waiting = asyncio.create_task(queue.run("b", lambda: "b"))
    await asyncio.sleep(0)
    queue.close()
    assert queue.full("a") and queue.full("c")
    late = asyncio.create_task(queue.run("c", lambda: "c"))  # a caller that did not ask
    await asyncio.sleep(0)
    gate.set()
    assert await running == "a"
    await asyncio.sleep(0.05)
    assert waiting.cancelled() and late.cancelled()  # neither ever ran
    assert errors == []


async def test_a_host_out_of_failures_is_refused_until_its_budget_refills() -> None:
    now = [100.0]
    queue: LoginQueue[bool] = LoginQueue(clock=lambda: now[0])
    for _ in range(FAILURES):
        assert not queue.full("a")
        assert await queue.run("a", lambda: False) is False
    assert queue.full("a") and not queue.full("b")  # only the failing host
    now[0] += REFILL_S
    assert not queue.full("a")
    assert await queue.run("a", lambda: True)
    queue.succeeded("a")  # a success gives its token back
    assert not queue.full("a")
    await queue.run("a", lambda: False)
    assert queue.full("a")
    queue.close()


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.yaml"
    write_users(path, {"admin": UserEntry(hash_password("right-Zq81"), ("admin",))})
    return path


async def test_a_known_password_gets_in_at_once_while_its_host_is_flooded(users_file: Path) -> None:
    auth = Authenticator(Users(users_file), Authorizer({}))
    peer = "127.0.0.1:5000"
    try:
        assert await auth.login("admin", "right-Zq81", peer) is not None  # verified once
        flood = [
            asyncio.create_task(auth.login("admin", f"wrong-{i}", f"127.0.0.1:{6000 + i}"))
            for i in range(40)
        ]
        await asyncio.sleep(0)
        # The host's bound is reached: a new password is refused at once, the known one is not.
        assert await auth.login("admin", "another-guess", peer) is None
        access = await asyncio.wait_for(auth.login("admin", "right-Zq81", peer), 0.5)
        assert access is not None and access.principal is not None
        assert access.principal.name == "admin"
        assert all(got is None for got in await asyncio.gather(*flood))
    finally:
        auth.close()


async def test_a_burst_of_calls_with_the_same_credentials_waits_for_one_check(
    users_file: Path,
) -> None:
    """Clients reconnecting to a node that just took over send many calls at once with the
    same credentials, before any check ended: each used to take one of the host's tokens
    (and a place in its bound), and past eight the rest were refused ("authentication
    failed") though the password was right. They now share one check; a burst of one wrong
    password costs one token, not the host's whole budget."""
    auth = Authenticator(Users(users_file), Authorizer({}))
    try:
        wrong = await asyncio.gather(
            *(auth.login("admin", "wrong-Zq81", f"10.0.0.7:{4000 + i}") for i in range(40))
        )
        assert wrong == [None] * 40
        right = await asyncio.gather(
            *(auth.login("admin", "right-Zq81", f"10.0.0.7:{5000 + i}") for i in range(40))
        )
        assert all(a is not None and a.principal is not None for a in right)  # tokens left
    finally:
        auth.close()


async def test_a_changed_password_ends_the_old_ones_shortcut(users_file: Path) -> None:
    auth = Authenticator(Users(users_file), Authorizer({}))
    peer = "127.0.0.1:5000"
    try:
        assert await auth.login("admin", "right-Zq81", peer) is not None
        write_users(users_file, {"admin": UserEntry(hash_password("new-Zq81"), ("admin",))})
        assert await auth.login("admin", "right-Zq81", peer) is None
        assert await auth.login("admin", "new-Zq81", peer) is not None
    finally:
        auth.close()
