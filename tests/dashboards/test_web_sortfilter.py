"""The web dashboard's tables sort by a click on a column header and filter by a text box,
and both are kept in the page's URL: a reload or a shared link shows the same rows in the
same order, and the browser's Back button returns to the view before.

Over the sample store (``webdata.py``): six tools, six turns (three of them without a price).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import webdata
from playwright.sync_api import expect

import loopscope
from loopscope.dashboards.web.server import DashboardServer, make_server

WAIT_MS = 15_000
TOOLS = "table.tools"
SLOWEST = "table.slowest"


def open_tools(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(f"{TOOLS} tbody tr[data-tool]", timeout=WAIT_MS)


def tool_order(page: Any) -> list[str]:
    return page.eval_on_selector_all(f"{TOOLS} tbody tr[data-tool]", "(rows) => rows.map((r) => r.dataset.tool)")


def column(page: Any, table: str, col: str) -> list[str]:
    """The text of a column's cells, top to bottom."""
    return page.evaluate(
        """([table, col]) => {
            const grid = document.querySelector(table);
            const at = [...grid.querySelectorAll('thead th')].findIndex((th) => th.dataset.col === col);
            return [...grid.querySelectorAll('tbody tr')].map((tr) => tr.children[at].textContent.trim());
        }""",
        [table, col],
    )


def sort_state(page: Any, table: str) -> dict[str, str]:
    """The headers that say they sort the table (aria-sort), by column."""
    return page.eval_on_selector_all(
        f"{table} thead th[aria-sort]",
        "(ths) => Object.fromEntries(ths.map((th) => [th.dataset.col, th.getAttribute('aria-sort')]))",
    )


def api_tools(page: Any, url: str) -> dict[str, dict[str, Any]]:
    data = page.request.get(url.rstrip("/") + "/api/tools?range=7d").json()
    return {row["tool"]: row for row in data["tools"]}


def test_a_text_column_sorts_both_ways(page, dashboard):
    open_tools(page, dashboard.url + "#/tools")
    server_order = tool_order(page)
    names = sorted(server_order)
    assert server_order != names  # the server's order is by calls: a sort shows
    page.click(f'{TOOLS} th[data-col="tool"] button')
    assert tool_order(page) == names and sort_state(page, TOOLS) == {"tool": "ascending"}
    page.click(f'{TOOLS} th[data-col="tool"] button')
    assert tool_order(page) == names[::-1] and sort_state(page, TOOLS) == {"tool": "descending"}
    page.click(f'{TOOLS} th[data-col="tool"] button')  # a third click: the server's order again
    assert tool_order(page) == server_order and sort_state(page, TOOLS) == {}


def test_numbers_durations_and_costs_sort_by_value_with_the_empty_last(page, dashboard):
    open_tools(page, dashboard.url + "#/tools")
    tools = api_tools(page, dashboard.url)
    page.click(f'{TOOLS} th[data-col="calls"] button')
    calls = [int(c) for c in column(page, TOOLS, "calls")]
    assert calls == sorted(calls) and len(set(calls)) > 2
    page.click(f'{TOOLS} th[data-col="p50"] button')  # durations: 0.02 ms, 60 ms, 120 ms... by value
    p50 = [tools[name]["p50_ms"] for name in tool_order(page)]
    assert p50 == sorted(p50)
    page.click(f'{TOOLS} th[data-col="p50"] button')
    assert [tools[name]["p50_ms"] for name in tool_order(page)] == sorted(p50, reverse=True)
    assert sort_state(page, TOOLS) == {"p50": "descending"}

    # costs by their value ($0.00059 < $0.0017 < $0.019, which as text sort the other way round);
    # the turns without a price ("—") last, whichever way
    page.goto(dashboard.url + "#/turns")
    page.wait_for_selector(f"{SLOWEST} tbody tr", timeout=WAIT_MS)
    page.click(f'{SLOWEST} th[data-col="cost"] button')
    costs = column(page, SLOWEST, "cost")
    assert costs[:3] == ["$0.00059", "$0.0017", "$0.019"] and all(c.startswith("—") for c in costs[3:]), costs
    page.click(f'{SLOWEST} th[data-col="cost"] button')
    costs = column(page, SLOWEST, "cost")
    assert costs[:3] == ["$0.019", "$0.0017", "$0.00059"] and all(c.startswith("—") for c in costs[3:]), costs
    page.click(f'{SLOWEST} th[data-col="latency"] button')
    latency = [as_ms(text) for text in column(page, SLOWEST, "latency")]
    assert latency == sorted(latency) and latency[0] < 1 and latency[-1] > 100, latency  # 0.18 ms before 415 ms


def as_ms(text: str) -> float:
    """A duration as the dashboard writes it ("0.18 ms", "415 ms", "1.20 s") in ms."""
    value, unit = text.split()
    return float(value) * (1000 if unit == "s" else 1)


def test_a_filter_keeps_the_rows_that_match_any_cell(page, dashboard):
    open_tools(page, dashboard.url + "#/tools")
    box = page.locator('input.table-filter[data-table="tools"]')
    box.fill("FETCH")  # any case
    assert tool_order(page) == ["fetch_page"]
    assert page.locator('.table-view[data-table="tools"] .table-count').inner_text() == "1 of 6 rows"
    box.fill("67%")  # a figure in another column: fetch_page's failure share
    assert tool_order(page) == ["fetch_page"]
    box.fill("no such tool")
    assert tool_order(page) == []
    assert "no row matches “no such tool”" in page.locator(f"{TOOLS} tbody").inner_text()
    box.fill("")
    assert len(tool_order(page)) == 6
    # every table of every page has its box
    for route, count in (("#/", 1), ("#/turns", 3), ("#/declared", 3)):  # declared: one table per agent
        page.goto(dashboard.url + route)
        page.wait_for_selector("main table tbody tr", timeout=WAIT_MS)
        expect(page.locator("main .table-view")).to_have_count(count, timeout=WAIT_MS)
        assert page.locator("main .table-view input.table-filter").count() == page.locator("main table").count()


def test_a_shared_url_opens_with_the_same_filter_and_sort(page, dashboard, browser):
    open_tools(page, dashboard.url + "#/tools")
    page.click(f'{TOOLS} th[data-col="calls"] button')
    page.click(f'{TOOLS} th[data-col="calls"] button')
    page.locator('input.table-filter[data-table="tools"]').fill("_")
    expect(page).to_have_url(re.compile(r"tools\.filter=_"), timeout=WAIT_MS)
    shared = page.url
    assert "tools.sort=-calls" in shared
    seen = tool_order(page)
    assert seen == ["web_search", "book_table", "fetch_page", "get_weather"]  # by calls: 4, 3, 3, 2

    context = browser.new_context(viewport={"width": 420, "height": 900})  # a fresh browser, a phone
    try:
        fresh = context.new_page()
        open_tools(fresh, shared)
        assert tool_order(fresh) == seen
        assert sort_state(fresh, TOOLS) == {"calls": "descending"}
        assert fresh.locator('input.table-filter[data-table="tools"]').input_value() == "_"
        fresh.reload()
        fresh.wait_for_selector(f"{TOOLS} tbody tr[data-tool]", timeout=WAIT_MS)
        assert tool_order(fresh) == seen
    finally:
        context.close()


def test_back_returns_to_the_view_before(page, dashboard):
    open_tools(page, dashboard.url + "#/tools")
    server_order = tool_order(page)
    page.click(f'{TOOLS} th[data-col="tool"] button')
    page.locator('input.table-filter[data-table="tools"]').fill("_")
    expect(page).to_have_url(re.compile(r"tools\.filter=_"), timeout=WAIT_MS)
    filtered = tool_order(page)
    assert filtered == sorted(t for t in server_order if "_" in t) and len(filtered) == 4

    page.go_back()  # the filter goes, the sort stays
    expect(page.locator(f"{TOOLS} tbody tr[data-tool]")).to_have_count(6, timeout=WAIT_MS)
    assert tool_order(page) == sorted(server_order)
    assert page.locator('input.table-filter[data-table="tools"]').input_value() == ""
    page.go_back()  # the server's order
    expect(page.locator(f"{TOOLS} th[aria-sort]")).to_have_count(0, timeout=WAIT_MS)
    assert tool_order(page) == server_order
    page.go_forward()
    expect(page.locator(f'{TOOLS} th[aria-sort="ascending"]')).to_have_count(1, timeout=WAIT_MS)
    assert tool_order(page) == sorted(server_order)


def test_the_keyboard_sorts_and_filters(page, dashboard):
    open_tools(page, dashboard.url + "#/tools")
    box = page.locator('input.table-filter[data-table="tools"]')
    box.focus()
    page.keyboard.type("_")
    assert "render" not in tool_order(page)
    page.keyboard.press("Tab")  # from the box to the first header: a button
    assert page.evaluate("document.activeElement.matches('th[data-col=\"tool\"] button.sort-btn')")
    page.keyboard.press("Enter")
    assert sort_state(page, TOOLS) == {"tool": "ascending"}
    page.keyboard.press("Space")
    assert sort_state(page, TOOLS) == {"tool": "descending"}
    assert tool_order(page) == ["web_search", "get_weather", "fetch_page", "book_table"]
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    assert sort_state(page, TOOLS) == {"calls": "ascending"}
    assert page.evaluate("document.activeElement.closest('th').dataset.col") == "calls"


def test_a_live_redraw_keeps_the_filter_the_sort_and_the_focus(page, dashboard):
    """The sessions page redraws every few seconds: what the user typed and sorted stays."""
    page.goto(dashboard.url)
    page.wait_for_selector("table.sessions tbody tr .session-link", timeout=WAIT_MS)
    page.click('table.sessions th[data-col="session"] button')
    box = page.locator('input.table-filter[data-table="sessions"]')
    box.focus()
    page.keyboard.type("demo")
    table = page.locator("table.sessions").element_handle()
    page.wait_for_function("(old) => !old.isConnected", arg=table, timeout=WAIT_MS)  # the next poll's redraw
    assert column(page, "table.sessions", "session") == ["demo-concierge"]
    assert sort_state(page, "table.sessions") == {"session": "ascending"}
    assert page.evaluate("document.activeElement.matches('input.table-filter[data-table=\"sessions\"]')")
    page.keyboard.type("-c")
    assert box.input_value() == "demo-c" and column(page, "table.sessions", "session") == ["demo-concierge"]


MANY = 51  # one more session than the sessions page shows, and more turns than "slowest turns" lists


@pytest.fixture(scope="module")
def many_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    """A store of 51 one-turn sessions (the hand API, as webdata.py records)."""
    db = tmp_path_factory.mktemp("many") / "many.duckdb"
    loopscope.configure(db, flush_interval=0.05)
    try:
        for n in range(MANY):
            with loopscope.turn(session_id=f"many-{n:02d}", agent="counter", input=f"count to {n}") as turn:
                turn.generation(f"{n}", usage={"input_tokens": 10 + n, "output_tokens": 1})
    finally:
        loopscope.shutdown()
    yield from webdata.running(make_server(str(db), port=0))


def test_where_the_server_sent_some_rows_the_page_says_the_filter_covers_those(page, many_dashboard):
    page.goto(many_dashboard.url)
    page.wait_for_selector("table.sessions tbody tr .session-link", timeout=WAIT_MS)
    note = page.locator('.table-view[data-table="sessions"] .table-note')
    assert note.inner_text() == "the filter covers the 50 sessions shown; the search above covers all 51"
    page.locator('input.table-filter[data-table="sessions"]').fill("many-0")
    # most recent first; the oldest, many-00, is not on the page, which is what the note says
    assert column(page, "table.sessions", "session") == [f"many-0{n}" for n in range(9, 0, -1)]
    page.click("text=Show more")  # all 51 on the page: nothing left out, no note, the filter kept
    expect(note).to_have_count(0, timeout=WAIT_MS)
    assert page.locator('input.table-filter[data-table="sessions"]').input_value() == "many-0"
    assert column(page, "table.sessions", "session") == [f"many-0{n}" for n in range(9, -1, -1)]

    page.goto(many_dashboard.url + "#/turns")
    page.wait_for_selector(f"{SLOWEST} tbody tr", timeout=WAIT_MS)
    assert page.locator(f"{SLOWEST} tbody tr").count() == 10
    assert "the filter covers these 10 slowest turns" in page.locator('.table-view[data-table="slowest"]').inner_text()
    assert page.locator('.table-view[data-table="models"] .table-note').count() == 0  # every model's row is here


def test_a_shared_url_s_markup_shows_as_text_and_never_runs(page, dashboard):
    """A link is anyone's to write: its filter is put on the page as text, its sort names a column or nothing."""
    markup = "<img src=x onerror=window.__pwned=9>"
    query = urllib.parse.urlencode({"tools.filter": markup, "tools.sort": '"]<b>'})
    page.goto(f"{dashboard.url}#/tools?{query}")
    page.wait_for_selector(f"{TOOLS} tbody tr.no-match", timeout=WAIT_MS)
    assert f"no row matches “{markup}”" in page.locator(f"{TOOLS} tbody").inner_text()
    assert page.locator('input.table-filter[data-table="tools"]').input_value() == markup
    assert sort_state(page, TOOLS) == {}  # no such column: the server's order
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('main img, main b').length") == 0
