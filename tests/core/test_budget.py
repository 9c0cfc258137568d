"""The memory budget's decisions (pure): which limit and policy an address gets, when a send
is refused, blocked or let in to be paged, and how the meters add up."""

from __future__ import annotations

from broker.budget import MESSAGE_OVERHEAD, Budget, Meter, footprint
from broker.config_file import parse_config
from broker.message import Message

CONFIG = """
node: {id: b}
limits: {global-max-size: 10000}
addresses:
  declared: {queues: {declared: {}}}
address-settings:
  "#": {max-size-bytes: 1000, default-max-size-bytes: 500, default-address-full-policy: FAIL}
  "blocking.#": {max-size-bytes: 100, address-full-policy: BLOCK}
"""


def budget() -> Budget:
    return Budget(parse_config(CONFIG, "test"))


def test_declared_and_auto_created_addresses_get_their_own_limit_and_policy() -> None:
    b = budget()
    assert (b.meter("declared").limit, b.meter("declared").policy) == (1000, "PAGE")
    assert (b.meter("auto").limit, b.meter("auto").policy) == (500, "FAIL")
    assert (b.meter("blocking.x").limit, b.meter("blocking.x").policy) == (100, "BLOCK")
    assert b.meter("auto") is b.meter("auto")


def test_a_message_counts_its_body_headers_and_overhead_on_its_address_and_the_node() -> None:
    m = Message(1, "q", "q", b"x" * 10, {"k": "vv"})
    assert footprint(m) == MESSAGE_OVERHEAD + 10 + 130 + 3
    node = Meter(100)
    a = Meter(-1, "PAGE", node)
    a.add(60)
    assert (a.bytes, node.bytes, a.full, a.room()) == (60, 60, False, 40)
    a.add(41)
    assert a.full and node.full and a.room() == -1


def test_full_addresses_refuse_block_or_page_by_policy_and_persistence() -> None:
    b = budget()
    b.meter("declared").add(1001)
    assert b.refusal("declared", persistent=True, pageable=True) is None  # paged
    refusal = b.refusal("declared", persistent=False, pageable=True)
    assert refusal is not None and not refusal.block
    assert "non-persistent messages are not paged" in refusal.reason
    refusal = b.refusal("declared", persistent=True, pageable=False)
    assert refusal is not None and "a queue is not durable" in refusal.reason
    b.meter("blocking.x").add(101)
    refusal = b.refusal("blocking.x", persistent=True, pageable=True)
    assert refusal is not None and refusal.block and "max-size-bytes (100)" in refusal.reason
    assert b.refusal("auto", persistent=True, pageable=True) is None  # room: the node has 8898


def test_the_node_limit_and_a_full_disk_apply_to_every_address() -> None:
    b = budget()
    b.meter("auto").add(400)
    b.meter("declared").add(9700)  # the node now holds 10100 > 10000
    refusal = b.refusal("auto", persistent=True, pageable=True)
    assert refusal is not None and "limits.global-max-size (10000)" in refusal.reason
    b = budget()
    b.disk_full, b.disk_percent = True, 93.4
    refusal = b.refusal("declared", persistent=True, pageable=True)
    assert refusal is not None and "93% full, above limits.max-disk-usage (90%)" in refusal.reason
    assert b.refusal("declared", persistent=False, pageable=True) is None  # not written to disk
