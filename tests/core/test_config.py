"""Node config: the YAML contract, defaults, and one-line-per-problem error reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from broker.config import (
    AddressSettings,
    NodeConfig,
    QueueConfig,
)
from broker.config_file import ConfigError, load_config, parse_config

CONTRACT = """
node: {id: node1, data-dir: data/node1}
listen: {client: 127.0.0.1:7601, stomp: 127.0.0.1:61613,
         cluster: 127.0.0.1:7701, http: 127.0.0.1:8161}
addresses:
  orders:
    queues:
      orders: {durable: true, group-header: JMSXGroupID, group-mode: sticky, group-buckets: -1,
               group-rebalance: false, group-rebalance-pause-dispatch: false, group-first-key: null,
               default-group: null, max-delivery-attempts: 10, dead-letter-address: DLQ}
address-settings:
  "#": {auto-create-queues: true, default-group-buckets: -1, default-group-rebalance: false,
        default-group-rebalance-pause-dispatch: false, default-group-first-key: null}
"""


def error_text(text: str, source: str = "deploy/n.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source)
    return str(info.value)


def test_contract_parses() -> None:
    cfg = parse_config(CONTRACT, "contract.yaml")
    assert cfg.node.id == "node1"
    assert cfg.node.data_dir == Path("data/node1")
    assert cfg.listen.client == "127.0.0.1:7601"
    assert cfg.listen.stomp == "127.0.0.1:61613"
    assert cfg.listen.cluster == "127.0.0.1:7701"
    assert cfg.listen.http == "127.0.0.1:8161"
    assert cfg.addresses["orders"].routing_type == "anycast"
    assert cfg.addresses["orders"].queues["orders"] == QueueConfig(
        durable=True, group_mode="sticky", max_delivery_attempts=10, dead_letter_address="DLQ"
    )
    assert cfg.address_settings == {"#": AddressSettings()}


def test_deploy_examples_match_contract() -> None:
    contract = parse_config(CONTRACT, "contract.yaml")
    for name in ("standalone", "node1", "node1-backup", "node2", "node3"):
        cfg = load_config(REPO / "deploy" / f"{name}.yaml")
        assert cfg.addresses["orders"] == contract.addresses["orders"]
        assert cfg.address_settings == contract.address_settings
        # Beyond the contract: the README's one-node tour, whose workers start together.
        assert set(cfg.addresses) == {"orders", "tasks"}
        tasks = cfg.addresses["tasks"].queues["tasks"]
        assert (tasks.consumers_before_dispatch, tasks.delay_before_dispatch) == (3, 5000)
    assert load_config(REPO / "deploy" / "node1.yaml").node == contract.node


def test_minimal_config_gets_all_defaults() -> None:
    cfg = parse_config("node: {id: n1}", "n1.yaml")
    assert cfg.node.data_dir == Path("data/n1")
    assert cfg.listen.client == "127.0.0.1:7601"
    assert cfg.listen.stomp == "127.0.0.1:61613"
    assert cfg.listen.cluster == "127.0.0.1:7701"
    assert cfg.listen.http == "127.0.0.1:8161"
    assert cfg.addresses == {}
    assert cfg.address_settings == {"#": AddressSettings()}
    assert cfg.limits.max_message_size == 10 * 1024 * 1024
    assert (cfg.log.level, cfg.log.format) == ("info", "auto")
    settings = cfg.settings_for("anything.at.all")
    assert settings.auto_create_queues and settings.auto_create_addresses
    assert settings.default_group_buckets == -1
    assert settings.default_group_mode == "sticky"
    assert settings.default_group_header == "JMSXGroupID"
    assert settings.max_delivery_attempts == 10
    assert settings.dead_letter_address == "DLQ"
    assert settings.default_consumers_before_dispatch == 0
    assert settings.default_delay_before_dispatch == -1
    assert cfg.queue_config_for("orders") == QueueConfig()


def test_config_is_frozen() -> None:
    cfg = parse_config("node: {id: n1}", "n1.yaml")
    with pytest.raises(ValueError):
        cfg.node.id = "n2"  # type: ignore[misc]


def test_python_names_also_accepted() -> None:
    cfg = NodeConfig.model_validate({"node": {"id": "n1", "data_dir": "/var/pinmq"}})
    assert cfg.node.data_dir == Path("/var/pinmq")


@pytest.mark.parametrize(
    ("yaml_text", "path", "value", "expected"),
    [
        (
            "addresses: {orders: {queues: {orders: {group-mode: stiky}}}}",
            "addresses.orders.queues.orders.group-mode",
            "'stiky'",
            "one of 'sticky', 'shared'",
        ),
        (
            "addresses: {orders: {queues: {orders: {group-buckets: -2}}}}",
            "addresses.orders.queues.orders.group-buckets",
            "-2",
            "greater than or equal to -1",
        ),
        (
            "addresses: {orders: {queues: {orders: {durable: maybe}}}}",
            "addresses.orders.queues.orders.durable",
            "'maybe'",
            "a valid boolean",
        ),
        (
            "addresses: {orders: {routing-type: broadcast}}",
            "addresses.orders.routing-type",
            "'broadcast'",
            "one of 'anycast', 'multicast'",
        ),
        ("listen: {client: 'localhost:0'}", "listen.client", "'localhost:0'", "1..65535"),
        ("listen: {stomp: '61613'}", "listen.stomp", "'61613'", "host:port"),
        ("limits: {max-message-size: 0}", "limits.max-message-size", "0", "greater than 0"),
        ("log: {level: loud}", "log.level", "'loud'", "one of 'debug', 'info'"),
        ("log: {format: xml}", "log.format", "'xml'", "one of 'auto', 'json', 'console'"),
        ("listen: 5", "listen", "5", "a mapping"),
        (
            "address-settings: {'#': {default-group-mode: stiky}}",
            "address-settings.#.default-group-mode",
            "'stiky'",
            "one of 'sticky', 'shared'",
        ),
        (
            "address-settings: {'#': {default-group-header: ''}}",
            "address-settings.#.default-group-header",
            "''",
            "non-empty header name",
        ),
    ],
)
def test_bad_value_names_file_path_value_and_expectation(
    yaml_text: str, path: str, value: str, expected: str
) -> None:
    text = error_text("node: {id: n1}\n" + yaml_text)
    assert text.startswith(f"deploy/n.yaml: {path}: got {value}, expected ")
    assert expected in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("node_id", "shown"), [("''", "''"), ("'a b'", "'a b'"), ("[1]", "a list")]
)
def test_bad_node_id(node_id: str, shown: str) -> None:
    text = error_text(f"node: {{id: {node_id}}}")
    assert text.startswith(f"deploy/n.yaml: node.id: got {shown}, expected ")


def test_missing_node_id() -> None:
    assert error_text("node: {}") == "deploy/n.yaml: node.id: missing required key"
    assert error_text("log: {level: info}") == "deploy/n.yaml: node: missing required key"


def test_every_problem_reported_one_per_line() -> None:
    text = error_text(
        "node: {id: n1}\nlog: {level: loud, format: xml}\nlimits: {max-message-size: -1}"
    )
    lines = text.splitlines()
    assert len(lines) == 3
    assert all(line.startswith("deploy/n.yaml: ") for line in lines)


def test_unknown_keys() -> None:
    text = error_text(
        "node: {id: n1}\nfoo: 1\naddresses: {orders: {queues: {orders: {group-mod: shared}}}}"
    )
    assert "deploy/n.yaml: unknown key 'foo'" in text.splitlines()
    assert "deploy/n.yaml: addresses.orders.queues.orders: unknown key 'group-mod'" in text


def test_duplicate_queue_names_across_addresses() -> None:
    text = error_text(
        "node: {id: n1}\naddresses:\n  a: {queues: {q: {}}}\n  b: {queues: {q: {}, r: {}}}"
    )
    assert text.startswith("deploy/n.yaml: addresses: queue name 'q' is declared twice")
    assert "addresses.a.queues.q" in text and "addresses.b.queues.q" in text


def test_bad_settings_pattern() -> None:
    text = error_text("node: {id: n1}\naddress-settings: {'orders.#x': {}}")
    assert text.startswith("deploy/n.yaml: address-settings: bad match pattern 'orders.#x'")


def test_yaml_syntax_error_names_file_and_line() -> None:
    text = error_text("node: {id: n1}\nlisten:\n  client: [oops\n")
    assert text.startswith("deploy/n.yaml:")
    assert "invalid YAML" in text
    line = int(text.split(":")[1])
    assert line >= 3


@pytest.mark.parametrize(("text", "got"), [("", "an empty document"), ("- a\n- b", "a list")])
def test_top_level_not_a_mapping(text: str, got: str) -> None:
    assert error_text(text) == f"deploy/n.yaml: got {got}, expected a mapping at the top level"


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(info.value) == f"{missing}: config file not found"


def test_an_overlay_overrides_the_keys_it_names_and_merges_mappings(tmp_path: Path) -> None:
    base, overlay = tmp_path / "node2.yaml", tmp_path / "backup.yaml"
    base.write_text(
        "node: {id: node2}\nlisten: {client: 127.0.0.1:7602, cluster: 127.0.0.1:7702}\n"
        "cluster: {connectors: [127.0.0.1:7701], reconnect-interval: 300}\n"
        "grouping-handler: {type: REMOTE, timeout: 2000}\n"
    )
    overlay.write_text(
        "node: {id: node2-backup}\nlisten: {client: 127.0.0.1:7612}\n"
        "cluster: {connectors: [127.0.0.1:7701, 127.0.0.1:7703]}\n"
        "ha: {role: backup, primary: 127.0.0.1:7702}\n"
    )
    cfg = load_config(base, overlay)
    assert cfg.node.id == "node2-backup"
    assert (cfg.listen.client, cfg.listen.cluster) == ("127.0.0.1:7612", "127.0.0.1:7702")
    assert cfg.cluster is not None
    assert cfg.cluster.connectors == ["127.0.0.1:7701", "127.0.0.1:7703"]  # a list: replaced
    assert cfg.cluster.reconnect_interval == 300  # kept from the base
    assert cfg.grouping_handler is not None and cfg.grouping_handler.timeout == 2000
    assert cfg.ha is not None and cfg.ha.primary == "127.0.0.1:7702"
    overlay.write_text("ha: {role: leader}\n")
    with pytest.raises(ConfigError) as info:
        load_config(base, overlay)
    assert str(info.value).startswith(f"{base} + {overlay}: ha.role: got 'leader'")


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("node: {id: n1}\nlog: {level: loud}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(info.value).startswith(f"{path}: log.level: got 'loud'")


def test_unmatched_address_falls_back_to_builtin_defaults() -> None:
    cfg = parse_config("node: {id: n1}\naddress-settings: {billing.#: {}}", "n.yaml")
    assert cfg.settings_for("orders") == AddressSettings()


def test_queue_config_for_picks_most_specific_settings() -> None:
    cfg = parse_config(
        """
node: {id: n1}
address-settings:
  "#": {default-group-buckets: 4}
  "orders.#": {default-group-buckets: 16, default-group-mode: shared, max-delivery-attempts: 3}
  "orders.*": {default-group-buckets: 32, default-group-first-key: JMSXGroupFirst}
  "orders.eu": {default-group-buckets: 0, dead-letter-address: null,
                default-group-header: _AMQ_GROUP_ID, default-group-rebalance: true,
                default-group-rebalance-pause-dispatch: true,
                default-consumers-before-dispatch: 2, default-delay-before-dispatch: 500}
""",
        "n.yaml",
    )
    assert cfg.queue_config_for("billing").group_buckets == 4
    assert cfg.queue_config_for("orders").group_buckets == 16
    assert cfg.queue_config_for("orders").group_mode == "shared"
    assert cfg.queue_config_for("orders").max_delivery_attempts == 3
    assert cfg.queue_config_for("orders.us.x").group_buckets == 16
    us = cfg.queue_config_for("orders.us")
    assert (us.group_buckets, us.group_first_key, us.group_mode) == (32, "JMSXGroupFirst", "sticky")
    assert cfg.queue_config_for("orders.eu") == QueueConfig(
        group_buckets=0,
        dead_letter_address=None,
        group_header="_AMQ_GROUP_ID",
        group_rebalance=True,
        group_rebalance_pause_dispatch=True,
        consumers_before_dispatch=2,
        delay_before_dispatch=500,
    )


def test_cluster_and_grouping_handler_sections() -> None:
    cfg = parse_config(
        """
node: {id: n1}
cluster: {name: c1, load-balancing: STRICT, connectors: [127.0.0.1:7702, 127.0.0.1:7703]}
grouping-handler: {name: gh, type: REMOTE, address: orders, timeout: 250, group-timeout: 1000}
""",
        "c.yaml",
    )
    assert cfg.cluster is not None and cfg.grouping_handler is not None
    assert cfg.cluster.load_balancing == "STRICT"
    assert cfg.cluster.connectors == ["127.0.0.1:7702", "127.0.0.1:7703"]
    assert cfg.cluster.reconnect_interval == 500
    assert cfg.grouping_handler.type == "REMOTE"
    assert (cfg.grouping_handler.timeout, cfg.grouping_handler.group_timeout) == (250, 1000)
    assert cfg.grouping_handler.reaper_period == 30000
    assert cfg.grouping_handler.covers("orders.eu") and not cfg.grouping_handler.covers("audit")
    assert parse_config("node: {id: n1}", "m.yaml").cluster is None


def test_cluster_address_is_listen_cluster_unless_advertised() -> None:
    cfg = parse_config("node: {id: n1}\ncluster: {}", "c.yaml")
    assert cfg.cluster_address == cfg.pair_address == "127.0.0.1:7701"
    text = "node: {id: n1}\nlisten: {cluster: '0.0.0.0:7701'}\ncluster: {advertise: 'n1:7701'}"
    cfg = parse_config(text, "c.yaml")
    assert (cfg.listen.cluster, cfg.cluster_address) == ("0.0.0.0:7701", "n1:7701")
    pair = HA_BASE.replace("cluster: {", "cluster: {advertise: 'n1:7701', ")
    assert parse_config(pair + "ha: {role: primary}", "p.yaml").pair_address == "n1:7701"
    ha = parse_config(pair + "ha: {role: primary, advertise: 'proxy:9000'}", "p.yaml")
    assert ha.pair_address == "proxy:9000"  # ha.advertise first: the pair's own link


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]"])
def test_a_wildcard_cluster_listener_needs_an_advertised_address(host: str) -> None:
    text = f"node: {{id: n1}}\nlisten: {{cluster: '{host}:7701'}}\ncluster: {{}}"
    problems = error_text(text, "w.yaml")
    assert f"listen.cluster {host}:7701 binds every interface" in problems
    assert "set cluster.advertise" in problems
    # Without a cluster section nobody dials it: no advertised address needed.
    assert parse_config(text.replace("\ncluster: {}", ""), "w.yaml").cluster is None


def test_grouping_handler_needs_a_valid_type_and_timeout() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("node: {id: n1}\ngrouping-handler: {type: LOCL, timeout: 0}", "g.yaml")
    text = str(err.value)
    assert "g.yaml: grouping-handler.type: got 'LOCL'" in text
    assert "grouping-handler.timeout" in text


def test_max_hops_zero_is_refused_with_the_reason() -> None:
    assert parse_config("node: {id: n1}\ncluster: {max-hops: 3}", "h.yaml").cluster.max_hops == 3
    with pytest.raises(ConfigError) as err:
        parse_config("node: {id: n1}\ncluster: {max-hops: 0}", "h.yaml")
    text = str(err.value)
    assert "h.yaml: cluster.max-hops: got 0" in text
    assert "must forward the groups bound to its peers' queues" in text


def test_id_cache_size_defaults_to_20000_and_0_turns_detection_off() -> None:
    assert parse_config("node: {id: n1}", "n1.yaml").limits.id_cache_size == 20_000
    for size in (0, 1, 500_000):
        cfg = parse_config(f"node: {{id: n1}}\nlimits: {{id-cache-size: {size}}}", "n1.yaml")
        assert cfg.limits.id_cache_size == size
    assert error_text("node: {id: n1}\nlimits: {id-cache-size: -1}") == (
        "deploy/n.yaml: limits.id-cache-size: got -1, expected a number of ids per address, "
        "0 (duplicate detection off) or more"
    )
    text = error_text("node: {id: n1}\nlimits: {id-cache-size: many}")
    assert text == "deploy/n.yaml: limits.id-cache-size: got 'many', expected a valid integer"


HA_BASE = """
node: {id: node1}
cluster: {connectors: ["127.0.0.1:7702"]}
grouping-handler: {type: LOCAL}
"""


def test_ha_section_for_a_primary_and_a_backup() -> None:
    primary = parse_config(HA_BASE + "ha: {role: primary}", "p.yaml")
    assert primary.ha is not None and primary.ha.role == "primary"
    assert (primary.ha.heartbeat_interval, primary.ha.failure_timeout) == (200, 1000)
    assert primary.ha.allow_failback is False
    backup = parse_config(
        HA_BASE + "ha: {role: backup, primary: '127.0.0.1:7701', allow-failback: true}", "b.yaml"
    )
    assert backup.ha is not None and backup.ha.primary == "127.0.0.1:7701"
    assert parse_config(HA_BASE, "none.yaml").ha is None  # without it: as before


@pytest.mark.parametrize(
    ("ha", "expected"),
    [
        ("{role: backup}", "a backup needs ha.primary"),
        ("{role: primary, primary: '127.0.0.1:7701'}", "ha.primary is for a backup"),
        ("{role: primary, heartbeat-interval: 600}", "must be at least twice"),
        ("{role: leader}", "ha.role"),
    ],
)
def test_ha_section_mistakes_are_named(ha: str, expected: str) -> None:
    problems = error_text(HA_BASE + f"ha: {ha}", "n.yaml")
    assert expected in problems


def test_any_clustered_node_may_be_a_pair_and_a_standalone_one_may_not() -> None:
    remote = "node: {id: n2}\ncluster: {connectors: []}\ngrouping-handler: {type: REMOTE}\n"
    cfg = parse_config(remote + "ha: {role: primary}", "n2.yaml")
    assert cfg.ha is not None and cfg.ha.role == "primary"
    assert "a pair's processes need a cluster section" in error_text(
        "node: {id: n2}\nha: {role: primary}\n", "n2.yaml"
    )


def test_tls_and_security_sections_as_the_contract_writes_them() -> None:
    cfg = parse_config(
        """
node: {id: n1}
tls:
  cert: /etc/pinmq/tls/node1.crt
  key: /etc/pinmq/tls/node1.key
  ca: /etc/pinmq/tls/ca.crt
  client-auth: optional
security:
  users-file: /etc/pinmq/users.yaml
  roles:
    "orders.#": {send: [app], consume: [worker], browse: [ops], manage: [admin]}
    "#": {send: [admin], consume: [admin], create: [admin], delete: [admin], manage: [admin]}
""",
        "n1.yaml",
    )
    assert cfg.tls is not None and cfg.tls.client_auth == "optional"
    files = cfg.tls_files
    assert files is not None and (files.cert, files.key, files.ca) == (
        Path("/etc/pinmq/tls/node1.crt"),
        Path("/etc/pinmq/tls/node1.key"),
        Path("/etc/pinmq/tls/ca.crt"),
    )
    assert cfg.security.roles["orders.#"]["browse"] == ["ops"]
    assert parse_config("node: {id: n1}", "n1.yaml").tls_files is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("tls: {cert: a.crt, key: a.key}", "n1.yaml: tls.ca: missing required key"),
        ("tls: {cert: a, key: b, ca: c, client-auth: maybe}", "tls.client-auth: got 'maybe'"),
        ("security: {roles: {'a#': {send: [x]}}}", "bad match pattern 'a#'"),
        ("security: {roles: {'#': {publish: [x]}}}", "security.roles.#.publish"),
        ("security: {enabled: true}", "security.enabled needs security.users-file"),
    ],
)
def test_bad_tls_and_security_sections_are_named(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config("node: {id: n1}\n" + text, "n1.yaml")
    assert said in str(refused.value)
