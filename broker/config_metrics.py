"""The node config's `metrics` section: what `GET /metrics` on listen.http shows.

Part of the YAML contract that `broker/config.py`'s `NodeConfig` holds; `pinmq/metrics.py`
reads it.
"""

from __future__ import annotations

from pydantic import Field

from broker.config_base import Strict


class MetricsSection(Strict):
    """`top-groups`: how many groups per queue /metrics names, by backlog and by the age of
    their oldest waiting message (0: none). A series per group would be a million series at a
    million groups; the top few show the stuck ones (broker/lagging.py finds them)."""

    top_groups: int = Field(default=20, ge=0, le=500)  # broker/dispatch.py's DEEP_CAP / 2
