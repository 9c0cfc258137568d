// pinmq console: polls this node's JSON (pinmq/console.py) and draws it. Every value goes
// into the page as text (textContent), never as markup.
"use strict";

const POLL_MS = 1500;
const TIMEOUT_MS = 3000; // a node that takes longer than this has stopped answering
const SEARCH_TIMEOUT_MS = 15000; // a search asks every node (each within 5 s) and the handler

const state = {
  node: location.host, // the node id once it has answered
  failingSince: null, // Date of the first failed poll in a row
  downSince: new Map(), // node id -> Date this page first saw it not linked
  queues: null, // the last /api/queues answer: rates come from two readings
  search: null, // {group, queue} of the group map's search
  searching: false, // a search is on its way: the next poll does not ask again
};

function $(selector) {
  return document.querySelector(selector);
}

function clock(date) {
  return date.toLocaleTimeString("en-GB", { hour12: false });
}

function ago(ms, nowMs) {
  return ms ? `${((nowMs - ms) / 1000).toFixed(1)} s ago` : "-";
}

function owner(id, name) {
  return id ? `${name || "?"} (${id})` : "-";
}

// A table cell: text, with an optional class ("num" right-aligns).
function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = String(text);
  if (className) td.className = className;
  return td;
}

function fill(table, rows) {
  const body = $(`${table} tbody`);
  body.replaceChildren(
    ...rows.map((cells) => {
      const tr = document.createElement("tr");
      tr.append(...cells.map((c) => (c instanceof Node ? c : cell(c))));
      return tr;
    }),
  );
}

function list(selector, items) {
  $(selector).replaceChildren(
    ...items.map((text) => {
      const li = document.createElement("li");
      li.textContent = text;
      return li;
    }),
  );
}

async function getJson(path, timeoutMs = TIMEOUT_MS) {
  const reply = await fetch(path, {
    cache: "no-store",
    credentials: "same-origin",
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (!reply.ok) throw new Error(`${path}: HTTP ${reply.status}`);
  return reply.json();
}

function yesNo(value) {
  if (value === null) return cell("-"); // a standalone node binds no group
  return cell(value ? "yes" : "no", value ? "yes" : "no");
}

function drawCluster(c) {
  state.node = c.node;
  $("#node-name").textContent = `on ${c.node}`;
  const r = c.readiness;
  $("#readiness").textContent =
    `${c.node}: ${r.role}, ${c.ready ? "ready" : "not ready"}` +
    (r.reasons.length ? ` (${r.reasons.join("; ")})` : "");
  list("#problems", c.problems);
  const now = new Date();
  fill(
    "#nodes",
    c.nodes.map((n) => {
      if (n.connected) state.downSince.delete(n.node_id);
      else if (!state.downSince.has(n.node_id)) state.downSince.set(n.node_id, now);
      const link = n.local
        ? cell("this node", "local")
        : n.connected
          ? cell("linked", "up")
          : cell(`not linked since ${clock(state.downSince.get(n.node_id))}`, "down");
      const consumers = Object.entries(n.consumers)
        .filter(([, count]) => count > 0)
        .map(([queue, count]) => `${queue}: ${count}`)
        .join(", ");
      return [n.node_id, n.handler || "-", link, consumers || "-"];
    }),
  );
  fill(
    "#pairs",
    c.ha.map((p) => [
      p.logical,
      p.active,
      cell(p.epoch, "num"),
      p.backup || "-",
      yesNo(p.backup_in_sync),
      p.from_active ? "the active process" : "its last heartbeat",
    ]),
  );
}

function rate(now, before, field, seconds) {
  if (!before || seconds <= 0 || now[field] < before[field]) return "-";
  return ((now[field] - before[field]) / seconds).toFixed(1);
}

function drawQueues(q) {
  const before = state.queues;
  const seconds = before ? (q.now_ms - before.now_ms) / 1000 : 0;
  const previous = new Map((before ? before.queues : []).map((row) => [row.name, row]));
  fill(
    "#queue-table",
    q.queues.map((row) => {
      const last = previous.get(row.name);
      return [
        row.name,
        row.address,
        ...[row.pending, row.in_flight, row.paged, row.consumers, row.groups].map((n) =>
          cell(n, "num"),
        ),
        cell(rate(row, last, "enqueued", seconds), "num"),
        cell(rate(row, last, "settled", seconds), "num"),
      ];
    }),
  );
  state.queues = q;
}

function drawGroups(g) {
  fill(
    "#group-table",
    g.groups.map((row) => [
      row.group,
      `${row.queue}@${row.node}`,
      yesNo(row.bound),
      owner(row.owner, row.owner_name),
      cell(row.pending, "num"),
      ago(row.oldest_pending_ms, g.now_ms),
      cell(row.outstanding, "num"),
      ago(row.last_use_ms, g.now_ms),
    ]),
  );
  $("#search-status").textContent = g.groups.length
    ? `${g.group}: ${g.groups.length} queue instance(s), as of ${clock(new Date(g.now_ms))}`
    : `${g.group}: not found in the cluster`;
  list(
    "#unreachable",
    g.unreachable.map((who) => `not answering: ${who}`),
  );
}

function drawLagging(l) {
  fill(
    "#lagging-groups",
    l.groups.map((row) => [
      row.group,
      row.queue,
      row.owner_name || "-",
      cell(row.pending, "num"),
      ago(row.oldest_pending_ms, l.taken_ms),
      yesNo(row.held),
    ]),
  );
  fill(
    "#lagging-consumers",
    l.consumers.map((c) => [
      owner(c.consumer_id, c.name),
      c.queue,
      cell(c.prefetch, "num"),
      cell(c.unacked, "num"),
      cell(c.groups, "num"),
      c.stalled_ms ? cell(`${(c.stalled_ms / 1000).toFixed(1)} s`, "down") : "-",
    ]),
  );
  $("#lagging-status").textContent = l.taken_ms
    ? `as of ${clock(new Date(l.taken_ms))}`
    : "this process runs no node";
}

function searchPath(search) {
  const query = new URLSearchParams({ group: search.group });
  if (search.queue) query.set("queue", search.queue);
  return `/api/groups?${query}`;
}

function answering() {
  state.failingSince = null;
  $("#banner").hidden = true;
  $("#status").textContent = `updated ${clock(new Date())}, every ${POLL_MS / 1000} s`;
}

function failing(err) {
  if (!state.failingSince) state.failingSince = new Date();
  const banner = $("#banner");
  banner.textContent =
    `node ${state.node} stopped answering since ${clock(state.failingSince)} (${err.message})`;
  banner.hidden = false;
}

// The node's own state: whether it answers these decides the banner.
async function poll() {
  try {
    const [cluster, queues, lagging] = await Promise.all([
      getJson("/api/cluster"),
      getJson("/api/queues"),
      getJson("/api/lagging"),
    ]);
    drawCluster(cluster);
    drawQueues(queues);
    drawLagging(lagging);
    answering();
  } catch (err) {
    failing(err);
  }
  if (state.search && !state.searching) refreshSearch(state.search);
  setTimeout(poll, POLL_MS);
}

// The group map asks the whole cluster: slower, and its failure is the search's, not the
// node's (a node it asks may be away; the answer says so).
async function refreshSearch(asked) {
  state.searching = true;
  try {
    const found = await getJson(searchPath(asked), SEARCH_TIMEOUT_MS);
    if (asked === state.search) drawGroups(found);
  } catch (err) {
    if (asked === state.search) {
      $("#search-status").textContent = `${asked.group}: no answer (${err.message})`;
    }
  } finally {
    state.searching = false;
  }
}

function search(event) {
  event.preventDefault();
  const group = $("#group").value.trim();
  if (!group) return;
  state.search = { group, queue: $("#queue").value.trim() };
  $("#search-status").textContent = `searching ${group}…`;
  refreshSearch(state.search);
}

document.addEventListener("DOMContentLoaded", () => {
  $("#search").addEventListener("submit", search);
  poll();
});
