// deployer dashboard: the overview and deployment pages. Plain JS, no build step, no outside resources.
// Every value from the server is put in the page as text (textContent / SVG text), never parsed as HTML.
// Polls are chained (one at a time), bounded below by the server's refresh_s / log_poll_s, and back off on errors.
// The credential: the printed URL's one-time ticket (in the fragment, never sent over the wire) is traded once for
// the run's token, kept in this tab's sessionStorage (this origin only: never a cookie, which every port of
// 127.0.0.1 would receive) and sent as `Authorization: Bearer` with each data request. Another tab of this
// dashboard gets it from a tab that has it (a BroadcastChannel: same origin only).
"use strict";

(function () {
  const MAX_LOG_LINES = 5000;
  const MIN_POLL_S = 0.5;
  const MAX_BACKOFF_S = 60;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const TOKEN_KEY = "deployer-dashboard-token";
  const ASK_OTHER_TABS_MS = 1500;
  let bearer = null;  // the run's token, once this tab has it
  const PARTS = [
    ["weights_mib", "weights"], ["kv_mib", "KV cache"], ["mamba_mib", "Mamba state"],
    ["graphs_mib", "CUDA graphs"], ["other_mib", "other"], ["headroom_mib", "headroom"],
  ];

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    return node;
  }

  function token(value) {  // a safe class-name part
    return String(value || "unknown").toLowerCase().replace(/[^a-z0-9-]/g, "-");
  }

  function blank(value) { return value === null || value === undefined; }

  function num(value, digits) {
    return blank(value) ? "" : Number(value).toFixed(digits === undefined ? 0 : digits);
  }

  function duration(seconds) {
    if (blank(seconds)) return "";
    const s = Math.floor(seconds);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (s % 60) + "s";
    return s + "s";
  }

  function mib(value) {
    return value >= 1024 ? (value / 1024).toFixed(1) + " GiB" : Math.round(value) + " MiB";
  }

  function show(value) {
    if (value === null) return "null (removed)";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function fail(error) {
    const box = document.getElementById("error");
    box.textContent = error.status === 401 || error.status === 403
      ? "refused (" + error.status + "): open the newest URL the dashboard printed (each lets one browser in)"
      : "could not refresh: " + error.message;
    box.hidden = false;
  }

  function ok() {
    document.getElementById("error").hidden = true;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  }

  // ---- the credential ----
  function ticketOfAddress() {  // the printed URL's `#ticket=...`, taken out of the address bar at once
    const found = /(?:^#|&)ticket=([A-Za-z0-9_-]+)/.exec(window.location.hash);
    if (window.location.hash) {
      window.history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    return found ? found[1] : null;
  }

  function sharedChannel() {
    if (typeof BroadcastChannel === "undefined") return null;
    const channel = new BroadcastChannel("deployer-dashboard");
    channel.onmessage = function (event) {
      const data = event.data || {};
      if (data.ask && bearer) channel.postMessage({ token: bearer });
    };
    return channel;
  }

  function fromOtherTabs(channel) {
    return new Promise(function (resolve) {
      if (!channel) { resolve(null); return; }
      const timer = window.setTimeout(function () { resolve(null); }, ASK_OTHER_TABS_MS);
      channel.addEventListener("message", function (event) {
        const data = event.data || {};
        if (typeof data.token === "string") { window.clearTimeout(timer); resolve(data.token); }
      });
      channel.postMessage({ ask: true });
    });
  }

  async function signIn() {
    const ticket = ticketOfAddress();
    const channel = sharedChannel();
    if (ticket) {
      const response = await fetch("/api/session", {
        credentials: "omit", cache: "no-store", headers: { "X-Deployer-Ticket": ticket } });
      if (response.ok) bearer = (await response.json()).token;
    }
    if (!bearer) bearer = window.sessionStorage.getItem(TOKEN_KEY);
    if (!bearer) bearer = await fromOtherTabs(channel);
    if (bearer) window.sessionStorage.setItem(TOKEN_KEY, bearer);
  }

  async function getJSON(url) {
    const headers = bearer ? { "Authorization": "Bearer " + bearer } : {};
    const response = await fetch(url, { credentials: "omit", cache: "no-store", headers: headers });
    if (!response.ok) {
      const error = new Error(response.status + " " + response.statusText);
      error.status = response.status;
      throw error;
    }
    return response.json();
  }

  // Run `step` now and again `interval()` seconds after each success; after an error wait twice as long (bounded).
  function poll(step, interval) {
    let backoff = 0;
    async function tick() {
      try {
        if (!document.hidden) await step();
        backoff = 0;
      } catch (error) {
        fail(error);
        backoff = Math.min(MAX_BACKOFF_S, Math.max(1, backoff * 2));
      }
      window.setTimeout(tick, 1000 * Math.max(MIN_POLL_S, interval(), backoff));
    }
    tick();
  }

  // Call `draw(value)` only when `value` differs from what it last drew: a refresh that brings nothing new leaves the
  // page (a selection, a hovered bar) alone.
  function drawer(draw) {
    let last = null;
    return function (value) {
      const now = JSON.stringify(value);
      if (now === last) return;
      last = now;
      draw(value);
    };
  }

  // ---- overview ----
  function stateBadge(r) {
    return el("span", "state state-" + token(r.status) + (r.crash_loop ? " state-crash-loop" : ""), r.status);
  }

  function failureText(r) {  // the last failure as status says it: its diagnosis, else how it last ended
    if (r.diagnosis) return (r.diagnosis.signature || "unknown failure") + (r.diagnosis.summary ? ": " + r.diagnosis.summary : "");
    return r.last_crash ? crashText(r.last_crash) : null;
  }

  function crashText(c) {
    const how = c.signal_name ? "killed by " + c.signal_name
      : blank(c.exit_code) ? "ended" : "exited with code " + c.exit_code;
    return blank(c.at) ? how : how + " at " + new Date(c.at * 1000).toLocaleString();
  }

  const COLUMNS = [
    function (r) {
      const a = el("a", null, r.name);
      a.href = "/deployment?key=" + encodeURIComponent(r.key);
      return a;
    },
    function (r) { return r.kind + (r.member ? " " + r.member : ""); },
    function (r) { return r.host; },
    function (r) { return r.engine; },
    stateBadge,
    function (r) { return el("span", r.serving ? "yes" : "no", r.serving ? "yes" : "no"); },
    function (r) { return r.engine_version; },
    function (r) { return r.model; },
    function (r) { return duration(r.uptime_s); },
    function (r) { return num(r.restarts); },
    function (r) { return num(r.requests); },
    function (r) { return num(r.tokens_per_s, 1); },
    function (r) { return num(r.kv_usage_pct, 1); },
    function (r) { return num(r.p99_latency_ms, 0); },
    function (r) { return failureText(r); },
  ];
  const NUMERIC = [8, 9, 10, 11, 12, 13];

  function overviewRow(row) {
    const tr = el("tr", "row-" + token(row.status));
    tr.dataset.key = row.key;
    COLUMNS.forEach(function (column, i) {
      const td = el("td", NUMERIC.indexOf(i) >= 0 ? "num" : i === COLUMNS.length - 1 ? "failure" : null);
      const value = column(row);
      if (value instanceof Node) td.appendChild(value); else td.textContent = blank(value) ? "" : String(value);
      tr.appendChild(td);
    });
    return tr;
  }

  function overviewPage() {
    let refresh = 5;
    const rows = drawer(function (list) {
      const body = document.querySelector("#overview tbody");
      body.replaceChildren.apply(body, list.map(overviewRow));
      document.getElementById("empty").hidden = list.length > 0;
    });
    poll(async function () {
      const data = await getJSON("/api/overview");
      refresh = data.refresh_s;
      rows(data.rows);
      ok();
    }, function () { return refresh; });
  }

  // ---- deployment: summary (every field `deploy status` shows) ----
  function summary(row) {
    document.title = row.name + " - deployer dashboard";
    document.getElementById("title").textContent = row.name + " on " + row.host;
    const state = document.getElementById("state");
    state.className = stateBadge(row).className;
    state.textContent = row.status + (row.serving ? ", serving" : ", not serving");
    document.getElementById("crash-loop").hidden = !row.crash_loop;
    const pairs = [
      ["kind", row.kind + (row.member ? " " + row.member : "")], ["engine", row.engine],
      ["version", row.engine_version], ["model", row.model], ["pid", row.pid], ["uptime", duration(row.uptime_s)],
      ["restarts", num(row.restarts)], ["crash loop", row.crash_loop ? "yes" : "no"], ["attempt", num(row.attempt)],
      ["port", num(row.port)], ["content hash", row.content_hash], ["run dir", row.run_dir],
      ["healthy", row.healthy ? "yes" : "no"], ["unhealthy", row.unhealthy],
      ["last crash", row.last_crash ? crashText(row.last_crash) : null], ["lock", row.lock],
      ["requests", num(row.requests)], ["tokens/s", num(row.tokens_per_s, 1)], ["KV %", num(row.kv_usage_pct, 1)],
      ["p99 ms", num(row.p99_latency_ms)],
    ];
    const dl = document.getElementById("summary");
    dl.replaceChildren();
    pairs.forEach(function (pair) {
      const dt = el("dt", null, pair[0]), dd = el("dd", null, blank(pair[1]) ? "" : pair[1]);
      dd.dataset.field = token(pair[0]);
      dl.appendChild(dt);
      dl.appendChild(dd);
    });
    const why = document.getElementById("status-diagnosis");
    why.replaceChildren.apply(why, row.diagnosis ? [diagnosisBlock(row.diagnosis)] : []);
    document.getElementById("last-failure").hidden = !row.diagnosis;
  }

  // ---- deployment: attempts timeline ----
  function attemptEnd(a) {
    const last = a.phases.length ? a.phases[a.phases.length - 1].elapsed : 0;
    return Math.max(blank(a.elapsed_s) ? 0 : a.elapsed_s, last, 0.001);
  }

  function phasesBar(a, scale) {
    const bar = el("div", "phases");
    const end = attemptEnd(a);
    a.phases.forEach(function (p, i) {
      const next = i + 1 < a.phases.length ? a.phases[i + 1].elapsed : end;
      const seg = el("span", "phase phase-" + (i % 6), p.phase);
      seg.title = p.phase + " at " + p.elapsed.toFixed(1) + " s";
      seg.style.setProperty("width", Math.max(0.5, 100 * (next - p.elapsed) / scale) + "%");
      bar.appendChild(seg);
    });
    const tail = el("span", "phase-end outcome-" + token(a.outcome), a.outcome);
    bar.appendChild(tail);
    return bar;
  }

  function diagnosisBlock(d) {
    const box = el("div", "diagnosis");
    box.appendChild(el("strong", null, d.signature || "unknown failure"));
    if (d.summary) box.appendChild(el("span", null, ": " + d.summary));
    if (d.transient) box.appendChild(el("span", "muted", " (transient)"));
    if (d.evidence && d.evidence.length) {
      const pre = el("pre", "evidence");
      pre.textContent = d.evidence.join("\n");
      box.appendChild(pre);
    }
    if (d.hint) box.appendChild(el("div", "hint", d.hint));
    if (d.traceback) {
      const more = el("details", "traceback");
      more.appendChild(el("summary", null, "traceback"));
      more.appendChild(el("pre", "evidence", d.traceback));
      box.appendChild(more);
    }
    return box;
  }

  function changeBlock(c) {
    const box = el("div", "change");
    box.appendChild(el("strong", null, "healed: "));
    box.appendChild(el("span", null, c.reason || "changed the profile"));
    const list = el("ul");
    Object.keys(c.args).forEach(function (k) {
      const basis = c.basis && c.basis[k] ? " (from " + c.basis[k] + ")" : "";
      list.appendChild(el("li", "arg", k + " = " + show(c.args[k]) + basis));
    });
    Object.keys(c.env).forEach(function (k) { list.appendChild(el("li", "env", "env " + k + " = " + show(c.env[k]))); });
    box.appendChild(list);
    return box;
  }

  function timeline(attempts, rollbacks) {
    const scale = attempts.reduce(function (m, a) { return Math.max(m, attemptEnd(a)); }, 0.001);
    const list = document.getElementById("timeline");
    list.replaceChildren.apply(list, attempts.map(function (a) {
      const li = el("li", "attempt outcome-" + token(a.outcome) + (a.healed ? " healed" : "") + (a.current ? " current" : ""));
      li.dataset.runId = a.run_id;
      const head = el("div", "attempt-head");
      head.appendChild(el("strong", null, "attempt " + (blank(a.attempt) ? "?" : a.attempt)));
      head.appendChild(el("span", "outcome", a.outcome));
      head.appendChild(el("span", "muted", a.run_id + (a.current ? " (current)" : "") +
        (blank(a.elapsed_s) ? "" : ", " + a.elapsed_s.toFixed(1) + " s")));
      li.appendChild(head);
      li.appendChild(phasesBar(a, scale));
      if (a.detail) li.appendChild(el("div", "detail", a.detail));
      if (a.diagnosis) li.appendChild(diagnosisBlock(a.diagnosis));
      if (a.change) li.appendChild(changeBlock(a.change));
      if (a.drift && a.drift.length) li.appendChild(el("div", "drift-note", "drift: " + a.drift.join("; ")));
      return li;
    }));
    const back = document.getElementById("rollbacks");
    back.replaceChildren.apply(back, rollbacks.map(function (r) {
      return el("li", "rollback", "rolled back to " + r.run_id + " (" + r.status + ")" + (r.reason ? ": " + r.reason : ""));
    }));
  }

  // ---- deployment: memory plan, one stacked bar per GPU ----
  function gpuBar(g) {
    const width = 600, height = 28;
    const box = el("figure", "gpu");
    box.appendChild(el("figcaption", null, "GPU " + g.gpu + (g.name ? " " + g.name : "") + ": " + mib(g.total_mib) +
      (g.fits ? "" : " - does NOT fit")));
    const picture = svg("svg", { viewBox: "0 0 " + width + " " + height, width: "100%", height: height,
      preserveAspectRatio: "none",
      role: "img", "aria-label": "memory of GPU " + g.gpu });
    const total = Math.max(g.total_mib, g.total_mib - g.headroom_mib, 1);
    let x = 0;
    const legend = el("ul", "legend");
    PARTS.forEach(function (part, i) {
      const value = Math.max(0, g[part[0]] || 0);
      if (!value && part[0] !== "headroom_mib") return;
      const w = width * value / total;
      const rect = svg("rect", { x: x, y: 0, width: w, height: height, class: "part part-" + i });
      const tip = svg("title", {});
      tip.textContent = part[1] + ": " + mib(value);
      rect.appendChild(tip);
      picture.appendChild(rect);
      x += w;
      const item = el("li", "part-key part-" + i, part[1] + " " + mib(value));
      legend.appendChild(item);
    });
    if (g.headroom_mib < 0) legend.appendChild(el("li", "over", "over by " + mib(-g.headroom_mib)));
    box.appendChild(picture);
    box.appendChild(legend);
    return box;
  }

  function memory(gpus) {
    const box = document.getElementById("memory");
    box.replaceChildren.apply(box, gpus.length ? gpus.map(gpuBar) : [el("p", "muted", "no memory plan")]);
  }

  function drift(rows) {
    const body = document.querySelector("#drift tbody");
    body.replaceChildren.apply(body, rows.map(function (d) {
      const tr = el("tr", "drift-" + token(d.kind));
      [d.flag, show(d.asked), d.kind === "unknown" ? "(not reported)" : show(d.resolved), d.kind].forEach(function (v) {
        tr.appendChild(el("td", null, v));
      });
      return tr;
    }));
    document.getElementById("no-drift").hidden = rows.length > 0;
  }

  // ---- deployment: the engine log, tail / follow / search ----
  function LogView(key) {
    this.key = key;
    this.lines = [];
    this.end = null;
    this.runId = null;
    this.box = document.getElementById("log");
    this.follow = document.getElementById("follow");
    this.search = document.getElementById("search");
    const view = this;
    this.search.addEventListener("input", function () { view.render(); });
    this.follow.addEventListener("change", function () { view.render(); });
  }

  LogView.prototype.url = function () {
    const offset = this.end === null ? "" : "&offset=" + this.end;
    return "/api/log?key=" + encodeURIComponent(this.key) + offset;
  };

  LogView.prototype.step = async function () {
    if (this.end !== null && !this.follow.checked) return;
    let chunk;
    try {
      chunk = await getJSON(this.url());
    } catch (error) {
      if (error.status === 404) { this.box.textContent = "no log yet"; return; }
      throw error;
    }
    if (this.end !== null && (chunk.run_id !== this.runId || chunk.size < this.end)) {
      this.end = null; this.lines = [];  // a new run (or a rotated log): start again from its tail
      return this.step();
    }
    this.runId = chunk.run_id;
    this.end = chunk.end;
    if (!chunk.lines.length && this.box.childElementCount) return;
    this.lines = this.lines.concat(chunk.lines).slice(-MAX_LOG_LINES);
    this.render();
  };

  LogView.prototype.render = function () {
    const term = this.search.value.toLowerCase();
    const shown = term ? this.lines.filter(function (l) { return l.toLowerCase().indexOf(term) >= 0; }) : this.lines;
    this.box.replaceChildren.apply(this.box, shown.map(function (line) { return el("div", "line", line); }));
    document.getElementById("log-count").textContent = term
      ? shown.length + " of " + this.lines.length + " lines match" : this.lines.length + " lines";
    if (this.follow.checked) this.box.scrollTop = this.box.scrollHeight;
  };

  function deploymentPage() {
    const key = new URLSearchParams(window.location.search).get("key") || "";
    let refresh = 5, logPoll = 1;
    const parts = [drawer(summary), drawer(function (d) { timeline(d.attempts, d.rollbacks); }), drawer(memory),
      drawer(drift)];
    poll(async function () {
      const data = await getJSON("/api/deployment?key=" + encodeURIComponent(key));
      refresh = data.refresh_s; logPoll = data.log_poll_s;
      [data.row, { attempts: data.attempts, rollbacks: data.rollbacks }, data.memory, data.drift].forEach(function (value, i) { parts[i](value); });
      ok();
    }, function () { return refresh; });
    const log = new LogView(key);
    poll(function () { return log.step(); }, function () { return logPoll; });
  }

  const page = document.body.dataset.page;
  signIn().catch(function (error) { fail(error); }).then(function () {
    if (page === "overview") overviewPage();
    if (page === "deployment") deploymentPage();
  });
})();
