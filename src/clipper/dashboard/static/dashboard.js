// The clipper-serve dashboard: reads /dashboard/events (server-sent events) with fetch, so that
// the admin token can travel in an Authorization header, and draws with plotly.js.
// Everything shown comes from the server as data and is written with textContent.
"use strict";

(() => {
  const TOKEN_KEY = "clipper-dashboard-token";
  const RETRY_MS = 2000;
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];

  const data = { t: [], series: new Map(), capacity: 300, interval: 1, state: null };
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
    } else if (name === "sample") {
      append(doc.t, doc.values);
      data.state = doc.state;
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
      const p99 = latest(`app/${a.name}/p99_ms`);
      cell(tr, p99 === null ? null : fixed(p99, 2) + " ms", "num");
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
      cell(tr, `${m.replicas_ready}/${m.replicas_wanted}`, "num");
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

  // One plot per application in a group: made when first needed, removed when it is gone.
  function perApp(groupId, prefix, apps, build) {
    const group = $(groupId);
    const want = new Set(apps);
    for (const div of [...group.children]) {
      if (!want.has(div.dataset.app)) { Plotly.purge(div); div.remove(); }
    }
    for (const app of apps) {
      let div = group.querySelector(`[data-app="${CSS.escape(app)}"]`);
      if (!div) {
        div = document.createElement("div");
        div.className = "plot";
        div.id = prefix + app;
        div.dataset.app = app;
        group.appendChild(div);
      }
      build(div, app);
    }
  }

  function drawPlots() {
    const x = xs();
    draw($("plot-qps"), "Throughput (queries/s)",
      lines(matching(/^app\/(.+)\/qps$/), (s) => s.parts[0]));
    draw($("plot-defaults"), "Default outputs by reason (/s)",
      lines(matching(/^app\/(.+)\/defaults\/(.+)$/), (s) => `${s.parts[0]}: ${s.parts[1]}`),
      null, true);
    const apps = (data.state ? data.state.apps : []).map((a) => a.name);
    perApp("plots-latency", "plot-latency-", apps, (div, app) => {
      const get = (k) => data.series.get(`app/${app}/${k}`) || [];
      draw(div, `${app}: latency (ms) against its SLO`, [
        { x, y: get("p50_ms"), name: "p50", mode: "lines", line: { color: COLORS[0], width: 1.6 } },
        { x, y: get("p99_ms"), name: "p99", mode: "lines", line: { color: COLORS[1], width: 1.6 } },
        { x, y: get("slo_ms"), name: "SLO", mode: "lines",
          line: { color: "#d62728", dash: "dash", width: 1.2 } },
      ]);
    });
    draw($("plot-batch"), "Mean batch size (inputs)",
      lines(matching(/^model\/(.+)\/batch_size$/), (s) => s.parts[0]));
    draw($("plot-queue"), "Queue depth (inputs waiting)",
      lines(matching(/^model\/(.+)\/queue$/), (s) => s.parts[0]));
    draw($("plot-cache"), "Cache hit rate",
      lines(matching(/^model\/(.+)\/cache_hit_rate$/), (s) => s.parts[0]),
      { range: [0, 1.02], rangemode: "normal" });
    const weighted = (data.state ? data.state.apps : [])
      .filter((a) => a.policy !== "single").map((a) => a.name);
    perApp("plots-weights", "plot-weights-", weighted, (div, app) => {
      const esc = app.replace(/[.]/g, "\\.");
      draw(div, `${app}: policy weights`,
        lines(matching(new RegExp(`^app/${esc}/weight/(.+)$`)), (s) => s.parts[0]),
        { range: [0, 1.02], rangemode: "normal" });
    });
    draw($("plot-lag"), "Event loop lag (ms)",
      lines(matching(/^frontend\/loop_lag_ms$/), () => "lag"));
  }

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
