// loopscope dashboard: two runs side by side (#/diff?a=RUN&b=RUN), from /api/diff (docs/diff.md).
// A page in a file of its own: it registers itself in window.loopscopePages, and app.js's router
// calls it with the helpers it draws with (kit). Stored text only ever becomes text nodes.
"use strict";

(() => {
  const pages = (window.loopscopePages = window.loopscopePages || {});
  const MARK = { same: "", changed: "~", added: "+", dropped: "−", reordered: "↕" };
  const OP_LABEL = { same: "same", changed: "changed", added: "only in B", dropped: "only in A", reordered: "moved" };
  const KIND = { model_call: "model", tool_call: "tool", end: "end" };
  const TOTALS = [
    ["Turns", "turns", "int"], ["Steps", "steps", "int"], ["Model calls", "model_calls", "int"], ["Tool calls", "tool_calls", "int"],
    ["Failed tool calls", "failed_tool_calls", "int"], ["Tokens in", "input_tokens", "int"], ["Tokens out", "output_tokens", "int"],
    ["Cost", "cost_usd", "usd"], ["Latency", "latency_ms", "ms"],
  ];

  pages.diff = (kit, params) => {
    const { main, h, put, fill, getJSON, showError, setStatus, badge, reasonBadge, fmtInt, fmtMs, fmtUsd, pretty } = kit;
    const a = params.get("a") || "";
    const b = params.get("b") || "";

    // a delta with its sign; one that rounds to nothing as shown ("0.00 ms", "$0") is 0
    const signed = (value, fmt) => {
      if (value === null || value === undefined) return "–";
      const text = fmt(Math.abs(value));
      if (Number(text.replace(/[^0-9.]/g, "")) === 0) return "0";
      return `${value < 0 ? "−" : "+"}${text}`;
    };
    const figure = (value, how) => (value === null || value === undefined ? "–" : how === "usd" ? fmtUsd(value) : how === "ms" ? fmtMs(value) : fmtInt(value));
    const delta = (value, how) => signed(value, (v) => figure(v, how));

    // the two runs asked for, and a way to change them
    const inputA = h("input", { type: "search", id: "diff-a", value: a, placeholder: "session id or turn id (A)", "aria-label": "run A" });
    const inputB = h("input", { type: "search", id: "diff-b", value: b, placeholder: "session id or turn id (B)", "aria-label": "run B" });
    const recent = h("datalist", { id: "diff-runs" });
    inputA.setAttribute("list", "diff-runs");
    inputB.setAttribute("list", "diff-runs");
    const go = () => {
      const query = new URLSearchParams();
      if (inputA.value.trim()) query.set("a", inputA.value.trim());
      if (inputB.value.trim()) query.set("b", inputB.value.trim());
      location.hash = `#/diff?${query}`;
    };
    const form = h("form", { class: "diff-form", onsubmit: (ev) => { ev.preventDefault(); go(); } },
      h("label", { class: "diff-pick" }, h("span", { class: "diff-side", text: "A" }), inputA),
      h("label", { class: "diff-pick" }, h("span", { class: "diff-side", text: "B" }), inputB),
      h("button", { type: "submit", class: "btn", id: "diff-go", text: "Compare" }), recent);
    const body = h("div", { class: "diff-body", id: "diff" });
    put(main, h("p", { class: "crumbs" }, h("a", { href: "#/", text: "Sessions" }), " / ", h("span", { text: "Compare runs" })),
      h("h1", { text: "Compare two runs" }), form, body);

    // what to pick B from: the turns of the session A's turn is in (s=, from "Compare turn with…"),
    // then the most recently active sessions
    const within = params.get("s");
    const picks = within ? getJSON("/api/timeline", { session: within }).then((data) => {
      (data.turns || []).forEach((t, n) => put(recent, h("option", { value: t.correlation_id, label: `turn ${n + 1} of ${within}: ${t.loop_end_reason || "running"}${t.model ? `, ${t.model}` : ""}` })));
    }) : Promise.resolve();
    picks.catch(() => {}).then(() => getJSON("/api/sessions", { limit: 50 })).then((data) => {
      for (const s of data.sessions || []) put(recent, h("option", { value: s.session_id, label: "session" }));
    }).catch(() => {});

    let stopped = false;
    if (!a || !b) {
      put(body, h("p", { class: "muted", text: "Give two runs, each a session id or a turn's correlation id (or the start of one): steps are aligned as sequences, so a retried call or an extra step does not shift what follows." }));
      (a ? inputB : inputA).focus();
      setStatus("compare runs");
    } else {
      put(body, h("p", { class: "muted", text: "Loading…" }));
      getJSON("/api/diff", { a, b }).then((data) => { if (!stopped) render(data); }).catch((err) => { if (!stopped) { fill(body); showError(err); } });
    }

    function runName(side) {
      return side.kind === "session" ? `session ${side.id}` : `turn ${side.id}`;
    }

    function render(data) {
      const counts = data.summary;
      fill(body,
        h("div", { class: "diff-heads" },
          ["a", "b"].map((key) => h("div", { class: `diff-head side-${key}` },
            h("span", { class: "diff-side", text: key.toUpperCase() }),
            h("a", { class: "diff-run", href: `#/session/${encodeURIComponent(data[key].session_id)}`, text: runName(data[key]) }),
            data[key].kind === "turn" ? h("span", { class: "muted", text: ` of ${data[key].session_id}` }) : null)),
        ),
        h("div", { class: "diff-counts", id: "diff-counts" },
          ["same", "changed", "dropped", "added", "reordered"].map((op) =>
            h("span", { class: `chip diff-count op-${op}`, "data-op": op }, h("span", { class: "diff-mark", text: MARK[op] || "=" }), ` ${fmtInt(counts[op])} ${OP_LABEL[op]}`))),
        totalsTable(data),
        h("div", { class: "diff-rows", role: "table", "aria-label": "the two runs' steps, aligned" },
          h("div", { class: "diff-row diff-colhead", role: "row" },
            h("div", { class: "diff-cell", role: "columnheader", text: `A · ${runName(data.a)}` }),
            h("div", { class: "diff-gutter", role: "columnheader", "aria-label": "difference" }),
            h("div", { class: "diff-cell", role: "columnheader", text: `B · ${runName(data.b)}` })),
          data.rows.map((row, n) => rowOf(row, n, data.rows))),
      );
      setStatus(`${runName(data.a)} ↔ ${runName(data.b)}`);
    }

    function totalsTable(data) {
      const rows = TOTALS.map(([label, key, how]) => h("tr", { "data-total": key },
        h("th", { scope: "row", text: label }),
        h("td", { class: "num", text: figure(data.a.totals[key], how) }),
        h("td", { class: "num", text: figure(data.b.totals[key], how) }),
        h("td", { class: `num delta${data.delta[key] > 0 ? " up" : data.delta[key] < 0 ? " down" : ""}`, text: delta(data.delta[key], how) })));
      return h("div", { class: "table-scroll diff-totals" },
        h("table", { class: "grid-table" },
          h("thead", null, h("tr", null, h("th", { text: "Totals" }), h("th", { class: "num", text: "A" }), h("th", { class: "num", text: "B" }), h("th", { class: "num", text: "Δ (B − A)" }))),
          h("tbody", null, rows)));
    }

    function rowOf(row, n, rows) {
      const changed = new Set(row.changes || []);
      const el = h("div", { class: `diff-row op-${row.op}`, role: "row", "data-op": row.op, "data-kind": row.kind, "data-row": n,
        "data-a": row.a ? row.a.index : null, "data-b": row.b ? row.b.index : null },
      h("div", { class: "diff-cell side-a", role: "cell" }, row.a ? stepOf(row.a, changed) : h("span", { class: "diff-gap", text: row.op === "reordered" ? "" : "—" })),
      h("div", { class: "diff-gutter", role: "cell", title: OP_LABEL[row.op], "aria-label": OP_LABEL[row.op] }, h("span", { class: "diff-mark", text: MARK[row.op] })),
      h("div", { class: "diff-cell side-b", role: "cell" }, row.b ? stepOf(row.b, changed) : h("span", { class: "diff-gap", text: row.op === "reordered" ? "" : "—" })));
      if (row.op === "reordered" && row.partner !== null) {
        const other = rows[row.partner];
        const where = row.a ? `moved: step ${other.b.index + 1} of B` : `moved: step ${other.a.index + 1} of A`;
        put(el.querySelector(row.a ? ".side-a" : ".side-b"), h("div", { class: "diff-moved", text: where }));
      }
      if (row.delta) {
        const d = row.delta;
        const parts = [];
        if (d.duration_ms !== null) parts.push(`${delta(d.duration_ms, "ms")}`);
        if (d.input_tokens || d.output_tokens) parts.push(`${delta((d.input_tokens || 0) + (d.output_tokens || 0), "int")} tokens`);
        if (d.cost_usd) parts.push(delta(d.cost_usd, "usd"));
        if (parts.length) put(el, h("div", { class: "diff-delta", text: `Δ ${parts.join(" · ")}` }));
      }
      return el;
    }

    function stepOf(step, changed) {
      const mark = (field) => (changed.has(field) ? " diff-changed" : "");
      const head = h("div", { class: "diff-step-head" },
        h("span", { class: `diff-kind k-${step.kind}`, text: KIND[step.kind] || step.kind }),
        step.kind === "end" ? null : h("span", { class: `diff-name${mark(step.kind === "model_call" ? "model" : "name")}`, text: step.name || "?" }),
        step.kind === "end"
          ? h("span", { class: mark("end_reason") }, reasonBadge(step.status))
          : step.status ? h("span", { class: mark("status") }, badge(step.status, step.status === "served" || step.status === "completed" ? "ok" : step.status === "pending" ? "run" : "bad")) : null);
      const out = [head];
      if (step.kind === "tool_call") out.push(h("pre", { class: `diff-args${mark("arguments")}`, text: pretty(step.arguments) || "{}" }));
      if (step.error) out.push(h("div", { class: `diff-error${mark("error")}`, text: step.error }));
      if (step.result !== null && step.result !== undefined && step.result !== "") {
        const text = pretty(step.result);
        out.push(h("div", { class: `diff-result${mark("result")}`, title: text.length > 240 ? text.slice(0, 2000) : null, text: text.length > 240 ? `${text.slice(0, 240)}…` : text }));
      }
      if (step.requested && step.requested.length) out.push(h("div", { class: `diff-requested muted${mark("requested")}`, text: `asks for ${step.requested.join(", ")}` }));
      const figures = [];
      if (step.duration_ms !== null) figures.push(fmtMs(step.duration_ms));
      if (step.input_tokens !== null || step.output_tokens !== null) figures.push(`${fmtInt(step.input_tokens || 0)} / ${fmtInt(step.output_tokens || 0)} tokens`);
      if (step.cost_usd !== null) figures.push(fmtUsd(step.cost_usd));
      if (figures.length) out.push(h("div", { class: "diff-figures muted", text: figures.join(" · ") }));
      return out;
    }

    return { stop() { stopped = true; } };
  };
})();
