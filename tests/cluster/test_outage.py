"""Outage: a link retried every reconnect-interval logs each failure of an outage once."""

from __future__ import annotations

from cluster.outage import Outage


def test_alternating_failures_are_each_news_once_per_outage() -> None:
    outage = Outage()
    passive, core = "UNAVAILABLE: node1-backup is passive", "INTERNAL: Internal error from Core"
    assert [outage.news(r) for r in (passive, core, passive, core, passive)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    outage.over()  # the link was up in between: the same failures are news again
    assert outage.news(core) and outage.news(passive)
    assert not outage.news(core)
