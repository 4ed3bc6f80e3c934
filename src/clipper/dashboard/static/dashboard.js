// The clipper-serve dashboard: reads /dashboard/events (server-sent events) with fetch, so that
// the admin token can travel in an Authorization header, and draws with plotly.js.
// Everything shown comes from the server as data and is written with textContent.
"use strict";

(() => {
  const TOKEN_KEY = "clipper-dashboard-token";
  const RETRY_MS = 2000;
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];

  const data = { t: [], series: new Map(), capacity: 300, interval: 1, state: null, decisions: [] };
  const MAX_DECISIONS = 200;  // as many as the server keeps
  // An application's row opens or closes by click; until then it is open while it has traffic.
  const chosen = new Map();
  let samples = 0;
  let drawPending = false;
  let tokenRequired = false;

  const $ = (id) => document.getElementById(id);

  function setStatus(kind, text) {
    const el = $("status");
    el.dataset.status = kind;
    el.textContent = text;
  }

  // -- the stream -------------------------------------------------------------------------------
  async function start() {
    try {
      const resp = await fetch("/dashboard/auth", { cache: "no-store" });
      tokenRequired = (await resp.json()).token_required === true;
    } catch (e) {
      setStatus("disconnected", "frontend unreachable, retrying");
      setTimeout(start, RETRY_MS);
      return;
    }
    if (tokenRequired && !sessionStorage.getItem(TOKEN_KEY)) {
      showLogin("");
      return;
    }
    connect();
  }

  function showLogin(message) {
    $("main").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message;
    setStatus("error", "token needed");
    $("token").focus();
  }

  async function connect() {
    const headers = {};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (tokenRequired && token) headers.Authorization = "Bearer " + token;
    setStatus("connecting", "connecting");
    let resp;
    try {
      resp = await fetch("/dashboard/events", { headers, cache: "no-store" });
    } catch (e) {
      retry("frontend unreachable");
      return;
    }
    if (resp.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("That token was refused.");
      return;
    }
    if (!resp.ok || !resp.body) {
      let cause = "HTTP " + resp.status;
      try { cause = (await resp.json()).cause || cause; } catch (e) { /* not JSON */ }
      retry(cause);
      return;
    }
    $("login").hidden = true;
    $("main").hidden = false;
    setStatus("live", "live");
    try {
      await read(resp.body.getReader());
      retry("the stream ended");
    } catch (e) {
      retry("the stream broke");
    }
  }

  function retry(why) {
    setStatus("disconnected", why + "; reconnecting");
    setTimeout(connect, RETRY_MS);
  }

  async function read(reader) {
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        let name = "message";
        let payload = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) payload += line.slice(6);
        }
        if (payload) handle(name, JSON.parse(payload));
      }
    }
  }

  function handle(name, doc) {
    if (name === "snapshot") {
      data.capacity = doc.capacity;
      data.interval = doc.interval_s;
      data.t = doc.history.t;
      data.series = new Map(Object.entries(doc.history.series));
      data.state = doc.state;
      data.decisions = doc.decisions || [];
    } else if (name === "sample") {
      append(doc.t, doc.values);
      data.state = doc.state;
      data.decisions.push(...(doc.decisions || []));
      // Only those inside the plotted window, and never more than the server keeps.
      const first = data.t.length ? data.t[0] : 0;
      data.decisions = data.decisions.filter((d) => d.t >= first).slice(-MAX_DECISIONS);
    } else if (name === "state") {  // a replica connected or left: tables only
      data.state = doc.state;
      renderTables();
      return;
    } else {
      return;
    }
    samples += 1;
    document.body.dataset.samples = String(samples);
    renderTables();
    if (!drawPending) {
      drawPending = true;
      requestAnimationFrame(() => { drawPending = false; drawPlots(); });
    }
  }

  // The same rings as the server's: every series as long as the times, oldest dropped.
  function append(t, values) {
    const n = data.t.length;
    data.t.push(t);
    for (const [key, ring] of data.series) {
      ring.push(key in values ? values[key] : null);
    }
    for (const key of Object.keys(values)) {
      if (!data.series.has(key)) {
        const ring = new Array(n).fill(null);
        ring.push(values[key]);
        data.series.set(key, ring);
      }
    }
    if (data.t.length > data.capacity) {
      const drop = data.t.length - data.capacity;
      data.t.splice(0, drop);
      for (const ring of data.series.values()) ring.splice(0, drop);
    }
    for (const [key, ring] of data.series) {
      if (ring.every((v) => v === null)) data.series.delete(key);
    }
  }

  // -- tables -----------------------------------------------------------------------------------
  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "–" : String(text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function fixed(v, digits) {
    return v === null ? null : Number(v).toFixed(digits);
  }

  function latest(key) {
    const ring = data.series.get(key);
    if (!ring) return null;
    for (let i = ring.length - 1; i >= 0; i--) if (ring[i] !== null) return ring[i];
    return null;
  }

  // The latest value of a series and its age in seconds before the latest sample.
  function latestWithAge(key) {
    const ring = data.series.get(key);
    if (!ring || !data.t.length) return null;
    const last = data.t[data.t.length - 1];
    for (let i = ring.length - 1; i >= 0; i--) {
      if (ring[i] !== null) return { v: ring[i], age: last - data.t[i] };
    }
    return null;
  }

  // A value older than this is stale: no query has been answered since (an idle application).
  function staleAfter() { return Math.max(15, 5 * data.interval); }

  function ago(s) {
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  // A latency cell: the value, greyed with its age when it is stale.
  function latencyCell(tr, key) {
    const found = latestWithAge(key);
    if (!found) return cell(tr, null, "num");
    const text = fixed(found.v, 2) + " ms";
    if (found.age <= staleAfter()) return cell(tr, text, "num");
    const td = cell(tr, `${text} (${ago(found.age)})`, "num stale");
    td.dataset.stale = "yes";
    td.title = "no query answered since: the latest p99 is " + ago(found.age);
    return td;
  }

  // Whether an application answered a query within staleAfter() seconds.
  function active(app) {
    const ring = data.series.get(`app/${app}/qps`);
    if (!ring || !data.t.length) return false;
    const last = data.t[data.t.length - 1];
    for (let i = ring.length - 1; i >= 0 && last - data.t[i] <= staleAfter(); i--) {
      if (ring[i]) return true;
    }
    return false;
  }

  // A fraction over the last minute as a percentage ("–": nothing in it).
  function pct(v) {
    return v === null || v === undefined ? null : (v * 100).toFixed(1) + "%";
  }

  function readiness(td, text, why) {
    const badge = document.createElement("span");
    badge.className = "state " + (text === "ready" || text === "ok" ? "state-ready" : "state-failing");
    badge.textContent = text;
    if (why) td.title = why;  // the reason, on hover
    td.replaceChildren(badge);
  }

  function fill(id, rows) {
    const body = $(id).tBodies[0];
    body.replaceChildren(...rows);
  }

  // Sums over the last minute of samples: each per-second rate times the interval.
  function windowSum(key) {
    const ring = data.series.get(key);
    if (!ring || !data.t.length) return 0;
    const last = data.t[data.t.length - 1];
    let n = 0;
    for (let i = ring.length - 1; i >= 0 && last - data.t[i] <= 60; i--) {
      if (ring[i] !== null) n += ring[i] * data.interval;
    }
    return n;
  }

  // A shadow version's agreement over the last minute (null: nothing compared).
  function agreement(prefix) {
    const rates = data.series.get(prefix + "/shadow_agreement");
    const counts = data.series.get(prefix + "/shadow_compared");
    if (!rates || !counts || !data.t.length) return null;
    const last = data.t[data.t.length - 1];
    let agreed = 0, compared = 0;
    for (let i = rates.length - 1; i >= 0 && last - data.t[i] <= 60; i--) {
      if (rates[i] !== null && counts[i]) { agreed += rates[i] * counts[i]; compared += counts[i]; }
    }
    return compared > 0 ? agreed / compared : null;
  }

  function renderTables() {
    const st = data.state;
    if (!st) return;
    fill("apps", st.apps.map((a) => {
      const tr = document.createElement("tr");
      tr.dataset.app = a.name;
      cell(tr, a.name);
      cell(tr, a.input_type);
      cell(tr, a.slo_ms + " ms", "num");
      cell(tr, a.policy);
      cell(tr, a.models.join(", "));
      cell(tr, fixed(latest(`app/${a.name}/qps`), 1), "num");
      latencyCell(tr, `app/${a.name}/p99_ms`);
      cell(tr, pct(a.error_fraction), "num errors");
      cell(tr, pct(a.default_fraction), "num defaults");
      tr.dataset.ready = a.ready ? "yes" : "no";
      readiness(cell(tr, null), a.ready ? "ready" : "not ready", a.reasons.join("\n"));
      return tr;
    }));
    fill("models", st.models.map((m) => {
      const tr = document.createElement("tr");
      cell(tr, m.name);
      cell(tr, m.version + (m.current ? " (current)" : ""));
      cell(tr, `${m.replicas_ready}/${m.replicas_wanted}` +
        (m.autoscale ? ` (auto ${m.autoscale.min}–${m.autoscale.max})` : ""), "num");
      cell(tr, m.queue, "num");
      cell(tr, m.batching);
      cell(tr, pct(m.error_fraction), "num errors");
      cell(tr, pct(m.default_fraction), "num defaults");
      tr.dataset.failing = m.failing ? "yes" : "no";
      // Mostly errors over the last minute: not ready, whatever its replicas say.
      readiness(cell(tr, null), m.failing ? "failing" : "ok", m.last_error || "");
      return tr;
    }));
    fill("replicas", st.replicas.map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.model = r.model;
      tr.dataset.version = r.version;
      tr.dataset.slot = r.slot === null ? "" : String(r.slot);
      tr.dataset.state = r.state;
      cell(tr, `${r.model}:${r.version}`);
      cell(tr, r.slot === null ? r.location : r.slot, "num");
      const s = cell(tr, null);
      const badge = document.createElement("span");
      badge.className = "state state-" + r.state;
      badge.textContent = r.state;
      s.replaceChildren(badge);
      cell(tr, r.pid, "num");
      cell(tr, r.restarts, "num");
      cell(tr, r.last_exit, "num");
      cell(tr, r.in_flight, "num");
      return tr;
    }));
    fill("rollouts", (st.rollouts || []).map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.model = r.model;
      cell(tr, r.model);
      cell(tr, r.current);
      cell(tr, r.split === null ? null : Object.entries(r.split)
        .map(([v, w]) => `${v}: ${(w * 100).toFixed(0)}%`).join(", ") + (r.sticky ? " (sticky)" : ""));
      const fb = r.split === null ? null : Object.keys(r.split)
        .reduce((n, v) => n + windowSum(`model/${r.model}:${v}/split_fallbacks`), 0);
      cell(tr, fb === null ? null : fixed(fb, 1), "num fallbacks");
      cell(tr, r.shadow === null ? null : `${r.shadow.version} (${(r.shadow.share * 100).toFixed(0)}%)`);
      const agree = r.shadow === null ? null : agreement(`model/${r.model}:${r.shadow.version}`);
      cell(tr, agree === null ? null : pct(agree), "num agreement");
      return tr;
    }));
    const now = data.t.length ? data.t[data.t.length - 1] : 0;
    fill("decisions", data.decisions.slice(-8).reverse().map((d) => {
      const tr = document.createElement("tr");
      tr.dataset.model = `${d.model}:${d.version}`;
      tr.dataset.reason = d.reason;
      cell(tr, ago(Math.max(now - d.t, 0)), "num");
      cell(tr, `${d.model}:${d.version}`);
      cell(tr, `${d.from} → ${d.to}`, "num");
      cell(tr, d.reason);
      cell(tr, d.error ? "failed: " + d.error : d.detail);
      return tr;
    }));
    $("no-decisions").hidden = data.decisions.length > 0;
    const ready = st.replicas.filter((r) => r.state === "ready").length;
    $("summary").textContent =
      `${st.apps.length} applications, ${st.models.length} model versions, ` +
      `${ready}/${st.replicas.length} replicas ready`;
  }

  // -- plots ------------------------------------------------------------------------------------
  function matching(re) {
    const out = [];
    for (const [key, ring] of data.series) {
      const m = re.exec(key);
      if (m) out.push({ key, ring, parts: m.slice(1) });
    }
    out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    return out;
  }

  function xs() {
    const last = data.t.length ? data.t[data.t.length - 1] : 0;
    return data.t.map((t) => Math.round((t - last) * 10) / 10);
  }

  function draw(div, title, traces, yaxis, legend) {
    const span = data.capacity * data.interval;
    const layout = {
      title: { text: title, font: { size: 13 }, x: 0.02 },
      height: 230,
      margin: { l: 48, r: 12, t: 34, b: 34 },
      xaxis: { range: [-span, 0], ticksuffix: " s", zeroline: false },
      yaxis: Object.assign({ rangemode: "tozero" }, yaxis || {}),
      legend: { orientation: "h", y: -0.18, font: { size: 10 } },
      showlegend: legend === true || traces.length > 1,
      uirevision: "keep",
      font: { size: 11 },
    };
    Plotly.react(div, traces, layout, { displayModeBar: false, responsive: true });
  }

  function lines(found, nameOf) {
    const x = xs();
    return found.map((s, i) => ({
      x, y: s.ring, name: nameOf(s), type: "scatter", mode: "lines",
      line: { width: 1.6, color: COLORS[i % COLORS.length] }, connectgaps: false,
    }));
  }

  // The latency axis keeps the SLO in view: its top is the larger of 3 x SLO and the 99th
  // percentile of the values shown, so one spike cannot flatten everything under it; values
  // above the top are drawn at the top and marked (their real value on hover).
  function latencyAxis(values, slo) {
    const shown = values.filter((v) => v !== null && v !== undefined).sort((a, b) => a - b);
    const q = shown.length ? shown[Math.min(shown.length - 1, Math.floor(0.99 * shown.length))] : 0;
    const top = Math.max(3 * (slo || 0), q) || 1;
    return { top, clipped: (v) => v !== null && v !== undefined && v > top };
  }

  // A small inline chart of one series (an application's throughput) for its collapsed row.
  function sparkline(values) {
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 120 20");
    svg.setAttribute("preserveAspectRatio", "none");
    const max = Math.max(...values.map((v) => v || 0), 0);
    if (values.length > 1 && max > 0) {
      const pts = values.map((v, i) =>
        `${(i * 120 / (values.length - 1)).toFixed(1)},${(19 - 18 * (v || 0) / max).toFixed(1)}`);
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", pts.join(" "));
      svg.appendChild(line);
    }
    return svg;
  }

  function latencyPlot(div, app, x) {
    const get = (k) => data.series.get(`app/${app.name}/${k}`) || [];
    const slo = latest(`app/${app.name}/slo_ms`) ?? app.slo_ms;
    const p50 = get("p50_ms"), p99 = get("p99_ms");
    const axis = latencyAxis([...p50, ...p99], slo);
    const cut = (ys) => ys.map((v) => (axis.clipped(v) ? axis.top : v));
    const cx = [], cy = [], ct = [];
    for (const [name, ys] of [["p50", p50], ["p99", p99]]) {
      ys.forEach((v, i) => {
        if (axis.clipped(v)) { cx.push(x[i]); cy.push(axis.top); ct.push(`${name} ${fixed(v, 1)} ms`); }
      });
    }
    const span = data.capacity * data.interval;
    div.dataset.top = String(axis.top);
    div.dataset.clipped = String(cx.length);
    draw(div, `${app.name}: latency (ms) against its SLO`, [
      { x, y: cut(p50), name: "p50", mode: "lines", line: { color: COLORS[0], width: 1.6 } },
      { x, y: cut(p99), name: "p99", mode: "lines", line: { color: COLORS[1], width: 1.6 } },
      // Across the whole x range, samples or not.
      { x: [-span, 0], y: [slo, slo], name: "SLO", mode: "lines",
        line: { color: "#d62728", dash: "dash", width: 1.2 } },
      { x: cx, y: cy, text: ct, name: "clipped", mode: "markers", hoverinfo: "text+x",
        marker: { symbol: "triangle-up", size: 8, color: "#912018" } },
    ], { range: [0, axis.top * 1.05], rangemode: "normal" }, true);
  }

  // One row per application: name, sparkline, latest figures; open (its plots below) while it
  // has traffic, closed when idle, or as the last click on it said.
  function appRows(x) {
    const list = $("apps-list");
    const apps = data.state ? data.state.apps : [];
    const want = new Set(apps.map((a) => a.name));
    for (const row of [...list.children]) {
      if (!want.has(row.dataset.app)) {
        row.querySelectorAll(".plot").forEach((d) => Plotly.purge(d));
        row.remove();
        chosen.delete(row.dataset.app);
      }
    }
    for (const app of apps) {
      let row = list.querySelector(`.app-row[data-app="${CSS.escape(app.name)}"]`);
      if (!row) {
        row = document.createElement("div");
        row.className = "app-row";
        row.dataset.app = app.name;
        const head = document.createElement("button");
        head.type = "button";
        head.className = "app-head";
        head.addEventListener("click", () => {
          chosen.set(app.name, row.dataset.expanded !== "yes");
          drawPlots();
        });
        const body = document.createElement("div");
        body.className = "app-body";
        row.append(head, body);
        list.appendChild(row);
      }
      const busy = active(app.name);
      const open = chosen.has(app.name) ? chosen.get(app.name) : busy;
      row.dataset.idle = busy ? "no" : "yes";
      row.dataset.expanded = open ? "yes" : "no";
      const head = row.firstChild, body = row.lastChild;
      const name = document.createElement("span");
      name.className = "app-name";
      name.textContent = (open ? "▾ " : "▸ ") + app.name;
      const figures = document.createElement("span");
      figures.className = "app-figures";
      const p99 = latestWithAge(`app/${app.name}/p99_ms`);
      const qps = latest(`app/${app.name}/qps`);
      figures.textContent = busy
        ? `${fixed(qps, 1)} q/s, p99 ${p99 ? fixed(p99.v, 1) + " ms" : "–"} (SLO ${app.slo_ms} ms)`
        : "idle" + (p99 ? `: last p99 ${fixed(p99.v, 1)} ms, ${ago(p99.age)}` : "");
      head.replaceChildren(name, sparkline(data.series.get(`app/${app.name}/qps`) || []), figures);
      if (!open) {
        body.querySelectorAll(".plot").forEach((d) => Plotly.purge(d));
        body.replaceChildren();
        continue;
      }
      let lat = body.querySelector(".plot-latency");
      if (!lat) {
        lat = document.createElement("div");
        lat.className = "plot plot-latency";
        lat.id = "plot-latency-" + app.name;
        body.appendChild(lat);
      }
      latencyPlot(lat, app, x);
      let wd = body.querySelector(".plot-weights");
      if (app.policy !== "single") {
        if (!wd) {
          wd = document.createElement("div");
          wd.className = "plot plot-weights";
          wd.id = "plot-weights-" + app.name;
          body.appendChild(wd);
        }
        const esc = app.name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
        draw(wd, `${app.name}: policy weights`,
          lines(matching(new RegExp(`^app/${esc}/weight/(.+)$`)), (s) => s.parts[0]),
          { range: [0, 1.02], rangemode: "normal" });
      } else if (wd) {
        Plotly.purge(wd);
        wd.remove();
      }
    }
  }

  // Replicas connected (solid) and wanted (dashed) per version, with the autoscaler's decisions
  // as markers at the count they asked for.
  function replicasPlot(x) {
    const traces = [];
    const versions = matching(/^model\/(.+)\/replicas_wanted$/).map((s) => s.parts[0]);
    versions.forEach((v, i) => {
      const color = COLORS[i % COLORS.length];
      traces.push({ x, y: data.series.get(`model/${v}/replicas`) || [], name: v, mode: "lines",
        line: { color, width: 1.6, shape: "hv" }, legendgroup: v });
      traces.push({ x, y: data.series.get(`model/${v}/replicas_wanted`), name: v + " wanted",
        mode: "lines", line: { color, width: 1, dash: "dot", shape: "hv" }, legendgroup: v,
        showlegend: false });
    });
    const last = data.t.length ? data.t[data.t.length - 1] : 0;
    const ds = data.decisions;
    traces.push({
      x: ds.map((d) => Math.round((d.t - last) * 10) / 10), y: ds.map((d) => d.to),
      text: ds.map((d) => `${d.model}:${d.version} ${d.from} → ${d.to}: ${d.reason}` +
        (d.error ? ` (failed: ${d.error})` : "")),
      name: "autoscaling decisions", mode: "markers", hoverinfo: "text+x",
      marker: { symbol: "diamond", size: 9, color: "#344054" },
    });
    draw($("plot-replicas"), "Replicas: connected, wanted (dotted), autoscaling decisions",
      traces, { dtick: 1 }, true);
  }

  // Each split version's share of its model's split queries per interval.
  function splitPlot(x) {
    const found = matching(/^model\/(.+):([^:]+)\/split_qps$/);
    const totals = new Map();
    for (const s of found) {
      const t = totals.get(s.parts[0]) || new Array(x.length).fill(0);
      s.ring.forEach((v, i) => { t[i] += v || 0; });
      totals.set(s.parts[0], t);
    }
    const traces = found.map((s, i) => ({
      x, name: `${s.parts[0]}:${s.parts[1]}`, mode: "lines",
      y: s.ring.map((v, j) => (v === null || !totals.get(s.parts[0])[j] ? null
        : Math.round(1000 * v / totals.get(s.parts[0])[j]) / 1000)),
      line: { width: 1.6, color: COLORS[i % COLORS.length] },
    }));
    draw($("plot-split"), "Traffic split: share of each model's split queries", traces,
      { range: [0, 1.02], rangemode: "normal" }, true);
  }

  function drawPlots() {
    const x = xs();
    draw($("plot-qps"), "Throughput (queries/s)",
      lines(matching(/^app\/(.+)\/qps$/), (s) => s.parts[0]));
    draw($("plot-defaults"), "Default outputs by reason (/s)",
      lines(matching(/^app\/(.+)\/defaults\/(.+)$/), (s) => `${s.parts[0]}: ${s.parts[1]}`),
      null, true);
    appRows(x);
    replicasPlot(x);
    // Rollout plots only while some model has one (or its samples are still in view).
    const split = matching(/^model\/(.+)\/split_qps$/).length > 0;
    const shadow = matching(/^model\/(.+)\/shadow_agreement$/);
    $("plot-split").hidden = !split;
    $("plot-shadow").hidden = shadow.length === 0;
    if (split) splitPlot(x);
    if (shadow.length) {
      draw($("plot-shadow"), "Shadow agreement with the real answers",
        lines(shadow, (s) => s.parts[0]), { range: [0, 1.02], rangemode: "normal" }, true);
    }
    draw($("plot-batch"), "Mean batch size (inputs)",
      lines(matching(/^model\/(.+)\/batch_size$/), (s) => s.parts[0]));
    draw($("plot-queue"), "Queue depth (inputs waiting)",
      lines(matching(/^model\/(.+)\/queue$/), (s) => s.parts[0]));
    draw($("plot-cache"), "Cache hit rate",
      lines(matching(/^model\/(.+)\/cache_hit_rate$/), (s) => s.parts[0]),
      { range: [0, 1.02], rangemode: "normal" });
    draw($("plot-lag"), "Event loop lag (ms)",
      lines(matching(/^frontend\/loop_lag_ms$/), () => "lag"));
  }

  // For the browser test: the page's own axis rule.
  window.clipperDashboard = { latencyAxis };

  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    connect();
  });

  start();
})();
