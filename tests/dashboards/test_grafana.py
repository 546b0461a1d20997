"""The Grafana dashboard shipped in loopscope/dashboards/grafana: checked structurally.

No Grafana runs here. The checks are what breaks an imported dashboard silently: a panel
without a templated data source, a PromQL query naming a metric or label loopscope never
exports, a TraceQL query that cannot parse, a variable that is not defined.
"""

from __future__ import annotations

import itertools
import json
import re
from importlib import resources

import pytest

from loopscope import semconv as a
from loopscope.export import metrics

DASHBOARD = resources.files("loopscope.dashboards") / "grafana" / "loopscope.json"


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """An OTel instrument's name in Prometheus, as the Collector's Prometheus exporters write it."""
    base = name.replace(".", "_")
    if unit == "s":
        base += "_seconds"
    elif unit and not unit.startswith("{"):
        raise AssertionError(f"unit {unit!r} has no Prometheus suffix rule here")
    return base + "_total" if kind == "counter" else base


# (instrument name, unit, kind) of what loopscope exports (loopscope/export/metrics.py): the current
# conventions' (the default), and the older ones (LOOPSCOPE_SEMCONV=v1.37) the panels fall back on
INSTRUMENTS = [
    (metrics.INFERENCE_DURATION, "s", "histogram"),
    (a.METRIC_INPUT_TOKENS, "{token}", "counter"),
    (a.METRIC_OUTPUT_TOKENS, "{token}", "counter"),
    (metrics.TOKEN_USAGE, "{token}", "histogram"),
    (metrics.OPERATION_DURATION, "s", "histogram"),
    (metrics.TOOL_DURATION, "s", "histogram"),
    (metrics.TOOL_CALLS, "{call}", "counter"),
    (metrics.TURNS, "{turn}", "counter"),
    (metrics.DROPPED, "{event}", "counter"),
]


def known_metrics() -> set[str]:
    names: set[str] = set()
    for name, unit, kind in INSTRUMENTS:
        base = prometheus_name(name, unit, kind)
        names |= {base + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {base}
    return names


KNOWN_LABELS = {
    attr.replace(".", "_")
    for attr in (
        a.TOOL_NAME,
        a.TOOL_OUTCOME,
        a.LOOP_END_REASON,
        a.AGENT_NAME,
        a.OPERATION,
        a.PROVIDER,
        a.REQUEST_MODEL,
        a.RESPONSE_MODEL,
        a.ERROR_TYPE,
        "gen_ai.token.type",
        "server.address",
        "loopscope.destination",
    )
} | {"le", "job", "instance"}

PROMQL_FUNCTIONS = {"sum", "rate", "increase", "histogram_quantile", "avg", "max", "min", "count", "topk", "clamp_min",
                    "label_replace"}
PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
GRAFANA_VARIABLES = {"__range", "__rate_interval", "__interval", "__all", "__range_s"}
TRACEQL_INTRINSICS = {"duration", "name", "status", "kind", "rootName", "rootServiceName", "traceDuration"}
TRACEQL_ATTRIBUTES = {
    a.OPERATION,
    a.TOOL_NAME,
    a.TOOL_OUTCOME,
    a.LOOP_END_REASON,
    a.AGENT_NAME,
    a.REQUEST_MODEL,
    a.ERROR_TYPE,
}
OPERATIONS = {a.OP_INVOKE_AGENT, a.OP_CHAT, a.OP_EXECUTE_TOOL}
PANEL_TYPES = {"row", "stat", "timeseries", "table", "bargauge", "piechart", "gauge", "barchart", "text"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels of a collapsed row
    return out


def targets(dashboard: dict, kind: str) -> list[tuple[dict, dict]]:
    return [
        (p, t) for p in panels(dashboard) for t in p.get("targets", []) if p.get("datasource", {}).get("type") == kind
    ]


def variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def referenced_variables(text: str) -> set[str]:
    return {braced or bare for braced, bare in re.findall(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", text)}


def balanced(text: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', text):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def promql_parts(expr: str) -> tuple[set[str], set[str], set[str]]:
    """(metric names, functions, labels) a PromQL expression uses."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    functions, names = set(), set()
    for ident, call in re.findall(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if call:
            functions.add(ident)
        elif ident not in PROMQL_KEYWORDS:
            names.add(ident)
    return names, functions, labels


# -- the file -----------------------------------------------------------------------------------


def test_valid_json_with_a_schema_version_and_identity(dashboard):
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] == "loopscope" and dashboard["title"]
    assert "id" not in dashboard or dashboard["id"] is None  # importable into any Grafana


def test_data_sources_are_template_variables(dashboard):
    found = variables(dashboard)
    assert found["datasource"]["type"] == "datasource" and found["datasource"]["query"] == "prometheus"
    assert found["tempo"]["type"] == "datasource" and found["tempo"]["query"] == "tempo"
    for name, var in found.items():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}", name


def test_panel_ids_are_unique_and_the_grid_is_sane(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    boxes = []
    for p in panels(dashboard):
        assert p["type"] in PANEL_TYPES, p["type"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        boxes.append((p["title"], g))
    for (t1, g1), (t2, g2) in itertools.combinations(boxes, 2):
        overlap = (
            g1["x"] < g2["x"] + g2["w"]
            and g2["x"] < g1["x"] + g1["w"]
            and g1["y"] < g2["y"] + g2["h"]
            and g2["y"] < g1["y"] + g1["h"]
        )
        assert not overlap, f"{t1!r} overlaps {t2!r}"


def test_every_panel_and_query_uses_a_data_source_variable(dashboard):
    for p in panels(dashboard):
        if p["type"] == "row":
            continue
        source = p["datasource"]
        assert source["uid"] in ("${datasource}", "${tempo}"), p["title"]
        assert source["type"] == {"${datasource}": "prometheus", "${tempo}": "tempo"}[source["uid"]], p["title"]
        assert p["targets"], p["title"]
        for target in p["targets"]:
            assert target["datasource"] == source, p["title"]
            assert ("expr" in target) == (source["type"] == "prometheus"), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]


def test_promql_names_only_metrics_and_labels_loopscope_exports(dashboard):
    known = known_metrics()
    exprs = [t["expr"] for _, t in targets(dashboard, "prometheus")]
    exprs += [v["query"]["query"] for v in variables(dashboard).values() if v["type"] == "query"]
    assert exprs
    used: set[str] = set()
    for expr in exprs:
        assert balanced(expr), expr
        if expr.startswith("label_values("):
            inner = expr[len("label_values(") : -1]
            selector, label = inner.rsplit(",", 1)
            assert label.strip() in KNOWN_LABELS, expr
            expr = selector
        names, functions, labels = promql_parts(expr)
        assert names, expr
        assert names <= known, f"unknown metric(s) {names - known} in {expr}"
        assert functions <= PROMQL_FUNCTIONS, f"unexpected function(s) {functions - PROMQL_FUNCTIONS} in {expr}"
        assert labels <= KNOWN_LABELS, f"unknown label(s) {labels - KNOWN_LABELS} in {expr}"
        used |= names
    # every exported metric family appears somewhere
    for name, unit, kind in INSTRUMENTS:
        base = prometheus_name(name, unit, kind)
        assert any(u.startswith(base) for u in used), f"{base} is on no panel"


def test_the_metric_names_match_the_issue(dashboard):
    expected = {
        "gen_ai_client_inference_duration_seconds_bucket",
        "gen_ai_client_inference_usage_input_tokens_total",
        "gen_ai_client_token_usage_sum",
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_execute_tool_duration_seconds_bucket",
        "loopscope_tool_calls_total",
        "loopscope_turns_total",
    }
    assert expected <= known_metrics()


def test_traceql_queries_parse_plausibly(dashboard):
    queries = [t["query"] for _, t in targets(dashboard, "tempo")]
    assert len(queries) >= 3
    defined = set(variables(dashboard))
    operations_seen = set()
    for query in queries:
        for target in (t for _, t in targets(dashboard, "tempo") if t["query"] == query):
            assert target["queryType"] == "traceql"
        assert balanced(query), query
        assert query.startswith("{") and query.rstrip().endswith("}"), query
        body = query.strip()[1:-1]
        for condition in re.split(r"&&|\|\|", body):
            match = re.fullmatch(
                r"\s*(?:(span|resource)\.([A-Za-z_][\w.]*)|([a-zA-Z]+))\s*(=~|!~|!=|>=|<=|=|>|<)\s*"
                r'("(?:[^"\\]|\\.)*"|\d+(?:\.\d+)?(?:ns|us|ms|s|m|h)?|\$\{\w+(?::\w+)?\}|\$\w+|true|false|error|ok|unset)\s*',
                condition,
            )
            assert match, f"cannot read {condition!r} in {query}"
            scope, attribute, intrinsic, _, value = match.groups()
            if scope == "span":
                assert attribute in TRACEQL_ATTRIBUTES, f"unknown span attribute {attribute} in {query}"
            elif intrinsic is not None:
                assert intrinsic in TRACEQL_INTRINSICS, query
            if attribute == a.OPERATION:
                operations_seen.add(value.strip('"'))
                assert value.strip('"') in OPERATIONS, query
            if value.startswith("$"):
                assert referenced_variables(value) <= defined, query
    assert {a.OP_INVOKE_AGENT, a.OP_EXECUTE_TOOL} <= operations_seen


def test_every_variable_used_is_defined(dashboard):
    defined = set(variables(dashboard)) | GRAFANA_VARIABLES
    texts = [t.get("expr") or t.get("query") for _, t in targets(dashboard, "prometheus") + targets(dashboard, "tempo")]
    texts += [v["query"]["query"] for v in variables(dashboard).values() if v["type"] == "query"]
    for text in texts:
        assert referenced_variables(text) <= defined, text
    # and each filter variable is used by some query
    used = set().union(*(referenced_variables(t) for t in texts))
    for name in ("job", "agent", "tool", "model", "slow_turn", "slow_tool"):
        assert name in used, name


def test_the_web_dashboards_analytics_have_their_panels(dashboard):
    titles = {p["title"] for p in panels(dashboard)}
    for title in (
        "Tool calls by tool",
        "Tool calls by outcome",
        "Tool stats",
        "Tool duration percentiles",
        "Failure share by tool",
        "Loop end reasons",
        "Loop end reasons over time",
        "Token usage",
        "Tokens by model",
        "Recent turns",
        "Failed tool calls",
        "Slow turns",
    ):
        assert title in titles, title
