"""The HTML report of a check: one self-contained file, charts as inline SVG (no scripts, no CDN).

Sections: the verdict, the violations with the events behind each listed one (and the
group's binding removals and moves before it), groups and messages per consumer, messages per
node over time, new-group decision latency, group sizes, what happened in order (failovers,
binding removals and moves, stalls, violations), moved groups, delivery gaps around
failovers, group stalls, and what reading the input turned up.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

COLORS = ("#3b6ea5", "#e07b39", "#4f9d69", "#b8484b", "#8463a8", "#8c6d46", "#d16ba5", "#6b7b8c")
TITLES = {
    "lost": "Lost messages (confirmed to the producer, never acked or rejected by a consumer)",
    "duplicates": "Duplicate deliveries (no release, reject or consumer loss before them)",
    "order": "Order violations (processed before the message before it in its group)",
    "exclusivity": "Exclusivity violations (a second consumer holding a group's messages)",
    "routing": "Routing inconsistencies (a group routed to two queue@node in one binding)",
}
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
.verdict{font-size:1.3em;padding:.6em 1em;border-radius:6px;display:inline-block}
.clean{background:#e3f4e6;color:#1d6b2e}.bad{background:#fbe4e4;color:#9b1c1c}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
td.num{text-align:right}.muted{color:#777}details{margin:.3em 0}summary{cursor:pointer}
code{background:#f4f4f4;padding:0 3px}.grid{display:flex;flex-wrap:wrap;gap:2em}
svg text{font:11px system-ui,sans-serif;fill:#333}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    return _e("-" if value is None else value)


def _bars(labels: list[str], series: dict[str, list[float]], title: str, unit: str = "") -> str:
    """A grouped vertical bar chart: one bar per series for each label."""
    if not labels:
        return f"<p class=muted>{_e(title)}: no data</p>"
    width, height, left, bottom, top = 760, 290, 50, 100, 24
    top_value = max((v for vals in series.values() for v in vals), default=0) or 1
    slot = (width - left - 10) / len(labels)
    bar = max(1.0, slot * 0.8 / max(1, len(series)))
    out = [f'<svg width="{width}" height="{height}" role="img" aria-label="{_e(title)}">']
    out.append(f'<text x="{left}" y="14" font-weight="bold">{_e(title)}</text>')
    plot_h = height - bottom - top
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_num(round(top_value * i / 4, 2))}</text>"
        )
    for s, (name, values) in enumerate(series.items()):
        color = COLORS[s % len(COLORS)]
        for i, v in enumerate(values):
            h = plot_h * v / top_value
            x = left + i * slot + slot * 0.1 + s * bar
            out.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{color}"><title>{_e(labels[i])} {_e(name)}: {_num(v)}{unit}</title></rect>'
            )
    step = max(1, len(labels) // 24)
    for i in range(0, len(labels), step):
        x = left + i * slot + slot / 2
        y = height - bottom + 12
        out.append(
            f'<text x="{x:.1f}" y="{y}" text-anchor="end" '
            f'transform="rotate(-40 {x:.1f} {y})">{_e(labels[i][:30])}</text>'
        )
    if len(series) > 1:
        for s, name in enumerate(series):
            x = width - 150
            out.append(
                f'<rect x="{x}" y="{4 + s * 14}" width="10" height="10" '
                f'fill="{COLORS[s % len(COLORS)]}"/><text x="{x + 14}" y="{13 + s * 14}">'
                f"{_e(name)}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _lines(series: dict[str, list[int]], start_ns: int, bucket_ns: int, title: str) -> str:
    """One polyline per node: deliveries per time bucket."""
    if not series:
        return f"<p class=muted>{_e(title)}: no data</p>"
    width, height, left, bottom, top = 760, 260, 60, 40, 24
    n = max(len(v) for v in series.values())
    top_value = max(max(v) for v in series.values()) or 1
    plot_w, plot_h = width - left - 10, height - bottom - top
    out = [f'<svg width="{width}" height="{height}" role="img" aria-label="{_e(title)}">']
    out.append(f'<text x="{left}" y="14" font-weight="bold">{_e(title)}</text>')
    rate = 1e9 / bucket_ns
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_num(round(top_value * rate * i / 4))}/s</text>"
        )
    span_s = n * bucket_ns / 1e9
    for i in range(5):
        x = left + plot_w * i / 4
        out.append(
            f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle">'
            f"{span_s * i / 4:.1f} s</text>"
        )
    for s, (name, values) in enumerate(sorted(series.items())):
        pts = " ".join(
            f"{left + plot_w * i / max(1, n - 1):.1f},{top + plot_h - plot_h * v / top_value:.1f}"
            for i, v in enumerate(values)
        )
        color = COLORS[s % len(COLORS)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{pts}"/>')
        out.append(
            f'<rect x="{width - 110}" y="{4 + s * 14}" width="10" height="10" '
            f'fill="{color}"/><text x="{width - 96}" y="{13 + s * 14}">{_e(name)}</text>'
        )
    start = datetime.fromtimestamp(start_ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out.append(f'<text x="{left}" y="{height - 4}" class=muted>from {start}</text></svg>')
    return "".join(out)


def _table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            cls = ' class="num"' if isinstance(v, int | float) and not isinstance(v, bool) else ""
            text = ", ".join(map(str, v)) if isinstance(v, list) else _num(v)
            cells.append(f"<td{cls}>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _when(ns: int) -> str:
    """A timestamp an operator can read: UTC, to the millisecond."""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its `*_ns` timestamps written as UTC times (and renamed without `_ns`)."""
    return {
        (k[:-3] if k.endswith("_ns") else k): (_when(v) if k.endswith("_ns") and v else v)
        for k, v in row.items()
    }


VIOLATION_AT = {"order": "settled_ts_ns", "exclusivity": "ts_ns", "duplicates": "ts_ns"}


def _timeline(summary: dict[str, Any]) -> str:
    """Failovers, binding removals and moves, the longest group stalls and the listed
    violations, one line each, in time order."""
    stats = summary.get("stats", {})
    lines = [
        (g["at_ns"], f"{g['what']}; {g.get('groups_stalled', 0)} group(s) stalled across it")
        for g in stats.get("failovers", [])
    ]
    for c in stats.get("binding_changes", []):
        span = f" (until {_when(c['to_ns'])})" if c["to_ns"] - c["from_ns"] >= 1e9 else ""
        if c["kind"] == "unbound":
            text = (
                f"{c['node']} removed {c['events']} binding(s) to {c.get('target')} "
                f"({c.get('reason', 'no reason given')}){span}"
            )
        else:
            text = (
                f"{c['node']} moved {c['events']} message(s) of {c['groups']} group(s) "
                f"to {c.get('target')}, their group's new binding{span}"
            )
        lines.append((c["from_ns"], text))
    lines += [
        (
            s["from_ns"],
            f"group {s['group']} on {s['queue']} stalled {s['gap_ms'] / 1000:.1f} s "
            f"(until {_when(s['to_ns'])}, resumed on {s['resumed_on']})",
        )
        for s in stats.get("stalls", {}).get("longest", [])[:20]
    ]
    for kind, at in VIOLATION_AT.items():
        for ex in summary.get("examples", {}).get(kind, []):
            if ex.get(at):
                where = f"group {ex.get('group')} on {ex.get('queue')}, message {ex.get('key')}"
                lines.append((ex[at], f"VIOLATION ({kind}): {where}"))
    if not lines:
        return "<p class=muted>no failover, binding change or group stall of a second or more</p>"
    items = "".join(f"<li><code>{_when(at)}</code> {_e(text)}</li>" for at, text in sorted(lines))
    return f"<ul>{items}</ul>"


def _violations(summary: dict[str, Any]) -> str:
    out = []
    events = summary.get("example_events", {})
    per_consumer = summary.get("stats", {}).get("per_consumer", [])
    names = {c["consumer"]: c["name"] for c in per_consumer if c.get("name")}

    def who(consumer: Any) -> Any:
        """A consumer as an operator knows it: its name, with the id behind it."""
        name = names.get(consumer)
        return f"{name} ({consumer})" if name and name != consumer else consumer

    for kind, title in TITLES.items():
        count = summary["violations"].get(kind, 0)
        out.append(f"<h3>{_e(title)}: {_num(count)}</h3>")
        examples = summary["examples"].get(kind, [])
        if not examples:
            continue
        if count > len(examples):
            out.append(f"<p class=muted>the first {len(examples)} of {_num(count)}</p>")
        for ex in examples:
            label = ", ".join(
                f"{k}={who(v) if k == 'consumer' else v}" for k, v in ex.items() if v is not None
            )
            if kind == "routing":
                related = events.get(f"group {ex['address']}/{ex['group']}", [])
                related = [e for e in related if e.get("epoch") == ex.get("epoch")]
            else:
                related = []
                for key in (ex.get("before_key"), ex.get("key")):
                    related += events.get(key, []) if key else []
                # What explains it: the group's binding removals and moves before it.
                at = ex.get(VIOLATION_AT.get(kind, "ts_ns")) or 0
                related += [
                    e
                    for e in events.get(f"bindings {ex.get('queue')}/{ex.get('group')}", [])
                    if e.get("ts_ns", 0) <= at
                ]
                related.sort(key=lambda e: (e.get("ts_ns", 0), e.get("n", 0)))
            related = [
                {
                    **e,
                    "time": _when(e["ts_ns"]) if e.get("ts_ns") else None,
                    **({"consumer": who(e["consumer"])} if "consumer" in e else {}),
                }
                for e in related
            ]
            cols = [
                c
                for c in (
                    "time",
                    "node",
                    "epoch",
                    "kind",
                    "key",
                    "msg_id",
                    "queue",
                    "group",
                    "group_seq",
                    "consumer",
                    "delivery_count",
                    "target",
                    "reason",
                )
                if any(c in e for e in related)
            ]
            out.append(
                f"<details><summary><code>{_e(label)}</code> ({len(related)} events)</summary>"
                f"{_table(related[:200], cols)}</details>"
            )
    return "".join(out)


def render(summary: dict[str, Any]) -> str:
    stats = summary.get("stats", {})
    clean = summary["verdict"] == "clean"
    total = sum(summary["violations"].values())
    verdict = (
        "CLEAN: no loss, duplicates, order, exclusivity or routing violations"
        if clean
        else f"VIOLATIONS: {total} found"
    )
    parts = [
        "<!doctype html><html><head><meta charset=utf-8>",
        "<title>pinmq check report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>pinmq check</h1>",
        f"<p class=muted>{_e(summary['input']['directory'])} - "
        f"{_num(summary['input']['files'])} segment files, {_num(summary['input']['lines'])} "
        f"lines, checked in {summary['seconds']} s</p>",
        f'<div class="verdict {"clean" if clean else "bad"}">{_e(verdict)}</div>',
        _table([{k: v for k, v in summary["violations"].items()}]),
    ]
    for line in summary.get("warnings", []) + summary.get("notes", []):
        parts.append(f"<p>&#9888; {_e(line)}</p>")
    parts.append("<h2>Violations</h2>" + _violations(summary))
    if stats:
        consumers = stats.get("per_consumer", [])
        labels = [f"{c.get('name') or c['consumer']}@{c['node']}" for c in consumers]
        parts.append("<h2>Distribution</h2><div class=grid>")
        parts.append(
            _bars(labels, {"groups": [c["groups"] for c in consumers]}, "Groups per consumer")
        )
        parts.append(
            _bars(labels, {"messages": [c["messages"] for c in consumers]}, "Messages per consumer")
        )
        parts.append("</div>")
        parts.append(_table(stats.get("per_node", [])))
        parts.append(_table([{f"skew (max/mean) {k}": v for k, v in stats["skew"].items()}]))
        tl = stats.get("timeline", {})
        if tl.get("series"):
            parts.append(
                _lines(
                    tl["series"],
                    tl["start_ns"],
                    tl["bucket_ns"],
                    "Messages per node over time (first deliveries)",
                )
            )
        lat = stats.get("decision_latency_ms", {})
        parts.append("<h2>New-group decision latency</h2>")
        if lat.get("count"):
            hist = lat["histogram"]
            parts.append(
                _bars(
                    [f"{h['from_ms']}-{h['to_ms']} ms" for h in hist],
                    {"decisions": [h["count"] for h in hist]},
                    "Decision latency histogram",
                )
            )
            parts.append(_table([{k: v for k, v in lat.items() if k != "histogram"}]))
        else:
            parts.append("<p class=muted>no routed events with a decision time</p>")
        sizes = stats.get("group_sizes", {})
        parts.append("<h2>Group sizes</h2>")
        if sizes.get("histogram"):
            hist = sizes["histogram"]
            parts.append(
                _bars(
                    [f"{h['from']}-{h['to']}" for h in hist],
                    {"groups": [h["groups"] for h in hist]},
                    "Groups by number of messages",
                )
            )
        parts.append(_table([{k: v for k, v in sizes.items() if k != "histogram"}]))
        parts.append("<h2>What happened, in order</h2>")
        parts.append(_timeline(summary))
        moved = stats.get("moved")
        if moved:
            parts.append("<h2>Groups moved to a new binding</h2>")
            parts.append(
                f"<p>{_num(moved['messages'])} message(s) of {_num(moved['groups'])} group(s) "
                "were held by a node that found their group bound elsewhere (after it was "
                "away past rebind-absent-after, or a forced move) and moved there; "
                f"{_num(moved['order_changes_accepted'])} order change(s) this caused are "
                "accepted by that configuration and not counted as violations.</p>"
            )
        parts.append("<h2>Delivery gaps around failovers</h2>")
        parts.append(
            "<p class=muted>gap: the longest pause between two deliveries anywhere in the "
            "cluster near the moment; group gap: the longest pause of a group whose pause spans "
            "it (what that group's consumer waited).</p>"
        )
        parts.append(_table([_readable(g) for g in stats.get("failovers", [])]))
        stalls = stats.get("stalls", {})
        parts.append("<h2>Group stalls</h2>")
        parts.append(
            f"<p>{_num(stalls.get('count', 0))} pauses of a second or more between a group's "
            f"deliveries, in {_num(stalls.get('groups', 0))} groups; the longest:</p>"
        )
        parts.append(_table([_readable(s) for s in stalls.get("longest", [])]))
        parts.append("<h2>Events by kind</h2>")
        parts.append(_table([stats.get("events", {})]))
    parts.append(
        "<h2>Input</h2>"
        + _table([{k: v for k, v in summary["input"].items() if not isinstance(v, list | dict)}])
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write(summary: dict[str, Any], directory: str | Path) -> Path:
    """Write `report.html` (and `summary.json`) into `directory`; returns the report's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    path = out / "report.html"
    path.write_text(render(summary))
    return path
