"""The shipped configs agree with each other: deploy/*.yaml (`make up-local`),
deploy/compose/*.yaml (docker-compose.yml) and the overlays of docker-compose.ha-all.yml."""

from __future__ import annotations

from conftest import REPO

from broker.config_file import load_config


def test_deploy_cluster_is_consistent() -> None:
    """One LOCAL node as a primary and its backup; distinct ports and data dirs; the REMOTE
    nodes reach every other process, the pair reaches the REMOTE nodes (its voters)."""
    names = ("node1", "node1-backup", "node2", "node3")
    cfgs = {n: load_config(REPO / "deploy" / f"{n}.yaml") for n in names}
    handlers = {n: c.grouping_handler.type for n, c in cfgs.items() if c.grouping_handler}
    assert handlers == {
        "node1": "LOCAL",
        "node1-backup": "LOCAL",
        "node2": "REMOTE",
        "node3": "REMOTE",
    }
    primary, backup = cfgs["node1"].ha, cfgs["node1-backup"].ha
    assert primary is not None and primary.role == "primary"
    assert backup is not None and backup.role == "backup"
    assert backup.primary == cfgs["node1"].listen.cluster
    ports = [p for c in cfgs.values() for p in c.listeners().values()]
    assert len(ports) == len(set(ports))
    assert len({c.node.data_dir for c in cfgs.values()}) == 4
    remote = {cfgs[n].listen.cluster for n in ("node2", "node3")}
    for name, c in cfgs.items():
        assert c.cluster is not None
        if c.ha is not None:
            assert set(c.cluster.connectors) == remote
        else:
            others = {o.listen.cluster for n, o in cfgs.items() if n != name}
            assert set(c.cluster.connectors) == others


def test_compose_cluster_is_consistent() -> None:
    """The containers bind every interface and name their service to peers: every connector,
    and the backup's primary, is another container's advertised address."""
    names = ("node1", "node1-backup", "node2", "node3")
    cfgs = {n: load_config(REPO / "deploy" / "compose" / f"{n}.yaml") for n in names}
    assert {n: c.cluster_address for n, c in cfgs.items()} == {n: f"{n}:7701" for n in names}
    assert {c.listen.cluster for c in cfgs.values()} == {"0.0.0.0:7701"}
    backup = cfgs["node1-backup"]
    assert backup.ha is not None and backup.ha.primary == "node1:7701"
    assert backup.pair_address == "node1-backup:7701"
    for name, c in cfgs.items():
        assert c.cluster is not None
        others = {o.cluster_address for n, o in cfgs.items() if n != name}
        voters = {"node2:7701", "node3:7701"}
        assert set(c.cluster.connectors) == (voters if c.ha is not None else others)


def test_compose_ha_all_pairs_every_node_and_lets_the_other_pairs_vote() -> None:
    """docker-compose.ha-all.yml: each process reads its node's compose config with its
    deploy/compose/ha-all/ overlay on top."""
    compose = REPO / "deploy" / "compose"
    names = ("node1", "node1-backup", "node2", "node2-backup", "node3", "node3-backup")
    base = {n: "node1-backup" if n == "node1-backup" else n.removesuffix("-backup") for n in names}
    cfgs = {
        n: load_config(compose / f"{base[n]}.yaml", compose / "ha-all" / f"{n}.yaml") for n in names
    }
    for name, c in cfgs.items():
        logical = name.removesuffix("-backup")
        assert c.node.id == name and c.cluster_address == f"{name}:7701"
        assert c.tls is not None and c.tls.cert.name == f"{name}.crt"
        assert c.ha is not None
        assert c.ha.role == ("backup" if name.endswith("-backup") else "primary")
        if c.ha.role == "backup":
            assert c.ha.primary == f"{logical}:7701"
        handler = c.grouping_handler
        assert handler is not None and handler.type == ("LOCAL" if logical == "node1" else "REMOTE")
        assert c.cluster is not None
        others = {f"{n}:7701" for n in names if not n.startswith(logical)}
        assert set(c.cluster.connectors) == others
