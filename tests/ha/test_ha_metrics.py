"""The ha pair in `GET /metrics`, from real processes: each one's failover role, the epoch and
whether the backup is in sync, before and after the backup takes over."""

from __future__ import annotations

import signal
from pathlib import Path

from conftest import scrape
from ha_nodes import BACKUP, PRIMARY, HaCluster, serving
from waiting import wait


def test_each_process_of_the_pair_reports_its_role_and_a_takeover_moves_them(
    tmp_path: Path,
) -> None:
    ha = HaCluster(tmp_path).start()  # node1 serves, its backup in sync
    try:
        active, passive = scrape(ha.primary.http), scrape(ha.backup.http)
        assert active.value("pinmq_ha_role", node=PRIMARY, role="active") == 1
        assert passive.value("pinmq_ha_role", node=BACKUP, role="passive") == 1
        epoch = active.value("pinmq_ha_epoch")
        assert epoch >= 1 and passive.value("pinmq_ha_epoch") == epoch
        assert active.value("pinmq_ha_backup_in_sync") == 1
        assert passive.value("pinmq_ha_backup_in_sync") == 1
        assert active.value("pinmq_ha_backup_behind_records") >= 0
        assert active.value("pinmq_ha_backup_behind_bytes") >= 0
        assert active.value("pinmq_ha_elections_won_total") == 1  # a fresh primary starts it
        assert (
            active.value("pinmq_ha_takeovers_total")
            == passive.value("pinmq_ha_takeovers_total")
            == 0
        )
        # The active process is node1, with a node's metrics; the passive one only follows.
        assert active.labels("pinmq_grouping_handler_info") == [{"node": PRIMARY, "type": "LOCAL"}]
        assert active.value("pinmq_peer_linked", peer="node2") == 1
        assert passive.labels("pinmq_grouping_handler_info") == []

        ha.primary.stop(signal.SIGKILL)
        wait("the backup serving as node1", lambda: serving(ha.backup))
        took_over = scrape(ha.backup.http)
        assert took_over.value("pinmq_ha_role", node=PRIMARY, role="active") == 1
        assert took_over.value("pinmq_ha_epoch") > epoch
        assert took_over.value("pinmq_ha_backup_in_sync") == 0  # its peer is gone
        assert took_over.value("pinmq_ha_takeovers_total") == 1
        assert took_over.value("pinmq_ha_elections_won_total") == 1
    finally:
        ha.kill_all()
