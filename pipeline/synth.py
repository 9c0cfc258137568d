"""Synthetic audit histories with injectable violations (tests and `bench/checker.py`).

The simulated cluster: `nodes` nodes (`n1`, `n2`, ...) each with an instance of queue `orders`
and `consumers_per_node` consumers; `groups` groups, each bound in epoch 1 to one queue@node
and owned there by one consumer; one producer per `groups_per_producer` groups. Messages go
round robin over the groups, one producer sequence per group, and each leaves the events the
real writers leave: `routed` and `sent` on the node, `client_sent` on the producer's writer,
`delivered`, `client_received`, `acked` and `client_acked`. Optional realism: `releases`
messages are released once and redelivered (legitimate), and `failover` stops the last node
(its writer ends) two-thirds of the way in; its groups are bound anew in epoch 2 on the
remaining nodes after a pause, as a grouping-handler failover would.

Injected violations (`Inject`), each adding exactly its count to one check and nothing to the
others: `lost` (a confirmed message never delivered), `duplicates` (delivered and acked again
after its ack, no release), `order` (two consecutive messages of a group acked the wrong way
round), `exclusivity` (a message delivered to a second consumer while the owner still holds
the one before it), `routing` (a routed event of a group naming another node in the same
epoch).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

QUEUE = "orders"
STEP_NS = 20_000  # between two messages' first events
_E = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


@dataclass
class Inject:
    lost: int = 0
    duplicates: int = 0
    order: int = 0
    exclusivity: int = 0
    routing: int = 0


@dataclass
class Synth:
    """What was generated: files, event count, and the violations injected."""

    directory: Path
    events: int = 0
    messages: int = 0
    files: list[Path] = field(default_factory=list)
    injected: Inject = field(default_factory=Inject)


class _Writer:
    """One writer's segment file; lines are buffered, then sorted by (ts, n) on close."""

    def __init__(self, directory: Path, name: str, node: str, boot: int) -> None:
        self.path = directory / f"{name}-{boot}-0.jsonl"
        self.node = _E(node)
        self.rows: list[tuple[int, str]] = []
        self.n = 0

    def add(self, ts: int, body: str) -> None:
        self.n += 1
        self.rows.append((ts, f'{{"ts_ns":{ts},"node":{self.node},{body},"n":{self.n}}}\n'))

    def close(self) -> int:
        self.rows.sort(key=lambda r: r[0])  # stable: equal ts keep their n order
        # Renumber n in time order so the writer's sequence follows its clock.
        with self.path.open("w") as f:
            for i, (_, line) in enumerate(self.rows, 1):
                head, _, _ = line.rpartition(',"n":')
                f.write(f'{head},"n":{i}}}\n')
        return len(self.rows)


def generate(
    directory: str | Path,
    *,
    messages: int = 10_000,
    groups: int = 100,
    nodes: int = 3,
    consumers_per_node: int = 2,
    groups_per_producer: int = 10,
    releases: int = 0,
    failover: bool = False,
    client_events: bool = True,
    inject: Inject | None = None,
    seed: int = 1,
    start_ns: int = 1_700_000_000_000_000_000,
) -> Synth:
    """Write a history into `directory` (created); returns what was written."""
    inject = inject or Inject()
    rng = random.Random(seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    node_ids = [f"n{i + 1}" for i in range(nodes)]
    boot = start_ns - 1_000_000_000
    writers = {n: _Writer(out, n, n, boot) for n in node_ids}
    urls = {n: f"127.0.0.1:{7600 + i + 1}" for i, n in enumerate(node_ids)}
    consumers = {n: [f"c-{n}-{k}" for k in range(consumers_per_node)] for n in node_ids}
    n_producers = max(1, -(-groups // groups_per_producer))
    producer_ids = [f"client-p{k:04d}.p1" for k in range(n_producers)]
    client_writers: dict[str, _Writer] = {}
    if client_events:
        for k in range(n_producers):
            client_writers[f"p{k}"] = _Writer(
                out, f"client-p{k:04d}", urls[node_ids[k % nodes]], boot
            )
        for n in node_ids:
            client_writers[f"c{n}"] = _Writer(out, f"client-c{n}", urls[n], boot)

    group_names = [f"g{g:06d}" for g in range(groups)]
    target = {g: node_ids[g % nodes] for g in range(groups)}
    owner = {g: consumers[target[g]][(g // nodes) % consumers_per_node] for g in range(groups)}
    epoch = dict.fromkeys(range(groups), 1)
    seq = [0] * groups
    mid_n = [0] * n_producers
    survivors = node_ids[:-1] if failover and nodes > 1 else node_ids
    fail_at = messages * 2 // 3 if failover and nodes > 1 else -1
    pause_ns = 2_000_000_000

    # Which messages carry an injection: chosen up front, far apart, never the same group twice.
    total = messages
    candidates = list(range(groups * 2, total - groups * 2))  # every group has neighbours
    if failover:
        candidates = [i for i in candidates if abs(i - fail_at) > groups * 3]
    wanted = (
        inject.lost + inject.duplicates + inject.order + inject.exclusivity + releases
    ) + inject.routing
    if wanted > len(candidates) or wanted > groups:
        raise ValueError("too many injections for this history size")
    picked_groups: set[int] = set()
    picks: list[int] = []
    for i in rng.sample(candidates, len(candidates)):
        if i % groups not in picked_groups:
            picked_groups.add(i % groups)
            picks.append(i)
        if len(picks) == wanted:
            break
    kinds: dict[int, str] = {}
    cursor = 0
    for name, count in (
        ("lost", inject.lost),
        ("duplicates", inject.duplicates),
        ("order", inject.order),
        ("exclusivity", inject.exclusivity),
        ("release", releases),
        ("routing", inject.routing),
    ):
        for i in picks[cursor : cursor + count]:
            kinds[i] = name
        cursor += count
    last_delivery: dict[int, int] = {}  # group -> delivery time of its previous message

    t = start_ns
    for i in range(total):
        g = i % groups
        if i == fail_at:
            t += pause_ns
            dead = node_ids[-1]
            for h in range(groups):
                if target[h] == dead:
                    target[h] = survivors[h % len(survivors)]
                    owner[h] = consumers[target[h]][h % consumers_per_node]
                    epoch[h] = 2
        kind = kinds.get(i)
        seq[g] += 1
        s = seq[g]
        p = g // groups_per_producer
        mid_n[p] += 1
        mid = f"{producer_ids[p]}/{mid_n[p]}"
        node = target[g]
        w = writers[node]
        grp = group_names[g]
        common = (
            f'"msg_id":{i + 1},"mid":"{mid}","address":"{QUEUE}","queue":"{QUEUE}",'
            f'"group":"{grp}","group_seq":{s},"producer":"{producer_ids[p]}"'
        )
        first = s == 1 or (epoch[g] == 2 and i - fail_at < groups and i >= fail_at)
        routed_node = node
        if kind == "routing":
            routed_node = next(n for n in node_ids if n != node)
        extra = f',"decision_ns":{rng.randint(200_000, 3_000_000)}' if first else ""
        w.add(
            t,
            f'"epoch":{epoch[g]},"kind":"routed","msg_id":{i + 1},"mid":"{mid}",'
            f'"address":"{QUEUE}","queue":"{QUEUE}","group":"{grp}",'
            f'"target":"{QUEUE}@{routed_node}","new_proposal":{"true" if first else "false"}'
            f"{extra}",
        )
        w.add(t + 1_000, f'"kind":"sent",{common}')
        pw = client_writers.get(f"p{p}")
        if pw is not None:
            pw.add(
                t + 2_000,
                f'"kind":"client_sent","msg_id":{i + 1},"mid":"{mid}","address":"{QUEUE}",'
                f'"group":"{grp}","group_seq":{s},"producer":"{producer_ids[p]}"',
            )
        consumer = owner[g]
        cw = client_writers.get(f"c{node}")
        t_deliver, t_ack = t + 3_000, t + 6_000
        if kind == "lost":
            t += STEP_NS
            last_delivery[g] = t_deliver
            continue
        if kind == "exclusivity":
            consumer = next(c for c in consumers[node] if c != owner[g])
            t_deliver = last_delivery[g] + 1  # while the owner still holds the previous one
        if kind == "order":  # acked just after the next message of its group is acked
            t_ack = t + STEP_NS * groups + 7_000
        tail = f',"consumer":"{consumer}"'
        w.add(t_deliver, f'"kind":"delivered",{common}{tail},"delivery_count":1')
        if cw is not None:
            cw.add(
                t_deliver + 500,
                f'"kind":"client_received",{common}{tail},"consumer_name":"{consumer}",'
                f'"delivery_count":1',
            )
        if kind == "release":
            w.add(t_deliver + 600, f'"kind":"released",{common}{tail},"delivery_count":1')
            w.add(t_deliver + 700, f'"kind":"delivered",{common}{tail},"delivery_count":2')
        w.add(t_ack, f'"kind":"acked",{common}{tail}')
        if cw is not None:
            cw.add(
                t_ack - 500, f'"kind":"client_acked",{common}{tail},"consumer_name":"{consumer}"'
            )
        if kind == "duplicates":
            w.add(t_ack + 100, f'"kind":"delivered",{common}{tail},"delivery_count":1')
            w.add(t_ack + 200, f'"kind":"acked",{common}{tail}')
        last_delivery[g] = t_deliver
        t += STEP_NS

    result = Synth(out, messages=total, injected=inject)
    for w in [*writers.values(), *client_writers.values()]:
        result.events += w.close()
        result.files.append(w.path)
    return result
