"""Password checks taken in turn by client host, so that one host's burst cannot starve others.

One worker thread runs the checks (argon2id costs tens of milliseconds of CPU by design). The
checks waiting for it are kept per host and served round-robin: a host with a thousand wrong
passwords in flight gets one check in turn with every other host that waits, not a thousand
before them. Each host may have `per_host` checks waiting and all hosts together `total`;
past either, a check is refused at once (the caller answers "authentication failed").

Each host also has a budget of checks that fail: `FAILURES` at first, then one more every
`REFILL_S` (a token bucket; a check takes a token as it is queued, a success gives it back).
A host out of tokens is refused at once, without a check: a burst of wrong passwords costs a
few checks, then one a second, instead of a core for as long as it lasts. A user whose
password was verified before is let in without a check (the caller's cache), so a burst from
the same host does not lock it out.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")

PER_HOST = 16  # checks one host may have waiting
TOTAL = 256  # checks all hosts together may have waiting
FAILURES = 8  # checks a host may fail in a row...
REFILL_S = 1.0  # ...then one more each this many seconds
MAX_HOSTS = 4096  # hosts whose budget is kept (the fullest are forgotten first)


class LoginQueue(Generic[T]):
    """Runs checks on one worker thread, fairly across hosts; bounded per host and in total."""

    def __init__(
        self,
        per_host: int = PER_HOST,
        total: int = TOTAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_host, self.total, self.clock = per_host, total, clock
        self._budget: dict[str, tuple[float, float]] = {}  # host -> (tokens, when counted)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pinmq-login")
        self._waiting: OrderedDict[str, deque[tuple[Callable[[], T], asyncio.Future[T]]]] = (
            OrderedDict()
        )
        self._count = 0
        self._busy = False
        self._closed = False  # the node stops: every check is refused, none is started

    def full(self, host: str) -> bool:
        """Whether a check from `host` would be refused now: the queue closed, too many
        waiting, or the host is out of failures."""
        return (
            self._closed
            or self._count >= self.total
            or len(self._waiting.get(host, ())) >= self.per_host
            or self._tokens(host) < 1
        )

    async def run(self, host: str, check: Callable[[], T]) -> T:
        """`check()` on the worker, in `host`'s turn, taking one of its tokens (`succeeded`
        gives it back). The caller asks `full` first."""
        self._budget[host] = (self._tokens(host) - 1, self.clock())
        if len(self._budget) > MAX_HOSTS:
            fullest = max(self._budget, key=self._tokens)
            del self._budget[fullest]
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._closed:  # as the checks waiting when it closed
            future.cancel()
        self._waiting.setdefault(host, deque()).append((check, future))
        self._count += 1
        self._next()
        return await future

    def succeeded(self, host: str) -> None:
        """A check from `host` passed: its token back."""
        if host in self._budget:
            self._budget[host] = (min(FAILURES, self._tokens(host) + 1), self.clock())

    def _tokens(self, host: str) -> float:
        """`host`'s tokens now: what it had, refilled since."""
        if host not in self._budget:
            return FAILURES
        tokens, counted = self._budget[host]
        return min(FAILURES, tokens + (self.clock() - counted) / REFILL_S)

    def close(self) -> None:
        """Cancel the waiting checks; the running one ends, and nothing starts after it."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        for jobs in self._waiting.values():
            for _, future in jobs:
                future.cancel()
        self._waiting.clear()

    def _next(self) -> None:
        """Start the next host's oldest check if the worker is idle; that host goes last."""
        while not self._busy and self._waiting and not self._closed:
            host, jobs = next(iter(self._waiting.items()))
            check, future = jobs.popleft()
            self._count -= 1
            if jobs:
                self._waiting.move_to_end(host)
            else:
                del self._waiting[host]
            if future.cancelled():  # its client went away while it waited
                continue
            self._busy = True
            done = asyncio.get_running_loop().run_in_executor(self._pool, check)
            done.add_done_callback(lambda d, f=future: self._finished(d, f))

    def _finished(self, done: asyncio.Future[T], future: asyncio.Future[T]) -> None:
        self._busy = False
        if not future.done():
            if done.cancelled():
                future.cancel()
            elif (err := done.exception()) is not None:
                future.set_exception(err)
            else:
                future.set_result(done.result())
        self._next()
