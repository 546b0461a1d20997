// loopscope dashboard: sessions, a session's live timeline, tool and turn analytics.
// Everything read from the store is put on the page as text (textContent / text nodes),
// never parsed as HTML: a tool result holding "<script>" shows as those characters.
"use strict";

(() => {
  const main = document.getElementById("main");
  const statusEl = document.getElementById("status");
  const errorEl = document.getElementById("error");
  const SVG = "http://www.w3.org/2000/svg";
  const RANGES = ["15m", "1h", "24h", "7d", "30d", "all"];
  const OUTCOMES = ["served", "failed", "refused", "blocked", "cancelled", "unserved"];
  const POLL_TIMELINE_MS = 1000;
  const POLL_LIST_MS = 5000;

  // -- DOM helpers (text only) ------------------------------------------------------------

  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    setProps(el, props);
    return add(el, children);
  }

  function s(tag, props, ...children) {
    const el = document.createElementNS(SVG, tag);
    setProps(el, props);
    return add(el, children);
  }

  function setProps(el, props) {
    if (!props) return;
    for (const [key, value] of Object.entries(props)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.setAttribute("class", value);
      else if (key === "text") el.textContent = String(value);
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }

  function add(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  const fill = (el, ...children) => add(clear(el), children);
  const put = (el, ...children) => add(el, children);

  // -- formatting ---------------------------------------------------------------------------

  const nf = new Intl.NumberFormat("en-US");
  const fmtInt = (n) => (n === null || n === undefined ? "–" : nf.format(Math.round(n)));
  const fmtPct = (x) => (x === null || x === undefined ? "–" : `${(x * 100).toFixed(x > 0 && x < 0.1 ? 1 : 0)}%`);

  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "–";
    if (ms < 1) return `${ms.toFixed(2)} ms`;
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
    const m = Math.floor(ms / 60000);
    return `${m}m ${Math.round((ms % 60000) / 1000)}s`;
  }

  const pad = (n, w = 2) => String(n).padStart(w, "0");

  function fmtTime(t, withDate) {
    if (!t) return "–";
    const d = new Date(t);
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    const today = new Date().toDateString() === d.toDateString();
    return withDate || !today ? `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}` : time;
  }

  function fmtClock(t) {
    const d = new Date(t);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function fmtAgo(t) {
    if (!t) return "–";
    const sec = Math.max(0, (Date.now() - t) / 1000);
    if (sec < 60) return `${Math.round(sec)} s ago`;
    if (sec < 3600) return `${Math.round(sec / 60)} min ago`;
    if (sec < 86400) return `${Math.round(sec / 3600)} h ago`;
    return `${Math.round(sec / 86400)} d ago`;
  }

  function fmtBucket(seconds) {
    if (seconds < 60) return `${seconds} s`;
    if (seconds < 3600) return `${seconds / 60} min`;
    if (seconds < 86400) return `${seconds / 3600} h`;
    return `${seconds / 86400} d`;
  }

  // JSON on one line when it is short, indented when it is not; other text as it is
  function pretty(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "string") {
      const trimmed = value.trim();
      if ((trimmed.startsWith("{") && trimmed.endsWith("}")) || (trimmed.startsWith("[") && trimmed.endsWith("]"))) {
        try { return pretty(JSON.parse(trimmed)); } catch (e) { /* not JSON: as is */ }
      }
      return value;
    }
    const oneLine = JSON.stringify(value, null, 1).replace(/\n\s*/g, " ");
    return oneLine.length <= 110 ? oneLine : JSON.stringify(value, null, 2);
  }

  const plural = (n, word) => `${fmtInt(n)} ${word}${n === 1 ? "" : "s"}`;

  // US dollars: cents from ten cents up, tenths of a cent from one, two significant digits below
  function fmtUsd(usd) {
    if (usd >= 0.1) return `$${usd.toFixed(2)}`;
    if (usd >= 0.01) return `$${usd.toFixed(3)}`;
    if (usd >= 0.000001) return `$${usd.toPrecision(2)}`;
    if (usd > 0) return "<$0.000001"; // toPrecision would write 1.2e-7
    return "$0";
  }

  // A cost figure. Null means no call had a price: "—", never $0. `unpriced` calls are
  // left out of a sum that has priced ones, and the figure says so.
  function costNode(usd, unpriced, calls) {
    const missing = unpriced || 0;
    if (usd === null || usd === undefined || (calls && missing >= calls)) {
      return h("span", { class: "cost none", title: missing ? `${plural(missing, "model call")} without a price` : "no price for this model" },
        "—", h("span", { class: "cost-hint", text: " no price" }));
    }
    return h("span", { class: "cost", title: missing ? `${plural(missing, "model call")} without a price, left out of the sum` : "USD" },
      fmtUsd(usd), missing ? h("span", { class: "cost-hint", text: ` + ${fmtInt(missing)} without a price` }) : null);
  }

  const REASON_TONE = {
    completed: "ok", max_rounds: "warn", timeout: "warn", budget_exceeded: "warn", truncated: "warn",
    empty_response: "warn", refusal: "warn", content_filter: "warn", unfinished: "bad", cut_off: "warn", force_stopped: "bad", cancelled: "muted", error: "bad",
  };
  const OUTCOME_TONE = { served: "ok", failed: "bad", refused: "warn", blocked: "warn", cancelled: "muted", unserved: "bad", running: "run" };

  const CALL_TONE = { completed: "ok", truncated: "warn", refusal: "warn", content_filter: "warn", error: "bad", cancelled: "muted", running: "run" };

  // -- the waterfall: a turn's model calls and tool calls on one time axis ---------------------

  // bars: [{kind: "call"|"tool", name, start, end (null: running), ttfc (ms after start),
  // outcome, title, attrs}], times in epoch ms; origin: the turn's start; until: the axis end.
  // opts.pins: a Set of the rows (opts.key, the turn's, and the bar's key) whose details the user
  // opened, kept across redraws.
  // A row's details (its title's lines) are text on the page, not only a native tooltip that
  // keyboard and touch cannot reach: a row is focusable; focus shows them, Enter, Space, a click
  // or a tap keeps them open (or closes them again), Escape closes them.
  function waterfall(bars, origin, until, opts = {}) {
    const pins = opts.pins || new Set();
    const span = Math.max(1, until - origin);
    const at = (t) => `${Math.max(0, Math.min(100, ((t - origin) / span) * 100))}%`;
    const box = h("div", { class: "waterfall", role: "group", "aria-label": "model calls and tool calls on one time axis" });
    const ticks = h("div", { class: "wf-track wf-axis" });
    for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
      const tick = h("span", { class: `wf-tick${frac === 1 ? " last" : frac === 0.25 || frac === 0.75 ? " quarter" : ""}`, text: frac ? fmtMs(span * frac) : "0" });
      tick.style.left = `${frac * 100}%`;
      put(ticks, tick);
    }
    put(box, h("div", { class: "wf-row wf-head" }, h("span", { class: "wf-label muted", text: "since the turn started" }), ticks));
    bars.forEach((bar, i) => {
      const end = bar.end === null ? Math.max(bar.start, until) : bar.end;
      const duration = end - bar.start;
      const label = bar.end === null ? `running ${fmtMs(duration)}` : fmtMs(bar.duration ?? duration);
      const outcome = bar.outcome || "unknown";
      const track = h("div", { class: "wf-track" });
      const el = h("div", { class: `wf-bar ${bar.kind} o-${outcome}${bar.end === null ? " running" : ""}`, title: bar.title });
      el.style.left = at(bar.start);
      el.style.width = `${Math.max(0, (duration / span) * 100)}%`;
      put(track, el);
      if (bar.ttfc !== null && bar.ttfc !== undefined) {
        const mark = h("span", { class: "wf-ttfc", title: `first chunk after ${fmtMs(bar.ttfc)}` });
        mark.style.left = at(bar.start + bar.ttfc);
        put(track, mark);
      }
      const tone = bar.kind === "call" ? CALL_TONE[outcome] : OUTCOME_TONE[outcome];
      const plain = outcome === "completed" || outcome === "served";
      const key = `${opts.key || ""}:${bar.kind}:${bar.key ?? i}`;
      const detailId = `wf-detail-${++wfSerial}`;
      const detail = h("div", { class: "wf-detail", id: detailId, role: "note", hidden: !pins.has(key), text: bar.title });
      const row = h("div", {
        class: `wf-row ${bar.kind}`, title: bar.title, "data-kind": bar.kind, "data-name": bar.name, "data-outcome": outcome,
        "data-start": bar.start - origin, "data-end": bar.end === null ? null : bar.end - origin, ...(bar.attrs || {}),
        tabindex: 0, role: "button", "aria-expanded": String(pins.has(key)), "aria-controls": detailId, "data-wf-key": key,
        "aria-label": `${bar.kind === "call" ? "model call" : "tool call"} ${bar.name}, ${label}${plain ? "" : `, ${outcome}`}: details`,
      },
      h("span", { class: "wf-label" },
        h("span", { class: "wf-icon", "aria-hidden": "true", text: bar.kind === "call" ? "◆" : "⚙" }),
        h("span", { class: "wf-name", text: bar.name }),
        h("span", { class: "wf-duration", text: label }),
        plain ? null : badge(outcome.replace("_", " "), tone || "muted", "wf-outcome"),
      ),
      track);
      const show = (open) => {
        detail.hidden = !open;
        row.setAttribute("aria-expanded", String(open));
        row.classList.toggle("open", open);
      };
      const pin = (open) => {
        if (open) pins.add(key); else pins.delete(key);
        show(open);
      };
      row.classList.toggle("open", pins.has(key));
      row.addEventListener("focus", () => show(true));
      row.addEventListener("blur", () => show(pins.has(key)));
      row.addEventListener("click", () => pin(!pins.has(key)));
      row.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pin(!pins.has(key)); }
        else if (ev.key === "Escape") { ev.preventDefault(); pin(false); }
      });
      put(box, row, detail);
    });
    put(box, h("div", { class: "wf-legend muted" },
      h("span", null, h("span", { class: "wf-icon call", text: "◆" }), " model call"),
      h("span", null, h("span", { class: "wf-icon", text: "⚙" }), " tool call"),
      bars.some((b) => b.ttfc !== null && b.ttfc !== undefined) ? h("span", null, h("span", { class: "wf-ttfc-key" }), " first chunk of a stream") : null,
      h("span", { text: "select a row (hover, focus, tap) for tokens and cost" }),
    ));
    return box;
  }
  let wfSerial = 0; // ids tying a waterfall row to its details (aria-controls)

  // a turn's model calls: the summary's count (older stores: none, so null)
  const modelCalls = (t) => t.model_calls ?? t.model_call_count ?? null;
  // a store older than cost columns sends no cost_usd at all: nothing to show (null is "no price")
  const turnCost = (t) => ("cost_usd" in t ? costNode(t.cost_usd, t.unpriced_calls, modelCalls(t)) : null);

  // the store's cost: the sum on the card, the calls without a price under it
  function costCard(t) {
    const missing = t.unpriced_calls || 0;
    const card = statCard("Cost", "", `${plural(t.model_calls || 0, "model call")}${missing ? `, ${fmtInt(missing)} without a price` : ""}`);
    const priced = t.cost_usd !== null && t.cost_usd !== undefined;
    fill(card.querySelector(".stat-value"), priced ? h("span", { class: "cost", text: fmtUsd(t.cost_usd) }) : costNode(null, missing, t.model_calls));
    return card;
  }

  const badge = (text, tone, extra) => h("span", { class: `badge ${tone || "muted"}${extra ? " " + extra : ""}`, text });
  const reasonBadge = (reason) => badge(reason || "unknown", REASON_TONE[reason] || "muted", "reason");

  // -- fetching -----------------------------------------------------------------------------

  async function getJSON(path, params) {
    const query = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== null && v !== undefined && v !== "" && v !== false) query.set(k, v === true ? "1" : String(v));
    }
    const url = query.toString() ? `${path}?${query}` : path;
    let response;
    try {
      response = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
    } catch (e) {
      throw new Error("the loopscope server does not answer (was `loopscope ui` stopped?)");
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    return body;
  }

  function showError(err) {
    if (!err) {
      errorEl.hidden = true;
      return;
    }
    errorEl.textContent = String(err.message || err);
    errorEl.hidden = false;
  }

  function setStatus(text, live) {
    clear(statusEl);
    if (live) put(statusEl, h("span", { class: "live-dot", title: "live" }));
    put(statusEl, document.createTextNode(text));
  }

  // -- charts (SVG built from elements; values only ever become text) -----------------------

  // An axis from 0 to at least `max`: about four steps of 1, 2, 2.5 or 5 times a power of ten
  // (a count's step is a whole number, never below 1), the top the first tick at or above max.
  // label(v) writes a tick exactly: as many decimals as the step has, so 2.5 never reads "3".
  function niceTicks(max, count) {
    const target = (max > 0 ? Math.max(max, count ? 1 : 0) : 1) / 4;
    const power = 10 ** Math.floor(Math.log10(target));
    let stepSize = [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= target * (1 - 1e-9));
    if (count) stepSize = Math.max(1, stepSize === 2.5 ? 2 : Math.round(stepSize)); // 2.5 is no count; 2 when 4 steps of it still reach max
    if (count && stepSize * 4 < max) stepSize = Math.ceil(max / 4);
    const n = Math.max(1, Math.ceil(max / stepSize - 1e-9));
    const decimals = count ? 0 : Math.max(0, -Math.floor(Math.log10(stepSize) + 1e-9) + (String(stepSize / power).includes(".") ? 1 : 0));
    const fmt = new Intl.NumberFormat("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
    const ticks = [];
    for (let i = 0; i <= n; i++) ticks.push(Number((i * stepSize).toFixed(decimals)));
    return { ticks, top: ticks[ticks.length - 1], label: (v) => fmt.format(v) };
  }

  // buckets: [{t, values: {key: number}}]; keys: series in stacking order
  function stackedBars(buckets, keys, opts = {}) {
    // no wider than the page's content (a phone's): the SVG scales to its box, and a 760-wide
    // drawing shrunk to 350 px would print its labels at half size
    const W = Math.round(Math.min(opts.width || 760, Math.max(300, main.clientWidth - 50)));
    const H = opts.height || 180, left = 48, bottom = 22, top = 8, right = 8;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": opts.label || "chart" });
    if (!buckets.length) {
      put(svg, s("text", { x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle", text: "no data in this range" }));
      return svg;
    }
    const totals = buckets.map((b) => keys.reduce((sum, k) => sum + (b.values[k] || 0), 0));
    // the axis runs to the nice tick at or above the tallest bar; every gridline is labelled
    // with the value it stands at (counts: whole numbers only)
    const axis = niceTicks(Math.max(...totals), opts.count !== false);
    const max = axis.top;
    const plotW = W - left - right, plotH = H - top - bottom;
    const step = plotW / buckets.length;
    const barW = Math.max(2, Math.min(40, step * 0.75));
    for (const value of axis.ticks) {
      const y = top + plotH * (1 - value / max);
      put(svg, s("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid", "data-value": value }));
      put(svg, s("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "axis tick", "data-value": value, text: axis.label(value) }));
    }
    buckets.forEach((b, i) => {
      let y = top + plotH;
      const x = left + i * step + (step - barW) / 2;
      for (const k of keys) {
        const v = b.values[k] || 0;
        if (!v) continue;
        const hgt = (v / max) * plotH;
        y -= hgt;
        const rect = s("rect", { x, y, width: barW, height: Math.max(hgt, 0.5), class: `series s-${k}` });
        put(rect, s("title", { text: `${fmtTime(b.t, true)} · ${k}: ${fmtInt(v)}` }));
        put(svg, rect);
      }
    });
    const first = buckets[0].t, last = buckets[buckets.length - 1].t;
    put(svg, s("text", { x: left, y: H - 6, class: "axis", text: fmtTime(first, true) }));
    if (buckets.length > 1) put(svg, s("text", { x: W - right, y: H - 6, "text-anchor": "end", class: "axis", text: fmtTime(last, true) }));
    return svg;
  }

  function legend(keys) {
    return h("div", { class: "legend" }, keys.map((k) => h("span", { class: "legend-item" }, h("span", { class: `swatch s-${k}` }), k)));
  }

  // rows: [{t, key, value}] -> buckets for stackedBars
  function toBuckets(rows, keyField, valueField) {
    const byT = new Map();
    for (const row of rows) {
      if (!byT.has(row.t)) byT.set(row.t, { t: row.t, values: {} });
      const b = byT.get(row.t);
      b.values[row[keyField]] = (b.values[row[keyField]] || 0) + (row[valueField] || 0);
    }
    return [...byT.values()].sort((a, b) => a.t - b.t);
  }

  // a horizontal bar made of segments, one per key
  function shareBar(counts, keys) {
    const total = keys.reduce((sum, k) => sum + (counts[k] || 0), 0);
    const bar = h("div", { class: "sharebar", title: keys.filter((k) => counts[k]).map((k) => `${k}: ${fmtInt(counts[k])}`).join(" · ") });
    if (!total) return bar;
    for (const k of keys) {
      if (!counts[k]) continue;
      const seg = h("span", { class: `seg s-${k}` });
      seg.style.width = `${(counts[k] / total) * 100}%`;
      put(bar, seg);
    }
    return bar;
  }

  function meter(fraction, tone) {
    const bar = h("div", { class: "meter" });
    const fill = h("span", { class: `fill ${tone || ""}` });
    fill.style.width = `${Math.max(0, Math.min(1, fraction || 0)) * 100}%`;
    put(bar, fill);
    return bar;
  }

  // -- tables: sortable by a header, filtered by a text box, both kept in the page's URL --------

  // A table's view (opts.key names it in the URL): `<key>.sort=<column>` (a leading "-" sorts
  // descending) and `<key>.filter=<text>` in the hash's query, so a reload or a shared link
  // shows the same rows in the same order, and Back returns to the view before.
  // views: key -> {sort, desc, filter}, read from the URL when a page first draws the table,
  // then kept here so a live redraw (the sessions page polls) keeps what the user typed.
  let views = new Map();
  let liveTables = new Map(); // key -> the table on screen: {apply(), input}
  const collator = new Intl.Collator("en", { numeric: true, sensitivity: "base" });
  const slug = (label) => String(label).toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "");
  const isViewParam = (name) => name.endsWith(".sort") || name.endsWith(".filter");

  function readView(params, key) {
    const sort = params.get(`${key}.sort`) || "";
    return { sort: sort.replace(/^-/, ""), desc: sort.startsWith("-"), filter: params.get(`${key}.filter`) || "" };
  }

  function viewOf(key) {
    if (!views.has(key)) views.set(key, readView(parseHash().params, key));
    return views.get(key);
  }

  // the page's URL with `key`'s view in it; push: a new history entry (Back returns to the view before)
  function writeView(key, push) {
    const view = viewOf(key);
    const { path, params } = parseHash();
    if (view.sort) params.set(`${key}.sort`, `${view.desc ? "-" : ""}${view.sort}`); else params.delete(`${key}.sort`);
    if (view.filter) params.set(`${key}.filter`, view.filter); else params.delete(`${key}.filter`);
    const query = params.toString();
    const url = `#${path}${query ? `?${query}` : ""}`;
    if (url === location.hash) return;
    if (push) history.pushState(null, "", url); else history.replaceState(null, "", url);
    lastHash = location.hash;
  }

  // Back, Forward or an edited URL on the same page: the tables take the URL's views, no reload
  function applyViews(params) {
    for (const [key, live] of liveTables) {
      views.set(key, readView(params, key));
      live.apply();
    }
  }

  // an empty value (null, "", NaN) sorts last in both directions
  const empty = (v) => v === null || v === undefined || v === "" || (typeof v === "number" && Number.isNaN(v));

  function compareValues(a, b) {
    if (typeof a === "number" && typeof b === "number") return a - b;
    return collator.compare(String(a), String(b));
  }

  // columns: [{label, key | render, num, title, sort: (row) => value | false}]: a column sorts
  // by its `sort` value (numbers as numbers: durations in ms, costs in USD), else its key's
  // value, else its text; `sort: false` or no label: not sortable.
  // opts.key: the table's name in the URL (no key: neither sortable nor filterable);
  // opts.shown: a note when the server sent only some rows (the filter covers those);
  // opts.pinned(row): rows kept first whatever the sort (a total).
  function table(columns, rows, opts = {}) {
    const key = opts.key;
    const cols = columns.map((c) => ({ ...c, id: slug(c.label), sortable: !!key && c.sort !== false && !!slug(c.label) }));
    const tbody = h("tbody");
    const items = rows.map((row, index) => {
      const tr = h("tr", opts.rowProps ? opts.rowProps(row) : null);
      const values = {};
      for (const c of cols) {
        const value = c.render ? c.render(row) : row[c.key];
        const td = h("td", { class: c.num ? "num" : null }, value);
        put(tr, td);
        if (c.sortable) values[c.id] = c.sort ? c.sort(row) : c.key ? row[c.key] : td.textContent.trim();
      }
      return { tr, index, values, text: tr.textContent.toLowerCase(), pinned: opts.pinned ? opts.pinned(row) : false };
    });
    const headers = cols.map((c) => {
      if (!c.sortable) return h("th", { class: c.num ? "num" : null, title: c.title || null, text: c.label });
      const button = h("button", { type: "button", class: "sort-btn", "data-sort": c.id, title: c.title || null },
        c.label, h("span", { class: "sort-icon", "aria-hidden": "true" }));
      // unsorted (the server's order), ascending, descending, and back
      button.addEventListener("click", () => {
        const view = viewOf(key);
        if (view.sort !== c.id) { view.sort = c.id; view.desc = false; } else if (!view.desc) view.desc = true; else view.sort = "";
        writeView(key, true);
        apply();
      });
      return h("th", { class: `sortable${c.num ? " num" : ""}`, "data-col": c.id }, button);
    });
    const thead = h("thead", null, h("tr", null, headers));
    const grid = h("table", { class: `grid-table ${opts.class || ""}`, "data-table": key || null }, thead, tbody);
    const wrap = h("div", { class: "table-scroll" }, grid);
    if (!key) {
      for (const item of items) put(tbody, item.tr);
      if (!rows.length) put(tbody, h("tr", null, h("td", { colspan: cols.length, class: "muted empty", text: opts.empty || "nothing yet" })));
      return wrap;
    }

    const previous = liveTables.get(key);
    const input = h("input", {
      type: "search", class: "table-filter", placeholder: "Filter rows", "aria-label": `filter ${opts.label || key} rows`,
      "data-table": key, value: viewOf(key).filter, autocomplete: "off",
    });
    const count = h("span", { class: "muted table-count", "aria-live": "polite" });
    const note = opts.shown ? h("span", { class: "muted table-note", text: opts.shown }) : null;
    // typing: the rows follow at once; the URL a moment later, one history entry per visit to the box
    let typing = false, debounce = null;
    input.addEventListener("focus", () => { typing = false; });
    input.addEventListener("input", () => {
      viewOf(key).filter = input.value;
      apply();
      clearTimeout(debounce);
      debounce = setTimeout(() => { writeView(key, !typing); typing = true; }, 300);
    });

    function apply() {
      const view = viewOf(key);
      if (input.value !== view.filter) input.value = view.filter;
      const needle = view.filter.trim().toLowerCase();
      let shown = items.filter((item) => !needle || item.text.includes(needle));
      const col = cols.find((c) => c.sortable && c.id === view.sort);
      if (col) {
        shown = shown.slice().sort((a, b) => {
          if (a.pinned !== b.pinned) return a.pinned ? -1 : 1;
          const x = a.values[col.id], y = b.values[col.id];
          if (empty(x) || empty(y)) return empty(x) === empty(y) ? a.index - b.index : empty(x) ? 1 : -1;
          return (view.desc ? -compareValues(x, y) : compareValues(x, y)) || a.index - b.index;
        });
      }
      for (const [i, c] of cols.entries()) {
        if (!c.sortable) continue;
        const th = headers[i];
        const on = col === c;
        if (on) th.setAttribute("aria-sort", view.desc ? "descending" : "ascending"); else th.removeAttribute("aria-sort");
        th.querySelector(".sort-icon").textContent = on ? (view.desc ? "▼" : "▲") : "";
      }
      clear(tbody);
      for (const item of shown) put(tbody, item.tr);
      if (!rows.length) put(tbody, h("tr", null, h("td", { colspan: cols.length, class: "muted empty", text: opts.empty || "nothing yet" })));
      else if (!shown.length) put(tbody, h("tr", { class: "no-match" }, h("td", { colspan: cols.length, class: "muted empty", text: `no row matches “${view.filter.trim()}”` })));
      count.textContent = needle ? `${fmtInt(shown.length)} of ${fmtInt(rows.length)} rows` : "";
    }
    apply();
    liveTables.set(key, { apply, input });

    // a live redraw replaces the table: the keyboard stays where it was (the box, a header)
    const focused = previous && previous.root && previous.root.contains(document.activeElement) ? document.activeElement : null;
    const root = h("div", { class: "table-view", "data-table": key }, h("div", { class: "table-tools" }, input, count, note), wrap);
    liveTables.get(key).root = root;
    if (focused) {
      const again = focused.matches(".table-filter") ? input : root.querySelector(`.sort-btn[data-sort="${focused.dataset.sort}"]`);
      const [start, end] = focused.matches(".table-filter") ? [focused.selectionStart, focused.selectionEnd] : [null, null];
      typing = focused.matches(".table-filter");
      queueMicrotask(() => {
        if (!again || !again.isConnected) return;
        again.focus({ preventScroll: true });
        if (start !== null) again.setSelectionRange(start, end);
      });
    }
    return root;
  }

  // sort values: a cost in USD (no price: empty, so last), tokens in and out together
  const costOf = (r) => (r.cost_usd === null || r.cost_usd === undefined ? null : r.cost_usd);
  const tokenSum = (r) => (r.input_tokens === null && r.output_tokens === null ? null : (r.input_tokens || 0) + (r.output_tokens || 0));

  const statCard = (label, value, sub) => h("div", { class: "stat" }, h("div", { class: "stat-label", text: label }), h("div", { class: "stat-value", text: value }), sub ? h("div", { class: "stat-sub", text: sub }) : null);

  const turnHref = (session, turn) => `#/session/${encodeURIComponent(session)}?turn=${encodeURIComponent(turn)}`;
  const sessionLink = (id) => h("a", { href: `#/session/${encodeURIComponent(id)}`, class: "session-link", text: id });

  // -- pages ----------------------------------------------------------------------------------

  let page = null; // {stop()} of the page on screen

  function parseHash(hash = location.hash) {
    const raw = hash.replace(/^#/, "") || "/";
    const [path, query] = raw.split("?");
    const decode = (part) => { try { return decodeURIComponent(part); } catch (e) { return part; } };
    return { path, parts: path.split("/").filter(Boolean).map(decode), params: new URLSearchParams(query || "") };
  }

  // what names a page: its path and its parameters but the tables' views
  function pageOf(hash) {
    const { path, params } = parseHash(hash);
    for (const name of [...params.keys()]) if (isViewParam(name)) params.delete(name);
    params.sort();
    return `${path}?${params}`;
  }

  let lastHash = null; // the hash the page on screen shows

  // a new hash: the same page with other table views takes them in place (Back after a sort
  // or a filter); another page is drawn anew
  function navigate() {
    const previous = lastHash;
    lastHash = location.hash;
    if (previous === lastHash) return;
    if (page && previous !== null && pageOf(previous) === pageOf(lastHash)) applyViews(parseHash().params);
    else route();
  }

  function route() {
    if (page && page.stop) page.stop();
    showError(null);
    lastHash = location.hash;
    views = new Map();
    liveTables = new Map();
    const { parts, params } = parseHash();
    const name = parts[0] || "sessions";
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.route === (name === "session" ? "sessions" : name));
    clear(main);
    if (name === "session" && parts[1] !== undefined) page = timelinePage(parts[1], params);
    else if (name === "tools") page = toolsPage();
    else if (name === "turns") page = turnsPage();
    else if (name === "declared") page = declaredPage();
    else if (EXTRA[name]) page = EXTRA[name](kit, params, parts);
    else page = sessionsPage(params);
  }

  // A page that reloads itself every `ms` while visible; `load` returns a promise.
  function poller(load, ms) {
    let timer = null, stopped = false, busy = false;
    const tick = async () => {
      if (stopped) return;
      if (!document.hidden && !busy) {
        busy = true;
        try {
          await load();
          showError(null);
        } catch (err) {
          showError(err);
        } finally {
          busy = false;
        }
      }
      if (!stopped && ms) timer = setTimeout(tick, ms);
    };
    tick();
    return { stop() { stopped = true; clearTimeout(timer); }, now: () => load().catch(showError) };
  }

  // -- sessions -------------------------------------------------------------------------------

  function sessionsPage(params) {
    let query = params.get("q") || "";
    let limit = 50;
    const stats = h("section", { class: "stats" });
    const reasons = h("div", { class: "reason-chips" });
    const search = h("input", { type: "search", id: "session-search", placeholder: "Search sessions by id, agent, model or content (a tool, a word of a message, a result, an error)", value: query, "aria-label": "search sessions" });
    const count = h("span", { class: "muted" });
    const list = h("div", { class: "session-list" });
    const hits = h("div", { class: "search-hits", id: "search-hits" });
    const more = h("button", { class: "btn", hidden: true, text: "Show more", onclick: () => { limit += 50; poll.now(); } });
    put(main, 
      h("h1", { text: "Sessions" }), stats, reasons,
      h("div", { class: "toolbar" }, search, count), list, more, hits,
    );
    let debounce = null;
    search.addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => {
        query = search.value.trim();
        limit = 50;
        const { params: kept } = parseHash();
        if (query) kept.set("q", query); else kept.delete("q");
        history.replaceState(null, "", kept.toString() ? `#/?${kept}` : "#/");
        lastHash = location.hash;
        poll.now();
      }, 250);
    });

    async function load() {
      const overview = await getJSON("/api/overview");
      renderStats(overview);
      const data = query || limit > 50 ? await getJSON("/api/sessions", { q: query, limit }) : { sessions: overview.sessions, total: overview.sessions_total };
      fill(list, sessionsTable(data.sessions, data.total));
      count.textContent = `${fmtInt(data.sessions.length)} of ${fmtInt(data.total)} sessions${query ? ` matching “${query}”` : ""}`;
      more.hidden = data.sessions.length >= data.total;
      if (EXTRA.searchHits) await EXTRA.searchHits(kit, hits, query);
      setStatus(`${overview.store} · updated ${fmtTime(overview.generated_at)}`, overview.sessions.some((x) => x.live));
    }

    function renderStats(o) {
      const t = o.totals;
      fill(stats, 
        statCard("Sessions", fmtInt(t.sessions), t.last_at ? `last active ${fmtAgo(t.last_at)}` : "none yet"),
        statCard("Events", fmtInt(t.events)),
        statCard("Turns", fmtInt(t.turns)),
        statCard("Tool calls", fmtInt(t.tool_calls), "in finished turns"),
        statCard("Tokens", `${fmtInt(t.input_tokens)} / ${fmtInt(t.output_tokens)}`, "input / output"),
        statCard("Turn latency", `${fmtMs(t.latency_p50_ms)} / ${fmtMs(t.latency_p95_ms)}`, "p50 / p95"),
        costCard(t),
      );
      fill(reasons, h("span", { class: "muted", text: "Loop end reasons:" }),
        o.loop_end_reasons.length ? o.loop_end_reasons.map((r) => h("span", { class: "chip" }, reasonBadge(r.reason), ` ${fmtInt(r.turns)}`)) : h("span", { class: "muted", text: " none yet" }));
    }

    function sessionsTable(rows, total) {
      return table([
        { label: "Session", sort: (r) => r.session_id, render: (r) => [r.live ? h("span", { class: "live-dot", title: "active in the last 30 s" }) : null, sessionLink(r.session_id)] },
        { label: "Agents", sort: (r) => r.agents.join(", "), render: (r) => r.agents.join(", ") || "–" },
        { label: "Model", sort: (r) => r.models.join(", "), render: (r) => r.models.join(", ") || "–" },
        { label: "Turns", num: true, sort: (r) => r.turns, render: (r) => fmtInt(r.turns) },
        { label: "Events", num: true, sort: (r) => r.event_count, render: (r) => fmtInt(r.event_count) },
        { label: "Tool calls", num: true, sort: (r) => r.tool_calls, render: (r) => fmtInt(r.tool_calls) },
        { label: "Tokens in / out", num: true, title: "sorts by input and output together", sort: tokenSum, render: (r) => `${fmtInt(r.input_tokens)} / ${fmtInt(r.output_tokens)}` },
        { label: "Cost", num: true, title: "USD, summed over the model calls that have a price", sort: costOf, render: (r) => costNode(r.cost_usd, r.unpriced_calls, r.model_calls) },
        { label: "Last loop end", sort: (r) => r.last_loop_end_reason, render: (r) => (r.last_loop_end_reason ? reasonBadge(r.last_loop_end_reason) : h("span", { class: "muted", text: r.turns ? "–" : "running" })) },
        { label: "Last active", sort: (r) => r.last_at, render: (r) => h("span", { title: fmtTime(r.last_at, true), text: fmtAgo(r.last_at) }) },
      ], rows, {
        key: "sessions", label: "sessions", class: "sessions", empty: query ? "no session matches" : "no sessions yet: run an instrumented agent, or `loopscope demo`",
        shown: rows.length < total ? `the filter covers the ${fmtInt(rows.length)} sessions shown; the search above covers all ${fmtInt(total)}` : null,
      });
    }

    const poll = poller(load, POLL_LIST_MS);
    return poll;
  }

  // -- a session's timeline ---------------------------------------------------------------------

  function timelinePage(sessionId, params) {
    const state = {
      events: new Map(), // index -> event
      turns: new Map(), // correlation id -> summary
      minIndex: null, maxIndex: 0, cursor: 0, moreBefore: false,
      blocked: params.get("blocked") === "1",
      live: true,
      calls: new Map(), // correlation id -> the turn's model calls, as the API sends them
      scores: new Map(), // correlation id -> the scores of the turn, its calls and its tools
      open: new Set(), // keys of <details> the user opened
      pins: new Set(), // waterfall rows whose details the user opened (by a click, a tap or Enter)
      info: null,
    };
    const header = h("div", { class: "session-head" });
    const liveBox = h("input", { type: "checkbox", id: "live-toggle", checked: true });
    const blockedBox = h("input", { type: "checkbox", id: "blocked-toggle", checked: state.blocked });
    const earlier = h("button", { class: "btn", id: "load-earlier", hidden: true, text: "Load earlier events" });
    const body = h("div", { class: "timeline", id: "timeline" });
    put(main, 
      h("p", { class: "crumbs" }, h("a", { href: "#/", text: "Sessions" }), " / ", h("span", { text: sessionId })),
      header,
      h("div", { class: "toolbar" },
        h("label", { class: "toggle" }, liveBox, " Live updates"),
        h("label", { class: "toggle" }, blockedBox, " Show blocked rows"),
      ),
      earlier, body,
    );
    liveBox.addEventListener("change", () => { state.live = liveBox.checked; if (state.live) poll.now(); render(); });
    blockedBox.addEventListener("change", () => {
      history.replaceState(null, "", `#/session/${encodeURIComponent(sessionId)}${blockedBox.checked ? "?blocked=1" : ""}`);
      route();
    });
    earlier.addEventListener("click", async () => {
      try {
        const data = await getJSON("/api/timeline", { session: sessionId, before: state.minIndex, blocked: state.blocked });
        merge(data, "before");
        render();
      } catch (err) {
        showError(err);
      }
    });

    let wantedTurn = params.get("turn"), seeking = 0;
    function revealTurn() {
      const block = [...body.querySelectorAll("section.turn")].find((b) => b.dataset.correlationId === wantedTurn);
      if (block) {
        wantedTurn = null;
        block.classList.add("target");
        queueMicrotask(() => block.scrollIntoView({ block: "start" }));
      } else if (state.moreBefore && seeking++ < 50) queueMicrotask(() => earlier.click());
    }
    let first = true;
    let rendered = false;
    let lastFingerprint = "";

    function merge(data, direction) {
      state.info = data;
      for (const e of data.events) {
        state.events.set(e.index, e);
        state.maxIndex = Math.max(state.maxIndex, e.index);
        state.minIndex = state.minIndex === null ? e.index : Math.min(state.minIndex, e.index);
      }
      for (const t of data.turns) state.turns.set(t.correlation_id, t);
      // the page's turns' model calls (finished turns and running ones): each turn's list
      // in a response is whole, so it replaces the one held
      const calls = new Map();
      for (const c of data.model_calls || []) {
        if (!calls.has(c.turn_id)) calls.set(c.turn_id, []);
        calls.get(c.turn_id).push(c);
      }
      for (const [id, list] of calls) state.calls.set(id, list);
      const scores = new Map(); // each turn's scores in a response are whole too
      for (const sc of data.scores || []) scores.set(sc.turn_id, [...(scores.get(sc.turn_id) || []), sc]);
      for (const [id, list] of scores) state.scores.set(id, list);
      // the server's cursor also passes rows the page leaves out (blocked ones), as Store.replay's does
      state.cursor = Math.max(state.cursor, state.maxIndex, data.cursor ?? 0);
      if (direction !== "after") state.moreBefore = !!data.more_before;
      return data;
    }

    function waitingTurns() {
      const ids = new Set();
      for (const e of state.events.values()) if (e.correlation_id && !state.turns.has(e.correlation_id)) ids.add(e.correlation_id);
      return [...ids].slice(-100);
    }

    async function load() {
      if (!first && !state.live) return;
      let data;
      if (first) {
        data = merge(await getJSON("/api/timeline", { session: sessionId, blocked: state.blocked }), "newest");
        first = false;
      } else {
        do {
          data = merge(await getJSON("/api/timeline", {
            session: sessionId, after: state.cursor, blocked: state.blocked, turns: waitingTurns().join(","),
          }), "after");
        } while (data.more_after);
      }
      let calls = 0;
      for (const list of state.calls.values()) calls += list.length;
      let scored = 0;
      for (const list of state.scores.values()) scored += list.length;
      const fingerprint = `${state.events.size}:${state.maxIndex}:${state.turns.size}:${calls}:${scored}:${state.live}`;
      if (fingerprint !== lastFingerprint) {
        lastFingerprint = fingerprint;
        render();
      }
      setStatus(`session ${sessionId} · updated ${fmtTime(data.generated_at)}`, state.live && data.last_at && Date.now() - data.last_at < 30000);
    }

    function render() {
      const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      // a live redraw replaces the rows: the waterfall row the keyboard was on keeps the focus
      const focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement.dataset.wfKey : null;
      renderHeader();
      earlier.hidden = !state.moreBefore;
      clear(body);
      const events = [...state.events.values()].sort((a, b) => a.index - b.index);
      if (!events.length) {
        put(body, h("p", { class: "muted empty", text: state.info && !state.info.found ? `No session “${sessionId}” in this store (yet).` : "No events yet." }));
      }
      // one block per turn, in order of first appearance; events without a turn get their own
      const groups = [];
      const byTurn = new Map();
      for (const e of events) {
        const key = e.correlation_id || `event:${e.index}`;
        if (!byTurn.has(key)) {
          const group = { key, correlationId: e.correlation_id, events: [] };
          byTurn.set(key, group);
          groups.push(group);
        }
        byTurn.get(key).events.push(e);
      }
      for (const group of groups) put(body, turnBlock(group));
      if (wantedTurn) revealTurn();
      if (focused) for (const row of body.querySelectorAll(".wf-row[data-wf-key]")) if (row.dataset.wfKey === focused) row.focus({ preventScroll: true });
      if (atBottom && rendered) window.scrollTo(0, document.body.scrollHeight);
      rendered = true;
    }

    function renderHeader() {
      const summaries = [...state.turns.values()];
      const shown = new Set([...state.events.values()].map((e) => e.correlation_id).filter(Boolean));
      const runningTurns = [...shown].filter((id) => !state.turns.has(id)).length;
      const agents = [...new Set(summaries.map((t) => t.agent).filter(Boolean))];
      const info = state.info || {};
      fill(header,
        h("h1", { class: "session-title", text: sessionId }),
        h("div", { class: "session-meta" },
          h("span", { text: plural(info.last_index || 0, "event") }),
          h("span", { text: `${plural(shown.size, "turn")} shown${runningTurns ? `, ${fmtInt(runningTurns)} running` : ""}` }),
          agents.length ? h("span", { text: `agents: ${agents.join(", ")}` }) : null,
          info.first_at ? h("span", { text: `${fmtTime(info.first_at, true)} → ${fmtTime(info.last_at, true)}` }) : null,
          h("a", { class: "compare-link", href: `#/diff?a=${encodeURIComponent(sessionId)}`, text: "Compare with…" }),
        ),
      );
    }

    function detailsBlock(key, label, value, opts = {}) {
      const text = pretty(value);
      const short = text.split("\n").length <= 12 && text.length <= 1200;
      const d = h("details", { class: `payload ${opts.class || ""}`, open: state.open.has(key) || (opts.open && short && !state.open.has(`closed:${key}`)) });
      put(d, h("summary", null, h("span", { class: "payload-label", text: label }), h("span", { class: "payload-peek", text: text.replace(/\s+/g, " ").slice(0, 140) })));
      put(d, h("pre", { class: "payload-body", text }));
      d.addEventListener("toggle", () => {
        if (d.open) { state.open.add(key); state.open.delete(`closed:${key}`); } else { state.open.delete(key); state.open.add(`closed:${key}`); }
      });
      return d;
    }

    function fullButton(e) {
      if (!e.truncated) return null;
      return h("button", {
        class: "btn small", text: "Load in full",
        onclick: async () => {
          try {
            const full = await getJSON("/api/event", { id: e.id });
            state.events.set(full.index, full);
            render();
          } catch (err) {
            showError(err);
          }
        },
      });
    }

    function turnBlock(group) {
      const summary = group.correlationId ? state.turns.get(group.correlationId) : null;
      const running = group.correlationId && !summary;
      const firstEvent = group.events[0];
      const block = h("section", {
        class: `turn ${running ? "running" : "finished"}`,
        "data-correlation-id": group.correlationId || "",
        "data-state": running ? "running" : "finished",
      });
      const agent = (summary && summary.agent) || firstEvent.agent;
      put(block, h("header", { class: "turn-head" },
        h("span", { class: "turn-title", text: group.correlationId ? "Turn" : "Event" }),
        agent ? h("span", { class: "turn-agent", text: agent }) : null,
        summary && summary.model ? h("span", { class: "muted turn-model", text: summary.model }) : null,
        h("span", { class: "muted", text: fmtTime(firstEvent.t) }),
        h("span", { class: "spacer" }),
        summary ? h("span", { class: "turn-head-cost" }, turnCost(summary)) : null,
        summary ? reasonBadge(summary.loop_end_reason) : running ? badge("running", "run", "reason") : null,
      ));
      if (scoresUi && group.correlationId) put(block, scoresUi.turnScores(state.scores.get(group.correlationId)));
      // tool cards: one per call id, placed where the call started
      const cards = new Map();
      const items = [];
      for (const e of group.events) {
        const c = e.content || {};
        // a call the model asked for without an id: its span's rows (their ids but the last letter)
        const callKey = c.type === "tool_call" ? c.tool_id || (e.id ? `span:${e.id.slice(0, -1)}` : "") : "";
        if (callKey) {
          let card = cards.get(callKey);
          if (!card) {
            card = { start: null, end: null };
            cards.set(callKey, card);
            items.push({ card, id: callKey });
          }
          if (e.type === "tool_call_end") card.end = e;
          else card.start = card.start || e;
        } else {
          items.push({ event: e });
        }
      }
      const timing = timingBlock(group, summary, cards);
      if (timing) put(block, timing);
      const list = h("div", { class: "turn-body" });
      for (const item of items) put(list, item.card ? toolCard(item.card) : messageRow(item.event));
      put(block, list);
      put(block, summary ? turnSummary(summary) : running ? h("footer", { class: "turn-summary pending" }, h("span", { class: "spinner" }), " Turn still running — its summary appears when the loop ends.") : null);
      return block;
    }

    // the turn's model calls (from the API) and tool calls (from their rows) as one waterfall
    function timingBlock(group, summary, cards) {
      const calls = group.correlationId ? callsOf(group.correlationId) : [];
      const bars = calls.map(callBar);
      for (const card of cards.values()) bars.push(toolBar(card));
      if (!bars.length) return null;
      const starts = bars.map((b) => b.start);
      const ends = bars.map((b) => (b.end === null ? b.start : b.end));
      let origin = summary && summary.latency_ms !== null ? summary.t - summary.latency_ms : group.events[0].t;
      origin = Math.min(origin, ...starts);
      const until = Math.max(summary ? summary.t : Date.now(), ...ends);
      // start order; a model call before the tool call it asked for when both start in the same ms
      bars.sort((a, b) => a.start - b.start || (a.kind === b.kind ? 0 : a.kind === "call" ? -1 : 1));
      const key = `${group.correlationId || group.key}:timing`;
      const d = h("details", { class: "wf-box", open: !state.open.has(`closed:${key}`) });
      const tools = bars.length - calls.length;
      put(d, h("summary", null,
        h("span", { class: "payload-label", text: "Timing" }),
        h("span", { class: "muted", text: `${plural(calls.length, "model call")} · ${plural(tools, "tool call")} · ${fmtMs(until - origin)}` }),
      ));
      put(d, waterfall(bars, origin, until, { pins: state.pins, key: group.correlationId || group.key }));
      d.addEventListener("toggle", () => { if (d.open) state.open.delete(`closed:${key}`); else state.open.add(`closed:${key}`); });
      return d;
    }

    // the turn's model calls in the waterfall's terms: epoch ms, position order
    function callsOf(turnId) {
      const num = (v) => (v === null || v === undefined ? null : Number(v));
      return (state.calls.get(turnId) || []).map((c) => {
        const start = num(c.start_ms ?? c.started_at ?? c.start ?? c.t);
        let end = num(c.end_ms ?? c.ended_at ?? c.end);
        if (end === null && c.duration_ms !== null && c.duration_ms !== undefined) end = start + c.duration_ms;
        return { ...c, start, end, ttfc: num(c.time_to_first_chunk_ms ?? c.ttfc_ms) };
      }).filter((c) => c.start !== null).sort((a, b) => (a.position ?? 0) - (b.position ?? 0) || a.start - b.start);
    }

    function callBar(c) {
      const name = c.response_model || c.request_model || c.model || c.provider || "model";
      const outcome = c.end === null ? "running" : c.outcome || "completed";
      const tokens = [];
      if (c.input_tokens !== null && c.input_tokens !== undefined) tokens.push(`${fmtInt(c.input_tokens)} in`);
      if (c.output_tokens !== null && c.output_tokens !== undefined) tokens.push(`${fmtInt(c.output_tokens)} out`);
      const cache = [["cache read", c.cache_read_input_tokens], ["cache write", c.cache_creation_input_tokens], ["reasoning", c.reasoning_tokens]]
        .filter(([, v]) => v).map(([k, v]) => `${k} ${fmtInt(v)}`);
      const lines = [
        `model call #${c.position ?? "?"}: ${name}${c.provider ? ` (${c.provider})` : ""}`,
        `${fmtMs(c.end === null ? null : c.duration_ms ?? c.end - c.start)}${c.ttfc !== null && c.ttfc !== undefined ? ` · first chunk after ${fmtMs(c.ttfc)}` : ""}${c.streaming ? " · streamed" : ""}`,
        `tokens: ${tokens.length ? tokens.join(" / ") : "–"}${cache.length ? ` (${cache.join(", ")})` : ""}`,
        `cost: ${c.cost_usd === null || c.cost_usd === undefined ? "— (no price)" : fmtUsd(c.cost_usd)}`,
        `outcome: ${outcome}${c.finish_reasons && c.finish_reasons.length ? ` · finish: ${c.finish_reasons.join(", ")}` : ""}`,
        c.error ? `error: ${c.error_type ? `${c.error_type}: ` : ""}${c.error}` : null,
        c.refusal ? `refusal: ${c.refusal}` : null,
      ];
      return {
        kind: "call", name, start: c.start, end: c.end, duration: c.duration_ms, ttfc: c.ttfc, outcome,
        title: lines.filter(Boolean).join("\n"),
        key: c.position, attrs: { "data-position": c.position, "data-cost": c.cost_usd ?? "" },
      };
    }

    function toolBar(card) {
      const last = card.end || card.start;
      const c = last.content;
      const ms = card.end ? card.end.content.duration_ms : null;
      let start, end;
      if (card.start) {
        start = card.start.t;
        end = card.end ? (ms !== null && ms !== undefined ? start + ms : card.end.t) : null;
      } else {
        end = card.end.t;
        start = ms !== null && ms !== undefined ? end - ms : end;
      }
      const outcome = card.end ? c.outcome || c.status || "ended" : "running";
      const lines = [`tool call: ${c.tool_name} (${c.tool_id})`, end === null ? "running" : fmtMs(end - start), `outcome: ${outcome}`, c.error ? `error: ${c.error}` : null];
      return { kind: "tool", name: c.tool_name || "(unnamed)", start, end, duration: ms, ttfc: null, outcome, title: lines.filter(Boolean).join("\n"), key: c.tool_id, attrs: { "data-tool-id": c.tool_id } };
    }

    function messageRow(e) {
      const c = e.content || {};
      const role = c.role || e.type;
      const blocked = e.status === "blocked";
      const text = c.type === "text" ? c.body : pretty(c.value !== undefined ? c.value : c);
      return h("div", { class: `msg role-${role === "user" ? "user" : "assistant"}${blocked ? " blocked" : ""}`, "data-index": e.index },
        h("div", { class: "msg-meta" },
          h("span", { class: "msg-role", text: role }),
          blocked ? badge("blocked", "warn") : null,
          h("span", { class: "muted", text: `#${e.index} · ${fmtClock(e.t)}` }),
        ),
        h("div", { class: "msg-text", text }),
        fullButton(e),
      );
    }

    function toolCard(card) {
      const last = card.end || card.start;
      const c = last.content;
      const finished = !!card.end;
      const outcome = finished ? c.outcome || c.status || "ended" : "running";
      const blocked = last.status === "blocked";
      const el = h("div", {
        class: `tool-card ${finished ? "done" : "running"}${blocked ? " blocked" : ""}`,
        "data-tool-id": c.tool_id, "data-state": outcome,
      });
      const duration = finished
        ? h("span", { class: "duration", text: fmtMs(c.duration_ms) })
        : h("span", { class: "duration elapsed", "data-since": card.start ? card.start.t : last.t, text: fmtMs(Date.now() - (card.start ? card.start.t : last.t)) });
      put(el, h("div", { class: "tool-head" },
        h("span", { class: "tool-icon", "aria-hidden": "true", text: "⚙" }),
        h("span", { class: "tool-name", text: c.tool_name }),
        finished ? badge(outcome, OUTCOME_TONE[outcome] || "muted", "outcome") : h("span", { class: "badge run outcome" }, h("span", { class: "spinner" }), " running"),
        blocked ? badge("blocked row", "warn") : null,
        duration,
        h("span", { class: "spacer" }),
        h("span", { class: "muted mono", text: c.tool_id }),
        h("span", { class: "muted", text: fmtClock((card.start || last).t) }),
      ));
      const args = (card.start || last).content.arguments;
      const key = c.tool_id;
      const payloads = h("div", { class: "payloads" }, detailsBlock(`${key}:args`, "Arguments", args, { open: true }));
      if (finished) {
        if (c.result !== null && c.result !== undefined) put(payloads, detailsBlock(`${key}:result`, "Result", c.result, { open: true }));
        if (c.error) put(payloads, detailsBlock(`${key}:error`, "Error", c.error, { open: true, class: "error" }));
      }
      put(el, scoresUi && last.correlation_id ? scoresUi.toolScores(state.scores.get(last.correlation_id), c.tool_id) : null);
      put(el, payloads, fullButton(last));
      return el;
    }

    function turnSummary(t) {
      const usage = t.usage || {};
      const extraUsage = Object.entries(usage).filter(([k]) => k !== "input_tokens" && k !== "output_tokens" && usage[k]);
      return h("footer", { class: "turn-summary" },
        h("span", { class: "sum-item" }, "Loop ended: ", reasonBadge(t.loop_end_reason)),
        modelCalls(t) === null ? null : h("span", { class: "sum-item", title: "model calls the turn made", text: plural(modelCalls(t), "model call") }),
        h("span", { class: "sum-item", title: "tool rounds: model calls that asked for tools (RoomKit's round count)", text: plural(t.round_count, "tool round") }),
        h("span", { class: "sum-item", text: plural(t.tool_calls_count, "tool call") }),
        h("span", { class: "sum-item", title: extraUsage.map(([k, v]) => `${k}: ${fmtInt(v)}`).join(", ") || null, text: `${fmtInt(t.input_tokens || 0)} in / ${fmtInt(t.output_tokens || 0)} out tokens` }),
        h("span", { class: "sum-item", text: `latency ${fmtMs(t.latency_ms)}` }),
        "cost_usd" in t ? h("span", { class: "sum-item turn-cost" }, "cost ", turnCost(t)) : null,
        t.declared_tools && t.declared_tools.length ? h("span", { class: "sum-item muted", text: `offered: ${t.declared_tools.join(", ")}` }) : null,
        t.error ? h("span", { class: "sum-item error-text", text: t.error }) : null,
        h("a", { class: "sum-item compare-link", href: `#/diff?a=${encodeURIComponent(t.correlation_id)}&s=${encodeURIComponent(t.session_id || "")}`, text: "Compare turn with…" }),
      );
    }

    // running tools: tick their elapsed time without a reload
    const ticker = setInterval(() => {
      for (const el of body.querySelectorAll(".elapsed")) el.textContent = fmtMs(Date.now() - Number(el.dataset.since));
    }, 250);
    const poll = poller(load, POLL_TIMELINE_MS);
    const unwatch = scoresUi ? scoresUi.watch(sessionId, () => [...state.turns.keys()].slice(-200), (list, ids) => {
      const before = JSON.stringify([...state.scores]);
      for (const id of ids) state.scores.set(id, list.filter((sc) => sc.turn_id === id));
      if (JSON.stringify([...state.scores]) !== before) render();
    }) : () => {};
    return { stop() { poll.stop(); unwatch(); clearInterval(ticker); } };
  }

  // -- analytics --------------------------------------------------------------------------------

  function currentRange() {
    const saved = localStorage.getItem("loopscope.range");
    return RANGES.includes(saved) ? saved : "7d";
  }

  function rangePicker(onChange) {
    const box = h("div", { class: "range-picker", role: "group", "aria-label": "time range" });
    const draw = () => {
      clear(box);
      for (const r of RANGES) {
        put(box, h("button", {
          class: `btn small${r === currentRange() ? " active" : ""}`, text: r === "all" ? "all time" : `last ${r}`,
          onclick: () => { localStorage.setItem("loopscope.range", r); draw(); onChange(); },
        }));
      }
    };
    draw();
    return box;
  }

  function analyticsPage(title, intro, render) {
    const content = h("div", { class: "analytics" });
    const refresh = h("button", { class: "btn small", text: "Refresh", onclick: () => poll.now() });
    put(main, h("div", { class: "page-head" }, h("h1", { text: title }), h("span", { class: "spacer" }), rangePicker(() => poll.now()), refresh), h("p", { class: "muted intro", text: intro }), content);
    const poll = poller(async () => {
      setStatus(`${title} · loading…`, false);
      if (!content.firstChild) put(content, h("p", { class: "muted", text: "Loading…" }));
      await render(content, currentRange());
      setStatus(`${title} · updated ${fmtTime(Date.now())}`, false);
    }, 0);
    return poll;
  }

  function toolsPage() {
    let selected = null;
    let cache = null;
    return analyticsPage("Tools", "Every tool call in the range: how often, how it ended, how long it took.", async (content, range) => {
      const data = await getJSON("/api/tools", { range, tool: selected });
      cache = data;
      draw(content, data);
    });

    function draw(content, data) {
      const rows = data.tools;
      const chartBuckets = toBuckets(data.over_time, "outcome", "calls");
      const failing = rows.filter((r) => r.failures).sort((a, b) => b.failure_share - a.failure_share);
      fill(content, 
        h("section", { class: "stats" },
          statCard("Tool calls", fmtInt(rows.reduce((n, r) => n + r.calls, 0))),
          statCard("Tools", fmtInt(rows.length)),
          statCard("Failure share", fmtPct(rows.reduce((n, r) => n + r.failures, 0) / Math.max(1, rows.reduce((n, r) => n + r.ended, 0))), "ended other than served"),
          statCard("Running", fmtInt(rows.reduce((n, r) => n + r.running, 0)), "started, not ended"),
          failing.length ? statCard("Most failing", failing[0].tool, `${fmtPct(failing[0].failure_share)} of ${fmtInt(failing[0].ended)}`) : null,
        ),
        h("section", { class: "panel" },
          h("h2", { text: "Calls per tool" }),
          table([
            { label: "Tool", sort: (r) => r.tool, render: (r) => h("a", { href: "#/tools", class: `tool-link${selected === r.tool ? " active" : ""}`, text: r.tool || "(unnamed)", onclick: (ev) => { ev.preventDefault(); selected = selected === r.tool ? null : r.tool; page.now(); } }) },
            { label: "Calls", num: true, sort: (r) => r.calls, render: (r) => fmtInt(r.calls) },
            { label: "Running", num: true, sort: (r) => r.running, render: (r) => (r.running ? badge(fmtInt(r.running), "run") : "0") },
            { label: "Outcomes", sort: false, render: (r) => shareBar(r, [...OUTCOMES, "other"]) },
            { label: "Failure share", num: true, title: "share of ended calls whose outcome is not served", sort: (r) => r.failure_share, render: (r) => (r.failures ? h("a", { href: `#/calls?tool=${encodeURIComponent(r.tool || "")}&failed=1`, class: `failed-calls-link${r.failure_share > 0.1 ? " error-text" : ""}`, title: "this tool's failed calls", text: fmtPct(r.failure_share) }) : fmtPct(r.failure_share)) },
            { label: "p50", num: true, sort: (r) => r.p50_ms, render: (r) => fmtMs(r.p50_ms) },
            { label: "p95", num: true, sort: (r) => r.p95_ms, render: (r) => fmtMs(r.p95_ms) },
            { label: "p99", num: true, sort: (r) => r.p99_ms, render: (r) => fmtMs(r.p99_ms) },
            { label: "max", num: true, sort: (r) => r.max_ms, render: (r) => fmtMs(r.max_ms) },
            { label: "Last seen", sort: (r) => r.last_seen, render: (r) => h("span", { title: fmtTime(r.last_seen, true), text: fmtAgo(r.last_seen) }) },
          ], rows, { key: "tools", label: "tools", class: "tools", empty: "no tool calls in this range", rowProps: (r) => ({ "data-tool": r.tool, class: selected === r.tool ? "selected" : null }) }),
          legend(OUTCOMES),
        ),
        h("section", { class: "panel" },
          h("h2", { text: `Calls over time${selected ? ` — ${selected}` : ""}` }),
          h("p", { class: "muted", text: `by outcome, per ${fmtBucket(data.bucket_seconds)}${selected ? " (click the tool again for all tools)" : " (click a tool to see it alone)"}` }),
          stackedBars(chartBuckets, OUTCOMES.concat(["unknown"]), { label: "tool calls over time" }),
          legend(OUTCOMES),
        ),
      );
    }
  }

  function turnsPage() {
    return analyticsPage("Turns", "Why agent loops stopped, what they cost in tokens, how long they took.", async (content, range) => {
      const data = await getJSON("/api/turns", { range });
      const reasons = data.loop_end_reasons.map((r) => r.reason);
      const reasonOrder = Object.keys(REASON_TONE).concat(["unknown"]);
      const total = data.loop_end_reasons.reduce((n, r) => n + r.turns, 0);
      const overall = data.latency[0];
      const tokens = toBuckets(
        data.over_time.flatMap((r) => [{ t: r.t, kind: "input", n: r.input_tokens }, { t: r.t, kind: "output", n: r.output_tokens }]), "kind", "n");
      fill(content, 
        h("section", { class: "stats" },
          statCard("Turns", fmtInt(total)),
          statCard("Completed", fmtPct(total ? (data.loop_end_reasons.find((r) => r.reason === "completed") || { turns: 0 }).turns / total : null)),
          statCard("Latency p50 / p95", overall ? `${fmtMs(overall.p50_ms)} / ${fmtMs(overall.p95_ms)}` : "–"),
          statCard("Tokens in / out", `${fmtInt(data.models.reduce((n, m) => n + m.input_tokens, 0))} / ${fmtInt(data.models.reduce((n, m) => n + m.output_tokens, 0))}`),
        ),
        h("div", { class: "two-col" },
          h("section", { class: "panel" },
            h("h2", { text: "Loop end reasons" }),
            data.loop_end_reasons.length
              ? h("div", { class: "bars" }, data.loop_end_reasons.map((r) => h("div", { class: "bar-row", "data-reason": r.reason },
                reasonBadge(r.reason), meter(r.share, REASON_TONE[r.reason] || "muted"), h("span", { class: "num", text: `${fmtInt(r.turns)} · ${fmtPct(r.share)}` }))))
              : h("p", { class: "muted", text: "no turns in this range" }),
          ),
          h("section", { class: "panel" },
            h("h2", { text: "Turns over time" }),
            h("p", { class: "muted", text: `by loop end reason, per ${fmtBucket(data.bucket_seconds)}` }),
            stackedBars(toBuckets(data.over_time, "reason", "turns"), reasonOrder, { label: "turns over time", width: 460, height: 200 }),
            legend(reasonOrder.filter((r) => reasons.includes(r))),
          ),
        ),
        h("div", { class: "two-col" },
          h("section", { class: "panel" },
            h("h2", { text: "Tokens by model" }),
            table([
              { label: "Model", key: "model" },
              { label: "Provider", key: "provider" },
              { label: "Turns", num: true, sort: (r) => r.turns, render: (r) => fmtInt(r.turns) },
              { label: "Input", num: true, sort: (r) => r.input_tokens, render: (r) => fmtInt(r.input_tokens) },
              { label: "Output", num: true, sort: (r) => r.output_tokens, render: (r) => fmtInt(r.output_tokens) },
              { label: "Per turn", num: true, sort: (r) => r.avg_tokens, render: (r) => fmtInt(r.avg_tokens) },
              { label: "Cost", num: true, sort: costOf, render: (r) => costNode(r.cost_usd, r.unpriced_calls, r.model_calls) },
            ], data.models, { key: "models", label: "models", class: "models", empty: "no turns in this range" }),
          ),
          h("section", { class: "panel" },
            h("h2", { text: "Tokens over time" }),
            stackedBars(tokens, ["input", "output"], { label: "tokens over time", width: 460, height: 200 }),
            legend(["input", "output"]),
          ),
        ),
        h("section", { class: "panel" },
          h("h2", { text: "Latency" }),
          table([
            { label: "Agent", key: "agent" },
            { label: "Turns", num: true, sort: (r) => r.turns, render: (r) => fmtInt(r.turns) },
            { label: "p50", num: true, sort: (r) => r.p50_ms, render: (r) => fmtMs(r.p50_ms) },
            { label: "p95", num: true, sort: (r) => r.p95_ms, render: (r) => fmtMs(r.p95_ms) },
            { label: "p99", num: true, sort: (r) => r.p99_ms, render: (r) => fmtMs(r.p99_ms) },
            { label: "max", num: true, sort: (r) => r.max_ms, render: (r) => fmtMs(r.max_ms) },
            { label: "Model calls / turn", num: true, sort: (r) => r.avg_model_calls, render: (r) => (r.avg_model_calls === null || r.avg_model_calls === undefined ? "–" : r.avg_model_calls.toFixed(1)) },
            { label: "Tool rounds / turn", num: true, title: "model calls that asked for tools (RoomKit's round count)", sort: (r) => r.avg_rounds, render: (r) => (r.avg_rounds === null ? "–" : r.avg_rounds.toFixed(1)) },
            { label: "Tool calls / turn", num: true, sort: (r) => r.avg_tool_calls, render: (r) => (r.avg_tool_calls === null ? "–" : r.avg_tool_calls.toFixed(1)) },
          ], data.latency, { key: "latency", label: "latency", class: "latency", empty: "no turns in this range", pinned: (r) => r === data.latency[0] }),
        ),
        h("section", { class: "panel" },
          h("h2", { text: "Slowest turns" }),
          table([
            { label: "Session", sort: (r) => r.session_id, render: (r) => (r.session_id ? sessionLink(r.session_id) : "–") },
            { label: "Turn", sort: false, render: (r) => (r.session_id && r.correlation_id ? h("a", { href: turnHref(r.session_id, r.correlation_id), class: "turn-link", text: "open turn" }) : "–") },
            { label: "Agent", sort: (r) => r.agent, render: (r) => r.agent || "–" },
            { label: "Model", sort: (r) => r.model, render: (r) => r.model || "–" },
            { label: "Ended", sort: (r) => r.loop_end_reason, render: (r) => reasonBadge(r.loop_end_reason) },
            { label: "Latency", num: true, sort: (r) => r.latency_ms, render: (r) => fmtMs(r.latency_ms) },
            { label: "Model calls", num: true, sort: modelCalls, render: (r) => fmtInt(modelCalls(r)) },
            { label: "Tool rounds", num: true, title: "model calls that asked for tools (RoomKit's round count)", sort: (r) => r.round_count, render: (r) => fmtInt(r.round_count) },
            { label: "Tool calls", num: true, sort: (r) => r.tool_calls_count, render: (r) => fmtInt(r.tool_calls_count) },
            { label: "Tokens in / out", num: true, title: "sorts by input and output together", sort: tokenSum, render: (r) => `${fmtInt(r.input_tokens)} / ${fmtInt(r.output_tokens)}` },
            { label: "Cost", num: true, sort: costOf, render: (r) => turnCost(r) },
            { label: "At", sort: (r) => r.t, render: (r) => fmtTime(r.t, true) },
          ], data.slowest, {
            key: "slowest", label: "slowest turns", class: "slowest", empty: "no turns in this range",
            shown: data.slowest.length >= 10 ? "the filter covers these 10 slowest turns of the range" : null,
          }),
        ),
      );
    });
  }

  function declaredPage() {
    return analyticsPage("Declared vs used tools", "Per agent, each tool the model was offered and how often it was called. A tool offered every turn but never called costs prompt tokens for nothing.", async (content, range) => {
      const data = await getJSON("/api/declared", { range });
      clear(content);
      if (!data.agents.length) put(content, h("p", { class: "muted empty", text: "no turns in this range" }));
      for (const agent of data.agents) {
        put(content, h("section", { class: "panel agent", "data-agent": agent.agent },
          h("h2", null, agent.agent, " ", h("span", { class: "muted", text: `${plural(agent.turns, "turn")} · ${plural(agent.declared, "tool")} offered · ${fmtInt(agent.never_called)} never called` })),
          table([
            { label: "Tool", sort: (r) => r.tool, render: (r) => h("span", { class: "mono", text: r.tool || "(unnamed)" }) },
            { label: "Offered in", num: true, sort: (r) => r.turns_declared, render: (r) => `${plural(r.turns_declared, "turn")} (${fmtPct(r.turns_declared / Math.max(1, agent.turns))})` },
            { label: "Calls", num: true, sort: (r) => r.calls, render: (r) => fmtInt(r.calls) },
            { label: "Called in", num: true, sort: (r) => r.turns_used, render: (r) => plural(r.turns_used, "turn") },
            { label: "Use rate", title: "turns that called the tool / turns that offered it", sort: (r) => (r.turns_declared ? r.turns_used / r.turns_declared : null), render: (r) => (r.turns_declared ? [meter(r.turns_used / r.turns_declared, r.never_called ? "bad" : "ok"), ` ${fmtPct(r.turns_used / r.turns_declared)}`] : "–") },
            { label: "", render: (r) => (r.never_called ? badge("never called", "warn") : r.undeclared ? badge("called, not offered", "bad") : null) },
          ], agent.tools, { key: `agent-${agent.agent}`, label: `${agent.agent}'s tools`, rowProps: (r) => ({ class: r.never_called ? "never" : null }) }),
        ));
      }
    });
  }

  // pages and parts in files of their own (static/diff.js, static/search.js, loaded before this
  // one) register in window.loopscopePages: a page as (kit, params, parts) => {stop()}; they draw
  // with the helpers of this kit
  const EXTRA = window.loopscopePages || {};
  const kit = {
    main, h, put, fill, clear, table, getJSON, poller, setStatus, showError, fmtMs, fmtInt, fmtTime, fmtAgo, fmtUsd,
    badge, reasonBadge, pretty, plural, sessionLink, statCard, POLL_LIST_MS, analyticsPage,
  };
  // scores on a session's turns and tool calls (static/scores.js, docs/scores.md)
  const scoresUi = EXTRA.scoreParts ? EXTRA.scoreParts(kit) : null;

  window.addEventListener("hashchange", navigate);
  window.addEventListener("popstate", navigate);
  route();
})();
