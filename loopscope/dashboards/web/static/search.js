// loopscope dashboard (issue 35): the places a search found in the store's content (under the
// sessions list) and the store-wide lists of the slowest and the failed calls (#/calls, and
// #/calls?tool=NAME&failed=1 from a failing tool). Loaded before app.js; registers in
// window.loopscopePages and draws with app.js's helpers (`k`). Everything read from the store
// is put on the page as text, never parsed as HTML.
"use strict";

(() => {
  const pages = (window.loopscopePages = window.loopscopePages || {});
  const FIELDS = { text: "message text", tool: "tool name", arguments: "arguments", result: "result", error: "error", output: "model output", content: "content" };

  const turnHref = (session, turn) => `#/session/${encodeURIComponent(session)}?turn=${encodeURIComponent(turn)}`;
  const turnLink = (k, r) => (r.session_id && r.turn_id ? k.h("a", { href: turnHref(r.session_id, r.turn_id), class: "turn-link", title: r.turn_id, text: r.turn_id.slice(0, 8) }) : "–");

  // the snippet with each match of the query marked (text nodes and <mark>, never HTML)
  function marked(k, snippet, query) {
    const out = k.h("span", { class: "snippet" });
    const lower = snippet.toLowerCase(), needle = query.toLowerCase();
    let at = 0;
    for (let i = lower.indexOf(needle); needle && i >= 0; i = lower.indexOf(needle, at)) {
      k.put(out, snippet.slice(at, i), k.h("mark", { text: snippet.slice(i, i + needle.length) }));
      at = i + needle.length;
    }
    k.put(out, snippet.slice(at));
    return out;
  }

  // under the sessions list: where the search text is (a message, a tool call, a model call).
  // The sessions page polls every 5 s; a search scans the store's text, so the places are read
  // again when the text changes, else every 30 s (new rows of a running agent)
  const HITS_EVERY_MS = 30000;
  let shown = { query: null, at: 0, el: null };
  pages.searchHits = async (k, el, query) => {
    if (!query) { k.clear(el); shown = { query: null, at: 0, el: null }; return; }
    if (shown.query === query && shown.el === el && el.firstChild && Date.now() - shown.at < HITS_EVERY_MS) return;
    const data = await k.getJSON("/api/search", { q: query });
    shown = { query, at: Date.now(), el };
    const n = data.hits.length;
    k.fill(el, k.h("section", { class: "panel hits-panel" },
      k.h("h2", { text: `Found in content: ${k.fmtInt(n)}${n >= data.limit ? "+" : ""} place${n === 1 ? "" : "s"}` }),
      k.h("p", { class: "muted", text: "messages, tool names, arguments, results and errors, and what model calls generated or failed with; newest first" }),
      k.table([
        { label: "When", sort: (r) => r.t, render: (r) => k.fmtTime(r.t, true) },
        { label: "Session", sort: (r) => r.session_id, render: (r) => k.sessionLink(r.session_id) },
        { label: "Turn", sort: (r) => r.turn_id, render: (r) => turnLink(k, r) },
        { label: "Where", sort: (r) => r.kind, render: (r) => `${r.kind.replace(/_/g, " ")}${r.index !== null ? ` #${r.index}` : ""}` },
        { label: "Tool", sort: (r) => r.tool, render: (r) => r.tool || "" },
        { label: "Field", sort: (r) => r.field, render: (r) => k.badge(FIELDS[r.field] || r.field, r.field === "error" ? "bad" : "muted") },
        { label: "Match", sort: false, render: (r) => marked(k, r.snippet, query) },
      ], data.hits, { key: "hits", label: "places found", class: "hits", empty: `no message, tool call or model call holds “${query}”`, rowProps: (r) => ({ "data-field": r.field, "data-kind": r.kind }) }),
    ));
  };

  // #/calls: the slowest calls of the store (or, with failed=1, the failed ones, newest first);
  // with tool=NAME, that tool's calls alone
  pages.calls = (k, params, parts) => {
    const tool = params.get("tool");
    const failed = params.get("failed") === "1";
    const base = tool ? `#/calls?tool=${encodeURIComponent(tool)}` : "#/calls";
    const tab = (label, href, on) => k.h("a", { href, class: `btn small${on ? " active" : ""}`, text: label });
    const content = k.h("div", { class: "analytics calls-page" });
    const title = `${failed ? "Failed" : "Slowest"} calls${tool ? ` of ${tool}` : ""}`;
    k.put(k.main,
      k.h("div", { class: "page-head" }, k.h("h1", { text: title }), k.h("span", { class: "spacer" }),
        k.h("div", { class: "range-picker", role: "group", "aria-label": "which calls" },
          tab("Slowest", base, !failed), tab("Failed", `${base}${tool ? "&" : "?"}failed=1`, failed))),
      k.h("p", { class: "muted intro", text: failed ? "Calls that did not end well, newest first: tool calls not served, model calls that ended in an error." : "The longest calls of the store, longest first." }),
      tool ? k.h("p", { class: "crumbs" }, k.h("a", { href: "#/tools", text: "Tools" }), " / ", k.h("span", { text: tool }), " · ", k.h("a", { href: failed ? "#/calls?failed=1" : "#/calls", text: "all tools" })) : null,
      content,
    );
    const poll = k.poller(async () => {
      const data = await k.getJSON("/api/calls", { tool, failed });
      k.fill(content,
        k.h("section", { class: "panel" },
          k.h("h2", { text: `Tool calls (${k.fmtInt(data.tool_calls.length)}${data.tool_calls.length >= data.limit ? "+" : ""})` }),
          k.table([
            { label: "At", sort: (r) => r.t, render: (r) => k.fmtTime(r.t, true) },
            { label: "Session", sort: (r) => r.session_id, render: (r) => (r.session_id ? k.sessionLink(r.session_id) : "–") },
            { label: "Turn", sort: (r) => r.turn_id, render: (r) => turnLink(k, r) },
            { label: "Tool", sort: (r) => r.tool, render: (r) => k.h("span", { class: "mono", text: r.tool || "(unnamed)" }) },
            { label: "Call id", sort: (r) => r.call_id, render: (r) => k.h("span", { class: "mono", text: r.call_id || "" }) },
            { label: "Outcome", sort: (r) => r.outcome, render: (r) => k.badge(r.outcome || "–", r.outcome === "served" ? "ok" : r.outcome === "running" ? "run" : "bad") },
            { label: "Duration", num: true, sort: (r) => r.duration_ms, render: (r) => k.fmtMs(r.duration_ms) },
            { label: "Error / arguments", sort: false, render: (r) => k.h("span", { class: r.error ? "error-text" : "muted", text: r.error || (r.arguments === null || r.arguments === undefined ? "" : JSON.stringify(r.arguments)).slice(0, 300) }) },
          ], data.tool_calls, { key: "tool-calls", label: "tool calls", class: "tool-calls", empty: failed ? "no failed tool calls" : "no tool calls yet", rowProps: (r) => ({ "data-tool": r.tool, "data-call-id": r.call_id }) }),
        ),
        tool ? null : k.h("section", { class: "panel" },
          k.h("h2", { text: `Model calls (${k.fmtInt(data.model_calls.length)}${data.model_calls.length >= data.limit ? "+" : ""})` }),
          k.table([
            { label: "At", sort: (r) => r.t, render: (r) => k.fmtTime(r.t, true) },
            { label: "Session", sort: (r) => r.session_id, render: (r) => k.sessionLink(r.session_id) },
            { label: "Turn", sort: (r) => r.turn_id, render: (r) => turnLink(k, r) },
            { label: "Model", sort: (r) => r.model, render: (r) => r.model || "–" },
            { label: "Outcome", sort: (r) => r.outcome, render: (r) => k.badge(r.outcome || "–", r.outcome === "error" ? "bad" : "muted") },
            { label: "Duration", num: true, sort: (r) => r.duration_ms, render: (r) => k.fmtMs(r.duration_ms) },
            { label: "TTFC", num: true, title: "time to the first chunk of a stream", sort: (r) => r.time_to_first_chunk_ms, render: (r) => k.fmtMs(r.time_to_first_chunk_ms) },
            { label: "Error", sort: false, render: (r) => k.h("span", { class: "error-text", text: r.error ? `${r.error_type ? `${r.error_type}: ` : ""}${r.error}`.slice(0, 300) : "" }) },
          ], data.model_calls, { key: "model-calls", label: "model calls", class: "model-calls", empty: failed ? "no failed model calls" : "no model calls yet", rowProps: (r) => ({ "data-position": r.position }) }),
        ),
      );
      k.setStatus(`${title} · updated ${k.fmtTime(data.generated_at)}`, false);
    }, k.POLL_LIST_MS);
    return poll;
  };
})();
