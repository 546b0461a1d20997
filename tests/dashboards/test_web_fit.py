"""The web dashboard fits the screen: at a phone's 420 px and a laptop's 1280 px, no page is
wider than the window (wide tables scroll inside their card); a turn's header shows its whole
model name and its end-reason chip; the charts' axes are labelled with the values their
gridlines stand at; the waterfall's details open from the keyboard and by a tap.

The store (``fitdata.py``) holds the long names real agents have, recorded through the real
openai SDK against the fake model server.
"""

from __future__ import annotations

import itertools
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fitdata
import pytest
import webdata

from loopscope.dashboards.web.server import DashboardServer, make_server

WAIT_MS = 15_000
WIDTHS = (420, 1280)
# every page the dashboard has, and what shows once it has loaded
PAGES = {
    "sessions": ("#/", "table.sessions tbody tr .session-link"),
    "session": (f"#/session/{urllib.parse.quote(fitdata.LONG_SESSION, safe='')}", ".turn-summary .reason"),
    "tools": ("#/tools", "table.tools tbody tr[data-tool]"),
    "turns": ("#/turns", ".bar-row"),
    "declared": ("#/declared", "section.agent"),
    "calls": ("#/calls", "table.tool-calls tbody tr[data-call-id]"),
    "search": ("#/?q=example.com", "table.hits tbody tr[data-field]"),
}


@pytest.fixture(scope="module")
def fit_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("fit") / "fit.duckdb"
    fitdata.record(db)
    return db


@pytest.fixture(scope="module")
def fit_dashboard(fit_db: Path) -> Iterator[DashboardServer]:
    yield from webdata.running(make_server(str(fit_db), port=0))


def open_page(page: Any, server: DashboardServer, name: str, width: int) -> None:
    route, ready = PAGES[name]
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(server.url + route)
    page.wait_for_selector(ready, timeout=WAIT_MS)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(PAGES))
def test_no_page_is_wider_than_the_window(page, fit_dashboard, name, width, tmp_path):
    open_page(page, fit_dashboard, name, width)
    wide = page.evaluate(
        """() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
            // what sticks out past the window's edge (a card that hides its overflow cuts it
            // off instead of widening the page), but for what scrolls inside a table's card
            out: [...document.querySelectorAll('body *')].filter((el) => el.getBoundingClientRect().right > window.innerWidth + 0.5
                && !el.closest('.table-scroll')).slice(0, 5).map((el) => `${el.tagName}.${el.getAttribute('class')}`)})"""
    )
    page.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
    assert wide["scroll"] <= wide["inner"], wide
    assert wide["out"] == [], wide


@pytest.mark.parametrize("width", WIDTHS)
def test_wide_tables_scroll_inside_their_card(page, fit_dashboard, width):
    open_page(page, fit_dashboard, "turns", width)
    boxes = page.evaluate(
        """() => [...document.querySelectorAll('main table')].map((table) => {
            const box = table.parentElement;
            return {wrapped: box.classList.contains('table-scroll'), overflow: getComputedStyle(box).overflowX,
                    right: box.getBoundingClientRect().right, inner: window.innerWidth};
        })"""
    )
    assert boxes
    for box in boxes:
        assert box["wrapped"] and box["overflow"] == "auto" and box["right"] <= box["inner"], box


@pytest.mark.parametrize("width", WIDTHS)
def test_the_turn_header_shows_the_whole_model_name_and_the_end_reason(page, fit_dashboard, width):
    open_page(page, fit_dashboard, "session", width)
    head = page.evaluate(
        """() => {
            const head = document.querySelector('.turn-head');
            const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
            const model = head.querySelector('.turn-model');
            const reason = head.querySelector('.reason');
            const line = parseFloat(getComputedStyle(model).lineHeight);
            return {head: box(head), model: box(model), reason: box(reason), model_text: model.textContent,
                    model_lines: Math.round(model.getBoundingClientRect().height / line),
                    model_clipped: model.scrollWidth > model.clientWidth + 0.5,
                    reason_clipped: reason.scrollWidth > reason.clientWidth + 0.5};
        }"""
    )
    assert head["model_text"] == fitdata.LONG_MODEL  # the whole name, never cut
    assert not head["model_clipped"] and not head["reason_clipped"]
    assert head["model_lines"] <= (1 if width >= 1280 else 2), head  # one line, or two at a phone's width
    for part in ("model", "reason"):  # both inside the header
        assert head["head"]["left"] <= head[part]["left"] and head[part]["right"] <= head["head"]["right"] + 0.5, head
    # the chip is whole: not under the model name
    assert head["reason"]["top"] >= head["model"]["bottom"] - 0.5 or head["reason"]["left"] >= head["model"]["right"], (
        head
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_tool_and_session_names_are_never_cut(page, fit_dashboard, width):
    open_page(page, fit_dashboard, "session", width)
    cut = page.evaluate(
        """() => [...document.querySelectorAll('.tool-name, .session-title, .turn-agent')]
            .filter((el) => el.scrollWidth > el.clientWidth + 0.5 || el.getBoundingClientRect().right > el.closest('main').getBoundingClientRect().right)
            .map((el) => el.textContent)"""
    )
    assert cut == []


def axis_checks(page: Any) -> list[dict[str, Any]]:
    """Each chart's tick labels, the y of each label's gridline, and its bars' values and heights."""
    return page.evaluate(
        """() => [...document.querySelectorAll('svg.chart')].filter((svg) => svg.querySelector('rect.series')).map((svg) => {
            const labels = [...svg.querySelectorAll('text.axis')].filter((t) => t.getAttribute('text-anchor') === 'end' && t.getAttribute('x') < 60);
            return {
                label: svg.getAttribute('aria-label'),
                ticks: labels.map((t) => ({text: t.textContent, y: parseFloat(t.getAttribute('y')) - 4})),
                grid: [...svg.querySelectorAll('line.grid')].map((l) => parseFloat(l.getAttribute('y1'))),
                bars: [...svg.querySelectorAll('rect.series')].map((r) => ({
                    value: Number(r.querySelector('title').textContent.split(': ').pop().replace(/,/g, '')),
                    y: parseFloat(r.getAttribute('y')), height: parseFloat(r.getAttribute('height'))})),
            };
        })"""
    )


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("route", ["#/tools", "#/turns"])
def test_chart_ticks_are_labelled_with_the_values_they_stand_at(page, fit_dashboard, route, width):
    """Five tool calls in one bucket: a gridline half way up stands at 2.5, never labelled "3"."""
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(fit_dashboard.url + route)
    page.wait_for_selector("svg.chart rect.series", timeout=WAIT_MS)
    # the labels are as large on a phone as on a laptop (a chart is not a shrunk wide drawing)
    sizes = page.evaluate(
        "() => [...document.querySelectorAll('svg.chart text.axis')].map((t) => t.getBoundingClientRect().height)"
    )
    assert sizes and min(sizes) >= 10, sizes
    charts = axis_checks(page)
    assert len(charts) == (1 if route == "#/tools" else 2)
    for chart in charts:
        values = [float(t["text"].replace(",", "")) for t in chart["ticks"]]
        assert len(values) >= 3, chart
        assert all(v == int(v) for v in values), chart  # every axis here is a count
        assert values == sorted(values) and values[0] == 0, chart
        steps = {round(b - a, 9) for a, b in itertools.pairwise(values)}
        assert len(steps) == 1, chart  # evenly spaced
        [step] = steps
        assert step > 0 and str(int(step)).rstrip("0") in {"1", "2", "25", "5"}, chart  # a nice step
        assert min(b["y"] for b in chart["bars"]) >= min(chart["grid"]) - 0.5, (
            chart
        )  # the tallest bar under the top tick
        # each label sits on its gridline, and the gridline is where a bar of that value would reach
        assert sorted(chart["grid"]) == sorted(t["y"] for t in chart["ticks"]), chart
        base = next(t["y"] for t in chart["ticks"] if t["text"] == "0")
        bar = max(chart["bars"], key=lambda b: b["height"])
        per_unit = bar["height"] / bar["value"]
        for value, tick in zip(values, chart["ticks"], strict=True):
            assert abs((base - tick["y"]) - value * per_unit) <= 0.5, (value, tick, chart)


def detail_of(page: Any, row: str) -> dict[str, Any]:
    """Whether ``row``'s details are on screen, and their text."""
    return page.evaluate(
        """(selector) => {
            const row = document.querySelector(selector);
            const detail = document.getElementById(row.getAttribute('aria-controls'));
            const r = detail.getBoundingClientRect();
            return {shown: !detail.hidden && r.height > 0, text: detail.textContent, expanded: row.getAttribute('aria-expanded')};
        }""",
        row,
    )


def test_waterfall_details_open_from_the_keyboard(page, fit_dashboard):
    open_page(page, fit_dashboard, "session", 420)
    page.wait_for_selector(".waterfall .wf-row.call", timeout=WAIT_MS)
    # Tab from the top of the page reaches the waterfall's first row (a model call)
    page.locator("#live-toggle").focus()
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.matches('.wf-row')"):
            break
    first = '.waterfall .wf-row[data-kind="call"][data-position="1"]'
    assert page.evaluate(f"document.activeElement === document.querySelector('{first}')")
    shown = detail_of(page, first)  # focus shows the details, as text on the page
    assert (
        shown["shown"]
        and f"model call #1: {fitdata.LONG_MODEL}" in shown["text"]
        and "1,100 in / 23 out" in shown["text"]
    )
    page.keyboard.press("Escape")
    assert not detail_of(page, first)["shown"]
    page.keyboard.press("Enter")  # kept open: still shown when the focus moves on
    assert detail_of(page, first) | {"text": ""} == {"shown": True, "text": "", "expanded": "true"}
    page.keyboard.press("Tab")  # the next row: its details shown on focus, the first's kept
    second = page.evaluate(
        """() => { const el = document.activeElement;
            return el.matches('.wf-row') ? `.waterfall .wf-row[aria-controls="${el.getAttribute('aria-controls')}"]` : null; }"""
    )
    assert second and second != first
    assert detail_of(page, first)["shown"] and detail_of(page, second)["shown"]
    assert detail_of(page, second)["text"].startswith(("model call #2: ", f"tool call: {fitdata.LONG_TOOL} (call_0)"))
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")  # Enter again closes it
    page.keyboard.press("Tab")
    assert not detail_of(page, first)["shown"] and detail_of(page, first)["expanded"] == "false"


def test_waterfall_details_open_with_a_tap(browser, fit_dashboard):
    context = browser.new_context(viewport={"width": 420, "height": 900}, has_touch=True, is_mobile=True)
    try:
        tab = context.new_page()
        tab.goto(fit_dashboard.url + PAGES["session"][0])
        row = '.waterfall .wf-row[data-kind="tool"][data-tool-id="call_2"]'
        tab.wait_for_selector(row, timeout=WAIT_MS)
        assert not detail_of(tab, row)["shown"]
        tab.tap(row)
        shown = detail_of(tab, row)
        assert (
            shown["shown"]
            and f"tool call: {fitdata.LONG_TOOL} (call_2)" in shown["text"]
            and "outcome: served" in shown["text"]
        )
        tab.tap(".turn-summary")  # a tap elsewhere leaves it open
        assert detail_of(tab, row)["shown"]
        tab.tap(row)  # a second tap on the row closes it
        assert not detail_of(tab, row)["shown"]
    finally:
        context.close()
