// loopscope dashboard: scores and feedback (docs/scores.md): the Scores page (#/scores) and the
// scores on a session's turns and tool calls. A file of its own: it registers in
// window.loopscopePages (the page, and `scoreParts`, which app.js's timeline draws with), and
// draws with app.js's kit; everything read from the store is put on the page as text.
"use strict";

(() => {
  const pages = (window.loopscopePages = window.loopscopePages || {});
  let made = null;

  const scoreParts = (kit) => {
    const { h, put, clear, table, badge, plural, fmtInt, fmtTime, analyticsPage, getJSON, statCard } = kit;

    const GOOD = new Set(["up", "pass", "yes", "good", "correct", "relevant", "true", "helpful"]);
    const BAD = new Set(["down", "fail", "no", "bad", "incorrect", "not_relevant", "false", "unhelpful"]);
    const toneOf = (s) => {
      const label = (s.label || "").toLowerCase();
      if (GOOD.has(label)) return "ok";
      if (BAD.has(label)) return "bad";
      return "muted";
    };
    const fmtValue = (v) => (v === null || v === undefined ? "" : Number.isInteger(v) ? String(v) : v.toFixed(2));
    const said = (s) => [fmtValue(s.value), s.label].filter((x) => x !== "" && x !== null && x !== undefined).join(" ");
    const whatOf = (s) => {
      if (s.target === "call") return `model call #${s.call_position ?? "?"}`;
      if (s.target === "tool") return `tool ${s.tool || ""}${s.tool_call_id ? ` (${s.tool_call_id})` : ""}`.trim();
      return "turn";
    };

    // one score as a chip: its name, value and label; the rest (who, when, why) in its title
    function chip(s, withTarget) {
      const title = [`${s.name}: ${said(s) || "–"}`, s.explanation, `${s.source || "unknown source"} · ${fmtTime(s.t, true)}`,
        withTarget ? `on the ${whatOf(s)}` : null].filter(Boolean).join("\n");
      return h("span", { class: `score-chip badge ${toneOf(s)}`, title, "data-score": s.name, "data-target": s.target || "" },
        h("span", { class: "score-name", text: s.name }), said(s) ? ` ${said(s)}` : null,
        withTarget && s.target && s.target !== "turn" ? h("span", { class: "score-on", text: ` · ${whatOf(s)}` }) : null);
    }

    // the scores of a turn and of its model calls (a tool call's show on its card too)
    function turnScores(list) {
      const shown = (list || []).filter((s) => s.target !== "tool");
      const tools = (list || []).filter((s) => s.target === "tool");
      if (!shown.length && !tools.length) return null;
      return h("div", { class: "turn-scores", "aria-label": "scores" },
        h("span", { class: "muted", text: "Scores:" }), shown.map((s) => chip(s, true)),
        tools.length ? h("span", { class: "muted", text: ` ${plural(tools.length, "tool call score")} below` }) : null);
    }

    function toolScores(list, toolCallId) {
      const mine = (list || []).filter((s) => s.target === "tool" && s.tool_call_id === toolCallId);
      return mine.length ? h("div", { class: "turn-scores tool-scores" }, mine.map((s) => chip(s, false))) : null;
    }

    const labelsText = (labels) => Object.entries(labels || {}).map(([k, v]) => `${k} ${fmtInt(v)}`).join(", ");
    const mean = (r) => (r.mean_value === null || r.mean_value === undefined ? "–" : fmtValue(r.mean_value));

    function grouped(title, by, rows, key) {
      return h("section", { class: "panel" }, h("h2", { text: title }), table([
        { label: "Score", sort: (r) => r.name, render: (r) => h("span", { class: "mono", text: r.name }) },
        by ? { label: by[0].toUpperCase() + by.slice(1), sort: (r) => r[by], render: (r) => r[by] || h("span", { class: "muted", text: "(none)" }) } : null,
        { label: "Scores", num: true, sort: (r) => r.scores, render: (r) => fmtInt(r.scores) },
        { label: "Mean value", num: true, sort: (r) => r.mean_value, render: mean },
        { label: "Labels", sort: (r) => labelsText(r.labels), render: (r) => labelsText(r.labels) || "–" },
      ].filter(Boolean), rows, { key, label: title.toLowerCase(), empty: "no scores in this range" }));
    }

    function page() {
      return analyticsPage("Scores", "Scores and feedback on turns, model calls and tool calls (loopscope.score, loopscope score, other instrumentations' gen_ai.evaluation.result), by agent, model and tool.", async (content, range) => {
        const data = await getJSON("/api/scores", { range });
        clear(content);
        const total = data.names.reduce((n, r) => n + r.scores, 0);
        put(content, h("div", { class: "stats" },
          statCard("Scores", fmtInt(total)),
          statCard("Evaluations", fmtInt(data.names.length), data.names.map((r) => r.name).slice(0, 4).join(", ") || null),
        ));
        if (!total) {
          put(content, h("p", { class: "muted empty", text: "No scores in this range. Record one with loopscope.score(turn, \"helpful\", value=1) or loopscope score TURN helpful --label up." }));
          return;
        }
        put(content,
          grouped("By score", null, data.names, "scores-names"),
          grouped("By agent", "agent", data.by_agent, "scores-agents"),
          grouped("By model", "model", data.by_model, "scores-models"),
          grouped("By tool", "tool", data.by_tool, "scores-tools"),
          h("section", { class: "panel" }, h("h2", { text: "Over time" }), table([
            { label: "Day", sort: (r) => r.day, render: (r) => new Date(r.day).toISOString().slice(0, 10) },
            { label: "Score", sort: (r) => r.name, render: (r) => h("span", { class: "mono", text: r.name }) },
            { label: "Scores", num: true, sort: (r) => r.scores, render: (r) => fmtInt(r.scores) },
            { label: "Mean value", num: true, sort: (r) => r.mean_value, render: mean },
          ], data.over_time, { key: "scores-days", label: "scores per day" })),
          h("section", { class: "panel" }, h("h2", null, "Recent scores ", h("span", { class: "muted", text: `(the ${fmtInt(data.recent.length)} most recent)` })), table([
            { label: "When", sort: (r) => r.t, render: (r) => fmtTime(r.t, true) },
            { label: "Score", sort: (r) => r.name, render: (r) => chip(r, false) },
            { label: "On", sort: (r) => whatOf(r), render: (r) => (r.found ? whatOf(r) : h("span", { class: "muted", title: "not in this store (yet)", text: `${r.target || "?"} (not found)` })) },
            { label: "Agent", sort: (r) => r.agent, render: (r) => r.agent || "–" },
            { label: "Model", sort: (r) => r.model, render: (r) => r.model || "–" },
            { label: "Source", sort: (r) => r.source, render: (r) => (r.source ? badge(r.source, "muted") : "–") },
            { label: "Session", sort: (r) => r.session_id, render: (r) => (r.session_id ? h("a", { href: `#/session/${encodeURIComponent(r.session_id)}`, class: "session-link", text: r.session_id }) : "–") },
            { label: "Explanation", sort: (r) => r.explanation, render: (r) => r.explanation || "" },
          ], data.recent, { key: "scores-recent", label: "recent scores", rowProps: (r) => ({ "data-score-id": r.id }) })),
        );
      });
    }

    // a session's page polls for its turns' scores: a score often comes after its turn ended
    // (a thumbs-up minutes later, from another process); `apply(list, ids)` gets the scores of
    // the turns `ids`, all of them
    function watch(sessionId, turnIds, apply, ms = 3000) {
      let timer = null, stopped = false;
      const tick = async () => {
        const ids = turnIds();
        if (!stopped && !document.hidden && ids.length) {
          try {
            apply((await getJSON("/api/scores", { session: sessionId, turns: ids.join(",") })).scores, ids);
          } catch (err) { /* the timeline's own poll says what is wrong */ }
        }
        if (!stopped) timer = setTimeout(tick, ms);
      };
      timer = setTimeout(tick, ms);
      return () => { stopped = true; clearTimeout(timer); };
    }

    return { page, turnScores, toolScores, watch };
  };

  pages.scoreParts = (kit) => made || (made = scoreParts(kit));
  pages.scores = (kit) => pages.scoreParts(kit).page();
})();
