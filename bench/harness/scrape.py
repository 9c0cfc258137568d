"""Prometheus' part in a benchmark: `GET /metrics` of a node every few seconds, in a thread,
while the load runs, so what scraping costs the node shows in the load's figures."""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from types import TracebackType


class Scraper:
    """Scrapes `http://address/metrics` every `every_s` seconds between `with` and its end."""

    def __init__(self, address: str, every_s: float) -> None:
        self.url = f"http://{address}/metrics"
        self.every_s = every_s
        self.took_s: list[float] = []
        self.size = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            start = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as reply:
                self.size = len(reply.read())
            self.took_s.append(time.perf_counter() - start)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        if not self.took_s:
            return f"no scrape finished (every {self.every_s} s)"
        median_ms = statistics.median(self.took_s) * 1000
        return (
            f"{len(self.took_s)} scrapes every {self.every_s} s, median {median_ms:.1f} ms, "
            f"{self.size:,} bytes"
        )
