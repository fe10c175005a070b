// The gateway's dashboard: one page, hash routes, plain DOM (no framework, no build step).
// Every value from the node goes in through textContent (h() below), never as HTML.
// It reads and changes the node through /api/v5 with the session cookie; every change
// sends the session's CSRF token in X-CSRF-Token. Lists are paged by the server.
"use strict";

const state = { session: null, timer: null, trace: null, page: "" };
const PAGE_SIZE = 20;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function toast(text, bad) {
  const t = document.getElementById("toast");
  t.textContent = text; t.className = bad ? "bad" : ""; t.hidden = false;
  clearTimeout(toast.timer); toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && state.session) headers["X-CSRF-Token"] = state.session.csrf;
  const r = await fetch(path, { method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401 && !path.startsWith("/dashboard/api/")) { state.session = null; route(); throw new Error("session ended: log in again"); }
  if (r.status === 204) return null;
  const data = await r.json().catch(() => ({}));
  if (!r.ok) { const e = new Error(data.message || `${r.status} ${r.statusText}`); e.status = r.status; e.data = data; throw e; }
  return data;
}

const fmt = {
  n: (x) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en")),
  rate: (x) => (x === null || x === undefined ? "–" : (x >= 100 ? x.toFixed(0) : x.toFixed(1))),
  time: (s) => (s ? new Date(s * 1000).toLocaleString() : "–"),
  dur: (s) => { s = Math.floor(s || 0); const d = Math.floor(s / 86400), hh = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    return d ? `${d}d ${hh}h` : hh ? `${hh}h ${m}m` : `${m}m ${s % 60}s`; },
  bytes: (b) => (b === null || b === undefined ? "–" : b > 1 << 20 ? `${(b / (1 << 20)).toFixed(1)} MiB` : `${(b / 1024).toFixed(0)} KiB`),
};

function card(label, value, sub, id) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label),
    h("div", { class: "value", id: id ? `v-${id}` : null }, value), sub ? h("div", { class: "sub" }, sub) : null);
}

function table(columns, rows, onclick) {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.label)));
  const body = rows.length ? rows.map((r) => h("tr", { class: onclick ? "clickable" : null, onclick: onclick ? () => onclick(r) : null },
    columns.map((c) => h("td", { class: c.num ? "num" : null }, c.render ? c.render(r) : fmt_cell(r[c.key])))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "Nothing here."))];
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}
function fmt_cell(v) { return v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v); }

function badge(text, kind) { return h("span", { class: `badge ${kind || ""}` }, text); }

// A server-paged list: fetch(page) -> {data, meta}; draws the table and the pager.
function pagedList(container, load, columns, onclick) {
  let page = 1;
  async function draw() {
    let res;
    try { res = await load(page); } catch (e) { container.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    const m = res.meta || { page, count: res.data.length, hasnext: false };
    const pages = Math.max(1, Math.ceil(m.count / (m.limit || PAGE_SIZE)));
    container.replaceChildren(table(columns, res.data, onclick),
      h("div", { class: "pager" },
        h("button", { disabled: page <= 1, onclick: () => { page--; draw(); } }, "‹ Prev"),
        h("span", { class: "muted" }, `page ${m.page} of ${pages} · ${fmt.n(m.count)} in all`),
        h("button", { disabled: !m.hasnext, onclick: () => { page++; draw(); } }, "Next ›")));
  }
  return { draw, reset() { page = 1; return draw(); } };
}

function every(ms, fn) { fn(); state.timer = setInterval(fn, ms); }
function isAdmin() { return state.session && state.session.role === "administrator"; }
function q(params) { return new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== undefined)).toString(); }

// ---------------------------------------------------------------- login and setup

function loginPage(main, setupToken, setupRequired) {
  const err = h("div", { class: "error", id: "login-error" });
  if (setupToken) {
    const user = h("input", { id: "setup-user", value: "admin", autocomplete: "username" });
    const pw = h("input", { id: "setup-password", type: "password", autocomplete: "new-password", minlength: "8" });
    const pw2 = h("input", { id: "setup-password2", type: "password", autocomplete: "new-password" });
    main.replaceChildren(h("form", { class: "login", onsubmit: async (ev) => {
      ev.preventDefault(); err.textContent = "";
      if (pw.value !== pw2.value) { err.textContent = "The passwords differ."; return; }
      try {
        state.session = await api("POST", "/dashboard/api/setup", { token: setupToken, username: user.value, password: pw.value });
        location.hash = "#/overview";
      } catch (e) { err.textContent = e.message; }
    } }, h("h1", {}, "Set up the dashboard"),
      h("p", { class: "muted" }, "Choose the administrator's name and password. The setup link works once."),
      h("label", { for: "setup-user" }, "Administrator"), user,
      h("label", { for: "setup-password" }, "New password (8 characters or more)"), pw,
      h("label", { for: "setup-password2" }, "Repeat the password"), pw2,
      h("button", { class: "primary", type: "submit", id: "setup-submit" }, "Create administrator"), err));
    return;
  }
  const user = h("input", { id: "login-user", autocomplete: "username" });
  const pw = h("input", { id: "login-password", type: "password", autocomplete: "current-password" });
  main.replaceChildren(h("form", { class: "login", onsubmit: async (ev) => {
    ev.preventDefault(); err.textContent = "";
    try { state.session = await api("POST", "/dashboard/api/login", { username: user.value, password: pw.value }); route(); }
    catch (e) { err.textContent = e.message; }
  } }, h("h1", {}, "Log in"),
    setupRequired ? h("p", { class: "muted" }, "No administrator yet: open the one-time setup link from gatewayd's log, or run `gatewayctl admin setup`.") : null,
    h("label", { for: "login-user" }, "User"), user,
    h("label", { for: "login-password" }, "Password"), pw,
    h("button", { class: "primary", type: "submit", id: "login-submit" }, "Log in"), err));
}

// ---------------------------------------------------------------- overview

function drawChart(canvas, samples) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, hgt = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = hgt * dpr;
  const g = canvas.getContext("2d"); g.scale(dpr, dpr); g.clearRect(0, 0, w, hgt);
  const pad = { l: 44, r: 10, t: 10, b: 22 };
  const series = { in: [], out: [], drop: [] };
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i], dt = b.t - a.t || 1;
    series.in.push([b.t, Math.max(0, (b.received - a.received) / dt)]);
    series.out.push([b.t, Math.max(0, (b.sent - a.sent) / dt)]);
    series.drop.push([b.t, Math.max(0, (b.dropped - a.dropped) / dt)]);
  }
  // the last hour, or less while the node has been up for less (a minute at least)
  const now = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  const span = Math.min(3600, Math.max(60, samples.length ? now - samples[0].t : 60)), t0 = now - span;
  const max = Math.max(1, ...series.in.map((p) => p[1]), ...series.out.map((p) => p[1]), ...series.drop.map((p) => p[1]));
  const x = (t) => pad.l + (w - pad.l - pad.r) * (t - t0) / span, y = (v) => hgt - pad.b - (hgt - pad.t - pad.b) * v / max;
  g.strokeStyle = "#e3e6eb"; g.fillStyle = "#6b7280"; g.font = "11px system-ui"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) { const v = max * i / 4; g.beginPath(); g.moveTo(pad.l, y(v)); g.lineTo(w - pad.r, y(v)); g.stroke(); g.fillText(fmt.rate(v), 4, y(v) + 4); }
  for (let i = 0; i <= 4; i++) {
    const ago = span * (4 - i) / 4, label = i === 4 ? "now" : ago >= 120 ? `-${Math.round(ago / 60)} min` : `-${Math.round(ago)} s`;
    g.fillText(label, Math.min(w - pad.r - 28, x(now - ago) - 14), hgt - 6);
  }
  const colors = { in: "#0b6bcb", out: "#15803d", drop: "#b91c1c" };
  for (const [name, pts] of Object.entries(series)) {
    g.strokeStyle = colors[name]; g.lineWidth = 2; g.beginPath();
    pts.forEach(([t, v], i) => (i ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
    g.stroke();
  }
}

function overviewPage(main) {
  const cards = h("div", { class: "cards" },
    card("Connections", "–", null, "connections"), card("Messages in /s", "–", null, "rate-in"),
    card("Messages out /s", "–", null, "rate-out"), card("Dropped /s", "–", null, "rate-drop"),
    card("Messages in", "–", "since start", "received"), card("Messages out", "–", "since start", "sent"),
    card("Dropped", "–", "since start", "dropped"), card("Subscriptions", "–", null, "subscriptions"),
    card("Retained", "–", null, "retained"), card("Sessions", "–", null, "sessions"));
  const canvas = h("canvas", { id: "chart" });
  const protocols = h("div", {}), health = h("div", {}), alarms = h("div", {});
  main.replaceChildren(h("h1", {}, "Overview"), cards,
    h("div", { class: "panel" }, h("h2", { class: "first" }, "Messages per second (up to the last hour)"),
      h("div", { class: "legend" }, h("span", {}, h("i", { class: "sw-in" }), "in"),
        h("span", {}, h("i", { class: "sw-out" }), "out"), h("span", {}, h("i", { class: "sw-drop" }), "dropped")), canvas),
    h("div", { class: "row" }, h("div", { class: "panel" }, h("h2", { class: "first" }, "Connections by protocol"), protocols),
      h("div", { class: "panel" }, h("h2", { class: "first" }, "Node health"), health),
      h("div", { class: "panel" }, h("h2", { class: "first" }, "Active alarms"), alarms)));
  let last = null;
  every(2000, async () => {
    const [s, m, hist] = await Promise.all([api("GET", "/api/v5/status"), api("GET", "/api/v5/metrics"), api("GET", "/dashboard/api/history")]);
    const now = performance.now() / 1000, cur = { t: now, in: m["messages.received"] || 0, out: m["messages.sent"] || 0, drop: m["messages.dropped"] || 0 };
    const set = (id, v) => { const el = document.getElementById(`v-${id}`); if (el) el.textContent = v; };
    set("connections", fmt.n(s.connections.count));
    set("received", fmt.n(cur.in)); set("sent", fmt.n(cur.out)); set("dropped", fmt.n(cur.drop));
    const hs = hist.samples || [];
    if (last) { const dt = now - last.t || 1;
      set("rate-in", fmt.rate((cur.in - last.in) / dt)); set("rate-out", fmt.rate((cur.out - last.out) / dt)); set("rate-drop", fmt.rate((cur.drop - last.drop) / dt)); }
    else if (hs.length >= 2) { // the first look: the rate over the last sampling interval
      const a = hs[hs.length - 2], b = hs[hs.length - 1], dt = b.t - a.t || 1;
      set("rate-in", fmt.rate((b.received - a.received) / dt)); set("rate-out", fmt.rate((b.sent - a.sent) / dt)); set("rate-drop", fmt.rate((b.dropped - a.dropped) / dt)); }
    last = cur;
    set("subscriptions", fmt.n(s.subscriptions)); set("retained", fmt.n(s.retained)); set("sessions", fmt.n(s.sessions));
    const by = s.connections.by_protocol || {};
    protocols.replaceChildren(table([{ label: "Front-end", key: "name" }, { label: "Status", render: (r) => badge(r.status === "running" ? "on" : "off", r.status === "running" ? "ok" : "") },
      { label: "Clients", num: true, render: (r) => fmt.n(r.name === "mqtt" ? (by.mqtt || 0) + (by.ws || 0) : by[r.name] || 0) }], s.gateways || []));
    const n = s.limits || {}, store = s.store;
    health.replaceChildren(h("dl", { class: "kv" },
      h("dt", {}, "Node"), h("dd", {}, s.node), h("dt", {}, "Status"), h("dd", {}, badge(s.status, s.status === "running" ? "ok" : "warn")),
      h("dt", {}, "Version"), h("dd", {}, s.version), h("dt", {}, "Uptime"), h("dd", {}, fmt.dur(s.uptime)),
      h("dt", {}, "Cluster"), h("dd", {}, s.cluster && s.cluster.enabled ? `${s.cluster.members.length} members` : "standalone"),
      h("dt", {}, "Open-file limit"), h("dd", {}, n.nofile ? fmt.n(n.nofile.soft) : "–"),
      h("dt", {}, "Store"), h("dd", {}, store ? (store.state || store.status || "ok") : (s.durability && s.durability.enabled ? "on" : "memory only"))));
    alarms.replaceChildren(s.alarms.length ? h("ul", {}, s.alarms.map((a) => h("li", {}, badge(a.name, "bad"), " ", a.message))) : h("p", { class: "muted" }, "No active alarms."));
    drawChart(canvas, hist.samples || []);
  });
}

// ---------------------------------------------------------------- clients

function clientsPage(main, id) {
  if (id) return clientDetail(main, decodeURIComponent(id));
  const search = h("input", { id: "client-search", placeholder: "client id contains…" });
  const user = h("input", { placeholder: "user name contains…" });
  const list = h("div", { id: "client-list" });
  const p = pagedList(list, (page) => api("GET", `/api/v5/clients?${q({ page, limit: PAGE_SIZE, like_clientid: search.value, like_username: user.value })}`), [
    { label: "Client id", render: (r) => h("code", {}, r.clientid) }, { label: "User", key: "username" },
    { label: "State", render: (r) => badge(r.connected ? "connected" : "offline", r.connected ? "ok" : "") },
    { label: "Protocol", render: (r) => `${r.proto_name || r.protocol || "–"}${r.proto_ver ? " " + r.proto_ver : ""}` },
    { label: "Address", render: (r) => (r.ip_address ? `${r.ip_address}:${r.port}` : "–") },
    { label: "Subs", num: true, key: "subscriptions_cnt" }, { label: "Queue", num: true, key: "mqueue_len" },
    { label: "", render: (r) => isAdmin() && r.connected ? h("button", { class: "danger", "data-kick": r.clientid, onclick: (ev) => { ev.stopPropagation(); kick(r.clientid, p); } }, "Kick") : "" },
  ], (r) => { location.hash = `#/clients/${encodeURIComponent(r.clientid)}`; });
  main.replaceChildren(h("h1", {}, "Clients"), h("div", { class: "toolbar" }, search, user,
    h("button", { onclick: () => p.reset() }, "Search")), list);
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") p.reset(); });
  every(5000, () => p.draw());
}

async function kick(clientid, list) {
  if (!confirm(`Disconnect ${clientid}?`)) return;
  try { await api("DELETE", `/api/v5/clients/${encodeURIComponent(clientid)}`); toast(`${clientid} kicked`); if (list) list.draw(); }
  catch (e) { toast(e.message, true); }
}

async function clientDetail(main, clientid) {
  const c = await api("GET", `/api/v5/clients/${encodeURIComponent(clientid)}`);
  const subs = await api("GET", `/api/v5/clients/${encodeURIComponent(clientid)}/subscriptions`);
  main.replaceChildren(h("h1", {}, h("a", { href: "#/clients" }, "Clients"), " / ", clientid),
    h("div", { class: "toolbar" }, isAdmin() && c.connected ? h("button", { class: "danger", onclick: async () => { await kick(clientid); location.hash = "#/clients"; } }, "Kick") : null),
    h("div", { class: "row" }, h("div", { class: "panel" }, h("dl", { class: "kv" }, Object.entries(c).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, k.endsWith("_at") && v ? fmt.time(v) : fmt_cell(v))]))),
      h("div", { class: "panel" }, h("h2", { class: "first" }, "Subscriptions"), table([{ label: "Topic", key: "topic" }, { label: "QoS", key: "qos", num: true }], subs))));
}

// ---------------------------------------------------------------- subscriptions, retained

function subscriptionsPage(main) {
  const cid = h("input", { placeholder: "client id" }), topic = h("input", { placeholder: "topic filter" });
  const list = h("div", {});
  const p = pagedList(list, (page) => api("GET", `/api/v5/subscriptions?${q({ page, limit: PAGE_SIZE, clientid: cid.value, topic: topic.value })}`),
    [{ label: "Client id", render: (r) => h("code", {}, r.clientid) }, { label: "Topic", render: (r) => h("code", {}, r.topic) }, { label: "QoS", key: "qos", num: true }, { label: "Node", key: "node" }]);
  main.replaceChildren(h("h1", {}, "Subscriptions"), h("div", { class: "toolbar" }, cid, topic, h("button", { onclick: () => p.reset() }, "Filter")), list);
  p.draw();
}

function retainedPage(main) {
  const topic = h("input", { id: "retained-filter", placeholder: "topic filter, e.g. sensors/#" });
  const list = h("div", { id: "retained-list" });
  const p = pagedList(list, (page) => api("GET", `/api/v5/retainer/messages?${q({ page, limit: PAGE_SIZE, topic: topic.value })}`), [
    { label: "Topic", render: (r) => h("code", {}, r.topic) }, { label: "QoS", key: "qos", num: true },
    { label: "Size", num: true, render: (r) => `${fmt.n(r.payload_size)} B` }, { label: "From", key: "from_clientid" },
    { label: "Published", render: (r) => fmt.time(r.publish_at) },
    { label: "", render: (r) => h("span", {}, h("button", { onclick: (ev) => { ev.stopPropagation(); showRetained(r.topic); } }, "Show"), " ",
      isAdmin() ? h("button", { class: "danger", "data-delete": r.topic, onclick: async (ev) => { ev.stopPropagation();
        if (!confirm(`Delete the retained message on ${r.topic}?`)) return;
        try { await api("DELETE", `/api/v5/retainer/messages/${encodeURIComponent(r.topic)}`); toast(`deleted ${r.topic}`); p.draw(); } catch (e) { toast(e.message, true); } } }, "Delete") : null) },
  ]);
  const shown = h("div", { id: "retained-payload" });
  async function showRetained(t) {
    const m = await api("GET", `/api/v5/retainer/messages/${encodeURIComponent(t)}`);
    let text; try { text = new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(atob(m.payload), (ch) => ch.charCodeAt(0))); } catch { text = `(binary) ${m.payload}`; }
    shown.replaceChildren(h("div", { class: "panel" }, h("h2", { class: "first" }, t), h("pre", { class: "mono" }, text)));
  }
  main.replaceChildren(h("h1", {}, "Retained messages"), h("div", { class: "toolbar" }, topic, h("button", { onclick: () => p.reset() }, "Filter")), list, shown);
  every(5000, () => p.draw());
}

// ---------------------------------------------------------------- listeners, alarms

function listenersPage(main) {
  const box = h("div", {});
  main.replaceChildren(h("h1", {}, "Listeners"), box);
  every(5000, async () => {
    const ls = await api("GET", "/api/v5/listeners");
    box.replaceChildren(table([{ label: "Id", render: (r) => h("code", {}, r.id) }, { label: "Protocol", key: "protocol" },
      { label: "Bind", key: "bind" }, { label: "Addresses", render: (r) => (r.addresses || []).join(", ") || "–" },
      { label: "Status", render: (r) => badge(r.status, r.status === "running" ? "ok" : "warn") },
      { label: "Connections", num: true, render: (r) => fmt.n(r.current_connections) }, { label: "Max", num: true, render: (r) => fmt.n(r.max_connections) },
      { label: "Refused", num: true, render: (r) => fmt.n(r.refused_connections) }], ls));
  });
}

function alarmsPage(main) {
  const active = h("div", {}), history = h("div", {});
  const cols = [{ label: "Name", render: (r) => badge(r.name, r.activated ? "bad" : "") }, { label: "Message", key: "message" },
    { label: "Since", render: (r) => fmt.time(r.activated_at) }, { label: "Cleared", render: (r) => fmt.time(r.deactivated_at) }];
  const pa = pagedList(active, (page) => api("GET", `/api/v5/alarms?${q({ page, limit: PAGE_SIZE })}`), cols);
  const ph = pagedList(history, (page) => api("GET", `/api/v5/alarms?${q({ page, limit: PAGE_SIZE, activated: "false" })}`), cols);
  main.replaceChildren(h("h1", {}, "Alarms"), h("h2", {}, "Active"), active, h("h2", {}, "Cleared"), history);
  every(5000, () => { pa.draw(); ph.draw(); });
}

// ---------------------------------------------------------------- users and bans

function usersPage(main) {
  const accounts = h("div", {}), mqttUsers = h("div", {}), bans = h("div", {});
  const pu = pagedList(mqttUsers, (page) => api("GET", `/api/v5/users?${q({ page, limit: PAGE_SIZE })}`),
    [{ label: "User", render: (r) => r.user_id || r.username }, { label: "Superuser", render: (r) => (r.is_superuser ? "yes" : "no") }]);
  const pb = pagedList(bans, (page) => api("GET", `/api/v5/banned?${q({ page, limit: PAGE_SIZE })}`),
    [{ label: "As", key: "as" }, { label: "Who", key: "who" }, { label: "Reason", key: "reason" }, { label: "Until", render: (r) => fmt.time(r.until) },
     { label: "", render: (r) => isAdmin() ? h("button", { class: "danger", onclick: async () => { await api("DELETE", `/api/v5/banned/${r.as}/${encodeURIComponent(r.who)}`); pb.draw(); } }, "Lift") : "" }]);
  async function drawAccounts() {
    const res = await api("GET", "/dashboard/api/accounts");
    const name = h("input", { placeholder: "name" }), pw = h("input", { type: "password", placeholder: "password (8+)" });
    const role = h("select", {}, h("option", { value: "viewer" }, "viewer"), h("option", { value: "administrator" }, "administrator"));
    accounts.replaceChildren(table([{ label: "Name", key: "username" }, { label: "Role", key: "role" },
      { label: "", render: (r) => isAdmin() && r.username !== state.session.username ? h("button", { class: "danger", onclick: async () => {
        try { await api("DELETE", `/dashboard/api/accounts/${encodeURIComponent(r.username)}`); drawAccounts(); } catch (e) { toast(e.message, true); } } }, "Delete") : "" }], res.data),
      isAdmin() ? h("div", { class: "toolbar gap-top" }, name, pw, role, h("button", { onclick: async () => {
        try { await api("POST", "/dashboard/api/accounts", { username: name.value, password: pw.value, role: role.value }); toast(`${name.value} saved`); drawAccounts(); } catch (e) { toast(e.message, true); } } }, "Add or set password")) : null);
  }
  const banWho = h("input", { placeholder: "client id" });
  main.replaceChildren(h("h1", {}, "Users & bans"), h("h2", {}, "Dashboard accounts"), accounts,
    h("h2", {}, "MQTT users (built-in database)"), mqttUsers, h("h2", {}, "Banned clients"),
    isAdmin() ? h("div", { class: "toolbar" }, banWho, h("button", { onclick: async () => {
      try { await api("POST", "/api/v5/banned", { as: "clientid", who: banWho.value }); pb.draw(); } catch (e) { toast(e.message, true); } } }, "Ban client id")) : null, bans);
  drawAccounts(); pu.draw().catch(() => {}); pb.draw();
}

// ---------------------------------------------------------------- rules, bridges, cluster

function rulesPage(main) {
  const box = h("div", {}), sql = h("textarea", { id: "rule-sql" }, 'SELECT payload.temp AS t FROM "sensors/#" WHERE payload.temp > 20');
  const ctx = h("textarea", { id: "rule-context" }, '{"topic": "sensors/1", "payload": "{\\"temp\\": 25}"}');
  const out = h("pre", { class: "mono", id: "rule-output" });
  async function draw() {
    let res;
    try { res = await api("GET", "/api/v5/rules"); } catch (e) { box.replaceChildren(h("p", { class: "muted" }, e.message)); return; }
    const rows = res.data || res;
    box.replaceChildren(table([{ label: "Id", render: (r) => h("code", {}, r.id) }, { label: "SQL", render: (r) => h("code", {}, r.sql) },
      { label: "Enabled", render: (r) => badge(r.enable ? "on" : "off", r.enable ? "ok" : "") },
      { label: "Matched", num: true, render: (r) => fmt.n((r.metrics || {}).matched) }, { label: "Passed", num: true, render: (r) => fmt.n((r.metrics || {}).passed) },
      { label: "Failed", num: true, render: (r) => fmt.n((r.metrics || {}).failed) },
      { label: "", render: (r) => isAdmin() ? h("button", { "data-toggle": r.id, onclick: async () => { try { await api("PUT", `/api/v5/rules/${encodeURIComponent(r.id)}`, { enable: !r.enable }); draw(); } catch (e) { toast(e.message, true); } } }, r.enable ? "Disable" : "Enable") : "" }], rows));
  }
  main.replaceChildren(h("h1", {}, "Rules"), box, h("h2", {}, "Test SQL"), h("div", { class: "panel" }, sql, h("p", { class: "muted" }, "Context (JSON):"), ctx,
    h("div", { class: "toolbar gap-top" }, h("button", { class: "primary", id: "rule-test", onclick: async () => {
      try { out.textContent = JSON.stringify(await api("POST", "/api/v5/rule_test", { sql: sql.value, context: JSON.parse(ctx.value) }), null, 2); }
      catch (e) { out.textContent = e.message; } } }, "Test")), out));
  every(5000, draw);
}

function bridgesPage(main) {
  const box = h("div", {});
  main.replaceChildren(h("h1", {}, "Bridges"), box);
  every(5000, async () => {
    const b = await api("GET", "/api/v5/bridges");
    box.replaceChildren(!b.enabled && !(b.bridges || []).length ? h("p", { class: "muted" }, "No bridge configured ([bridges.mqtt.<name>]).") :
      table([{ label: "Name", key: "name" }, { label: "Upstream", key: "upstream" }, { label: "Status", render: (r) => badge(r.status, r.connected ? "ok" : "warn") },
        { label: "Outbox", num: true, render: (r) => fmt.n(r.queue_len) }, { label: "Outbox bytes", num: true, render: (r) => fmt.bytes(r.queue_bytes) },
        { label: "Oldest", num: true, render: (r) => (r.oldest_age ? fmt.dur(r.oldest_age) : "–") }, { label: "Forwarded", num: true, render: (r) => fmt.n(r.forwarded) },
        { label: "Dropped", num: true, render: (r) => fmt.n(r.dropped) }, { label: "Last error", key: "last_error" }], b.bridges || []));
  });
}

function clusterPage(main) {
  const box = h("div", {});
  main.replaceChildren(h("h1", {}, "Cluster"), box);
  every(5000, async () => {
    const c = await api("GET", "/api/v5/cluster");
    box.replaceChildren(h("p", { class: "muted" }, c.enabled ? `cluster ${c.name || ""}, this node ${c.self}` : "Standalone node (no [cluster] configured)."),
      table([{ label: "Node", render: (r) => `${r.node}${r.self ? " (this node)" : ""}` }, { label: "Role", key: "role" },
        { label: "Status", render: (r) => badge(r.status, r.status === "running" || r.status === "up" ? "ok" : "bad") },
        { label: "Version", key: "version" }, { label: "Connections", num: true, render: (r) => fmt.n(r.connections) },
        { label: "Routes", num: true, render: (r) => fmt.n(r.routes) },
        { label: "Links", render: (r) => r.links ? h("span", {}, Object.entries(r.links).map(([k, v]) => badge(`${k.replace("_", " ")} ${v}`, v === "up" ? "ok" : "bad"))) : "–" },
        { label: "RTT", num: true, render: (r) => (r.rtt_ms === null || r.rtt_ms === undefined ? "–" : `${r.rtt_ms} ms`) },
        { label: "Last error", key: "last_error" }], c.members || []));
  });
}

// ---------------------------------------------------------------- trace

function tracePage(main) {
  const kind = h("select", { id: "trace-kind" }, h("option", { value: "clientid" }, "client id"), h("option", { value: "topic" }, "topic filter"));
  const what = h("input", { id: "trace-what", placeholder: "client id or topic filter" }), out = h("pre", { class: "trace", id: "trace-out" });
  const stop = h("button", { disabled: true, onclick: () => { if (state.trace) state.trace.close(); state.trace = null; stop.disabled = true; out.append("— stopped\n"); } }, "Stop");
  main.replaceChildren(h("h1", {}, "Trace"), h("div", { class: "toolbar" }, kind, what, h("button", { class: "primary", id: "trace-start", onclick: () => {
    if (state.trace) state.trace.close();
    out.textContent = "";
    state.trace = new EventSource(`/api/v5/trace?${q({ [kind.value]: what.value })}`);
    const show = (ev) => { out.append(`${ev.type} ${ev.data}\n`); out.scrollTop = out.scrollHeight; };
    for (const name of ["trace.started", "trace.stopped", "trace.dropped", "client.connected", "client.disconnected", "message.publish", "message.delivered", "message.acked", "message.dropped", "session.subscribed", "session.unsubscribed"]) state.trace.addEventListener(name, show);
    state.trace.onmessage = show; stop.disabled = false;
  } }, "Start"), stop), out);
}

// ---------------------------------------------------------------- routing

const PAGES = { overview: overviewPage, clients: clientsPage, subscriptions: subscriptionsPage, retained: retainedPage,
  listeners: listenersPage, alarms: alarmsPage, users: usersPage, rules: rulesPage, bridges: bridgesPage, cluster: clusterPage, trace: tracePage };

async function route() {
  clearInterval(state.timer); state.timer = null;
  if (state.trace && !location.hash.startsWith("#/trace")) { state.trace.close(); state.trace = null; }
  const main = document.getElementById("main");
  const [, name, arg] = (location.hash || "#/overview").split("/");
  if (!state.session) {
    try { state.session = await api("GET", "/dashboard/api/session"); }
    catch (e) { state.session = null; }
  }
  const nav = document.getElementById("nav"), who = document.getElementById("who"), logout = document.getElementById("logout");
  if (!state.session || !state.session.authenticated && !state.session.csrf) {
    state.session = null; nav.hidden = true; logout.hidden = true; who.textContent = "";
    let setup = false; try { await api("GET", "/dashboard/api/session"); } catch (e) { setup = !!(e.data && e.data.setup_required); }
    return loginPage(main, name === "setup" ? arg : null, setup);
  }
  if (name === "setup") { location.hash = "#/overview"; return; }
  nav.hidden = false; logout.hidden = false;
  who.textContent = `${state.session.username} (${state.session.role})`;
  document.getElementById("node").textContent = state.session.node || "";
  const page = PAGES[name] ? name : "overview";
  for (const a of nav.querySelectorAll("a")) a.classList.toggle("active", a.dataset.page === page);
  try { await PAGES[page](main, arg); } catch (e) { main.replaceChildren(h("p", { class: "error" }, e.message)); }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("logout").addEventListener("click", async () => {
    try { await api("POST", "/dashboard/api/logout"); } catch (e) { /* gone already */ }
    state.session = null; location.hash = "#/overview"; route();
  });
  route();
});
