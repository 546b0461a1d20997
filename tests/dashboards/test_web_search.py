"""The dashboard's search covers content, server side, and the store-wide call lists (issue 35):
the sessions page's search box finds a tool's name, a word of a user's message, of a tool's
result and of an error (it said "0 of 0 sessions" for each before) and lists where; a
failing tool on the tools page leads to exactly its failed calls; the calls page lists the
slowest and the failed calls in order; a slowest turn and a search hit lead to the turn.

Over the shared sample store (``webdata.py``): no recording of its own.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from playwright.sync_api import expect

WAIT_MS = 15_000
RESEARCH = "research-7f3a"

# a text of each kind the store holds once, where it is: (text, kind of event, field)
FOUND = {
    "summarize": ("tool_call_start", "tool"),  # a tool's name
    "write-ahead log handling": ("message", "text"),  # a word of the user's message
    "no longer block": ("tool_call_end", "result"),  # a tool's result
    "after 10 s": ("tool_call_end", "error"),  # an error (fetch_page timed out)
}


def api(page: Any, url: str, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    response = page.request.get(f"{url.rstrip('/')}{path}?{query}")
    assert response.ok, response.text()
    return response.json()


def test_the_api_search_finds_content_and_never_a_blocked_input(page, dashboard):
    for text, (kind, field) in FOUND.items():
        hits = api(page, dashboard.url, "/api/search", q=text)["hits"]
        assert [(h["session_id"], h["kind"], h["field"]) for h in hits][-1:] == [(RESEARCH, kind, field)], text
        assert all(text.lower() in h["snippet"].lower() for h in hits), hits
        sessions = api(page, dashboard.url, "/api/sessions", q=text)
        assert (sessions["total"], [s["session_id"] for s in sessions["sessions"]]) == (1, [RESEARCH]), text
    # the user message a guardrail blocked ("Send the summary to my manager's ...") is not found
    assert api(page, dashboard.url, "/api/search", q="manager's")["hits"] == []
    assert api(page, dashboard.url, "/api/sessions", q="manager's")["total"] == 0
    assert api(page, dashboard.url, "/api/search", q="")["hits"] == []


def test_the_search_box_finds_a_result_word_lists_where_and_leads_to_the_turn(page, dashboard):
    page.goto(dashboard.url)
    page.wait_for_selector("table.sessions tbody tr", timeout=WAIT_MS)
    for text, (kind, field) in FOUND.items():
        page.fill("#session-search", text)
        expect(page.locator("table.sessions tbody tr")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("table.sessions tbody tr a.session-link")).to_have_text(RESEARCH)
        expect(page.get_by_text(f"1 of 1 sessions matching “{text}”")).to_be_visible()
        hit = page.locator(f'table.hits tbody tr[data-kind="{kind}"][data-field="{field}"]')
        expect(hit).to_have_count(1, timeout=WAIT_MS)
        expect(hit.locator("mark").first).to_have_text(text, ignore_case=True)
    # the URL keeps the search; the hit's turn link opens the session at that turn
    assert urllib.parse.parse_qs(page.url.split("?", 1)[1]) == {"q": ["after 10 s"]}
    turn = page.locator('table.hits tbody tr[data-field="error"] a.turn-link')
    turn_id = turn.get_attribute("title")
    turn.click()
    target = page.locator("section.turn.target")
    expect(target).to_have_count(1, timeout=WAIT_MS)
    assert target.get_attribute("data-correlation-id") == turn_id
    expect(target.get_by_text("fetch timed out after 10 s").first).to_be_attached()


def test_a_failing_tool_links_to_exactly_its_failed_calls(page, dashboard):
    tools = {t["tool"]: t for t in api(page, dashboard.url, "/api/tools", range="all")["tools"]}
    page.goto(dashboard.url + "#/tools")
    link = page.locator('table.tools tr[data-tool="fetch_page"] a.failed-calls-link')
    expect(link).to_have_count(1, timeout=WAIT_MS)
    assert page.locator('table.tools tr[data-tool="get_weather"] a.failed-calls-link').count() == 0  # never failed
    link.click()
    rows = page.locator("table.tool-calls tbody tr[data-call-id]")
    expect(rows).to_have_count(tools["fetch_page"]["failures"], timeout=WAIT_MS)
    assert set(rows.evaluate_all("(rs) => rs.map((r) => r.dataset.tool)")) == {"fetch_page"}
    outcomes = page.locator("table.tool-calls tbody td .badge").all_text_contents()
    assert sorted(outcomes) == ["failed", "refused"]  # what the tools page counts as failures
    assert page.locator("table.model-calls").count() == 0  # a tool's page: no model calls
    listed = api(page, dashboard.url, "/api/calls", tool="fetch_page", failed=1)["tool_calls"]
    assert [r["call_id"] for r in listed] == rows.evaluate_all("(rs) => rs.map((r) => r.dataset.callId)")
    for row in listed:  # each with the session and the turn it belongs to
        assert row["session_id"] == RESEARCH and row["turn_id"]


def test_the_calls_page_lists_the_slowest_longest_first_and_the_failed_newest_first(page, dashboard):
    slowest = api(page, dashboard.url, "/api/calls")
    durations = [r["duration_ms"] for r in slowest["tool_calls"]]
    assert durations == sorted(durations, reverse=True) and len(durations) > 5
    models = [r["duration_ms"] for r in slowest["model_calls"]]
    assert models == sorted(models, reverse=True) and models
    failed = api(page, dashboard.url, "/api/calls", failed=1)
    times = [r["t"] for r in failed["tool_calls"]]
    assert times == sorted(times, reverse=True)
    assert {r["outcome"] for r in failed["tool_calls"]} == {"failed", "refused", "blocked"}
    assert {r["tool"] for r in failed["tool_calls"]} == {"fetch_page", "web_search", "book_table"}

    page.goto(dashboard.url + "#/calls")
    rows = page.locator("table.tool-calls tbody tr[data-call-id]")
    expect(rows).to_have_count(len(durations), timeout=WAIT_MS)
    assert rows.evaluate_all("(rs) => rs.map((r) => r.dataset.callId)") == [r["call_id"] for r in slowest["tool_calls"]]
    page.click("text=Failed")
    expect(page.locator("h1")).to_have_text("Failed calls")
    expect(rows).to_have_count(len(times), timeout=WAIT_MS)


def test_a_slowest_turn_links_to_the_turn_itself(page, dashboard):
    slowest = api(page, dashboard.url, "/api/turns", range="all")["slowest"]
    page.goto(dashboard.url + "#/turns")
    link = page.locator("table.slowest tbody tr a.turn-link").first
    expect(link).to_be_visible(timeout=WAIT_MS)
    link.click()
    target = page.locator("section.turn.target")
    expect(target).to_have_count(1, timeout=WAIT_MS)
    assert target.get_attribute("data-correlation-id") == slowest[0]["correlation_id"]
    assert f"/session/{urllib.parse.quote(slowest[0]['session_id'])}" in page.url
