"""A voter whose disk is full (tests/disk_images.py, a real one) sends no vote it could not
save: a vote forgotten in a restart could be granted twice. Once the disk has room, the same
request is answered, the epoch it promised on disk first. The failure is warned of once."""

from __future__ import annotations

import json
from pathlib import Path

from disk_images import disks
from structlog.testing import capture_logs

from cluster.failover_messages import VoteReply, VoteRequest
from cluster.ha import VOTES_FILE, VoterRegistry
from cluster.ha_wire import from_pb, to_pb


def test_a_voter_that_cannot_save_its_vote_sends_none_until_it_can(tmp_path: Path) -> None:
    with disks(tmp_path, ("voter",), 16) as made:
        disk = made["voter"]
        registry = VoterRegistry(disk.mount)
        request = to_pb("node1", VoteRequest("node1-backup", 2, 1), 1000)
        disk.fill()
        with capture_logs() as logged:
            assert registry.receive(request) == []
            assert registry.receive(request) == []  # asked again: still nothing leaves
        assert not (disk.mount / VOTES_FILE).exists()
        assert [e["log_level"] for e in logged] == ["warning"]
        disk.free()
        [reply] = [from_pb(envelope) for envelope in registry.receive(request)]
        assert isinstance(reply, VoteReply) and reply.known_epoch == 2
        saved = json.loads((disk.mount / VOTES_FILE).read_text())
        assert saved["node1"]["voted"] == 2  # what the reply rests on is on disk first
