"""The web dashboard in a real headless browser (Debian's chromium, driven by playwright).

Screenshots of every page go to the test's tmp_path. With LOOPSCOPE_UPDATE_SCREENSHOT=1
the session timeline is also saved as docs/screenshot.png (the README's picture).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import webdata

import loopscope
from loopscope.dashboards.web.server import make_server

ROOT = Path(__file__).resolve().parents[2]
WAIT_MS = 15_000


def session_url(server, session_id: str, blocked: bool = False) -> str:
    return f"{server.url}#/session/{urllib.parse.quote(session_id, safe='')}" + ("?blocked=1" if blocked else "")


def shoot(page, path: Path, full: bool = True) -> None:
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=full)
    assert path.stat().st_size > 10_000


def test_sessions_page_lists_and_searches(page, dashboard, tmp_path):
    from playwright.sync_api import expect

    page.goto(dashboard.url)
    rows = page.locator("table.sessions tbody tr")
    rows.first.wait_for(timeout=WAIT_MS)
    assert rows.count() == 3
    assert page.locator(".stat .stat-value").first.inner_text() == "3"
    text = page.locator("table.sessions").inner_text()
    for session in ("demo-concierge", "research-7f3a", webdata.XSS_SESSION):
        assert session in text
    shoot(page, tmp_path / "sessions.png")
    page.fill("#session-search", "research")
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    assert "research-7f3a" in page.locator("table.sessions").inner_text()
    page.fill("#session-search", "no such thing")
    page.wait_for_selector("table.sessions td.empty", timeout=WAIT_MS)
    page.fill("#session-search", "")
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    page.click("text=demo-concierge")
    page.wait_for_selector(".tool-card", timeout=WAIT_MS)
    assert "#/session/demo-concierge" in page.url


def test_timeline_shows_text_tool_cards_and_turn_summaries(page, dashboard, tmp_path):
    page.goto(session_url(dashboard, "demo-concierge"))
    page.wait_for_selector(".turn-summary .reason", timeout=WAIT_MS)
    cards = page.locator(".tool-card")
    assert cards.count() == 5
    states = [cards.nth(i).get_attribute("data-state") for i in range(5)]
    assert states == ["served", "failed", "served", "served", "served"]
    failed = page.locator('.tool-card[data-state="failed"]')
    assert "book_table" in failed.inner_text() and "BookingServiceError" in failed.inner_text()
    first = cards.first.inner_text()
    assert "get_weather" in first and '"city": "Lisbon"' in first and "ms" in first
    turns = page.locator(".turn")
    assert turns.count() == 2
    assert [turns.nth(i).get_attribute("data-state") for i in range(2)] == ["finished", "finished"]
    summary = page.locator(".turn-summary").first.inner_text()
    assert "completed" in summary and "3 tool rounds" in summary and "3 tool calls" in summary
    assert "1,633 in / 144 out tokens" in summary and "latency" in summary
    assert page.locator(".msg.role-user").count() == 2
    assert "Let me check tomorrow's forecast" in page.locator(".msg.role-assistant").first.inner_text()
    shoot(page, tmp_path / "timeline.png")


def test_blocked_rows_appear_on_request(page, dashboard, tmp_path):
    page.goto(session_url(dashboard, "research-7f3a"))
    page.wait_for_selector(".turn-summary", timeout=WAIT_MS)
    assert page.locator(".msg.blocked").count() == 0
    assert page.locator('.tool-card[data-state="refused"]').count() == 1
    assert page.locator('.tool-card[data-state="blocked"]').count() == 1
    assert "max_rounds" in page.locator(".turn").last.inner_text()
    page.check("#blocked-toggle")
    page.wait_for_selector(".msg.blocked", timeout=WAIT_MS)
    blocked = page.locator(".msg.blocked")
    assert blocked.count() == 1 and "personal address" in blocked.inner_text()
    assert page.url.endswith("?blocked=1")
    shoot(page, tmp_path / "blocked.png")
    if os.environ.get("LOOPSCOPE_UPDATE_SCREENSHOT") == "1":  # the README's picture
        page.set_viewport_size({"width": 1280, "height": 1140})
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(200)
        page.screenshot(path=str(ROOT / "docs" / "screenshot.png"))


def test_markup_in_the_data_shows_as_text_and_never_runs(page, dashboard, tmp_path):
    page.goto(dashboard.url)
    page.wait_for_selector("table.sessions tbody tr", timeout=WAIT_MS)
    page.goto(session_url(dashboard, webdata.XSS_SESSION))
    card = page.locator(".tool-card")
    card.wait_for(timeout=WAIT_MS)
    page.wait_for_selector(".turn-summary", timeout=WAIT_MS)
    assert webdata.XSS_RESULT in card.inner_text()
    assert "<img src=x onerror=window.__pwned=2>" in card.inner_text()
    assert webdata.XSS_TEXT in page.locator(".msg.role-assistant").first.inner_text()
    assert webdata.XSS_AGENT in page.locator(".turn-head").inner_text()
    assert webdata.XSS_SESSION in page.locator(".session-title").inner_text()
    for route in ("#/turns", "#/declared", "#/tools", "#/"):
        page.goto(dashboard.url + route)
        page.wait_for_selector("table", timeout=WAIT_MS)
        page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    # the only scripts on the page are ours (those index.html names); no element came from the data
    ours = re.findall(r'<script src="([^"]+)"', page.request.get(dashboard.url).text())
    assert "/static/app.js" in ours
    assert page.evaluate("[...document.scripts].map(s => s.getAttribute('src'))") == ours
    assert page.evaluate("document.querySelectorAll('img[src=x], b, svg[onload]').length") == 0
    shoot(page, tmp_path / "xss.png")


def test_analytics_pages(page, dashboard, tmp_path):
    page.goto(dashboard.url + "#/tools")
    page.wait_for_selector("table.tools tbody tr[data-tool]", timeout=WAIT_MS)
    rows = page.locator("table.tools tbody tr[data-tool]")
    assert rows.count() == 6
    search = page.locator('tr[data-tool="web_search"]').inner_text()
    assert "25%" in search  # one of four calls blocked
    assert page.locator("svg.chart rect.series").count() > 0
    shoot(page, tmp_path / "tools.png")
    page.click('tr[data-tool="fetch_page"] a')
    page.wait_for_selector("text=Calls over time — fetch_page", timeout=WAIT_MS)

    page.goto(dashboard.url + "#/turns")
    page.wait_for_selector(".bar-row", timeout=WAIT_MS)
    reasons = page.locator(".bar-row")
    assert reasons.count() == 2
    assert reasons.first.get_attribute("data-reason") == "completed"
    assert "5 · 83%" in reasons.first.inner_text()
    assert "gpt-4o-mini" in page.locator("main").inner_text()
    assert page.locator("svg.chart").count() == 2
    shoot(page, tmp_path / "turns.png")

    page.goto(dashboard.url + "#/declared")
    page.wait_for_selector('section.agent[data-agent="researcher"]', timeout=WAIT_MS)
    researcher = page.locator('section.agent[data-agent="researcher"]')
    assert researcher.locator("tr.never").count() == 2
    assert {researcher.locator("tr.never td").nth(i * 6).inner_text() for i in range(2)} == {"send_email", "translate"}
    shoot(page, tmp_path / "declared.png")

    page.click("text=last 15m")
    page.wait_for_selector('section.agent[data-agent="researcher"]', timeout=WAIT_MS)
    assert page.evaluate("localStorage.getItem('loopscope.range')") == "15m"


def test_a_running_tool_shows_as_running_then_the_turn_finishes(page, tmp_path):
    """A child process records a turn whose tool waits; the page follows it live."""
    db = tmp_path / "live.duckdb"
    release = tmp_path / "release"
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("slow_agent.py")), str(db), "live-1", str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = make_server(str(db), port=0)
    try:
        for live in webdata.running(server):
            store = loopscope.Store(str(db))
            deadline = time.monotonic() + 30
            while not (db.exists() and _has_pending_call(store)):
                assert child.poll() is None, child.stdout.read()
                assert time.monotonic() < deadline, "the child never started its tool"
                time.sleep(0.1)

            page.goto(session_url(live, "live-1"))
            running_card = page.locator('.tool-card[data-tool-id="slow_1"][data-state="running"]')
            running_card.wait_for(timeout=WAIT_MS)
            assert "slow_lookup" in running_card.inner_text() and "running" in running_card.inner_text()
            assert page.locator(".turn").get_attribute("data-state") == "running"
            assert "still running" in page.locator(".turn-summary.pending").inner_text()
            # the waterfall of the running turn: its first model call, then the tool still running
            rows = page.locator(".waterfall .wf-row:not(.wf-head)")
            assert [rows.nth(i).get_attribute("data-outcome") for i in range(rows.count())] == ["completed", "running"]
            assert "running" in page.locator('.wf-row.tool[data-outcome="running"] .wf-duration').inner_text()
            shoot(page, tmp_path / "running.png")
            # the keyboard's row keeps its focus and its details through the live redraws
            page.focus('.wf-row.tool[data-tool-id="slow_1"]')
            assert "outcome: running" in page.locator(".wf-detail:not([hidden])").inner_text()

            release.touch()
            # the live poll picks up the end row and the turn summary without a reload
            page.wait_for_selector('.tool-card[data-tool-id="slow_1"][data-state="served"]', timeout=WAIT_MS)
            page.wait_for_selector('.turn[data-state="finished"] .turn-summary .reason', timeout=WAIT_MS)
            assert child.wait(30) == 0, child.stdout.read()
            assert "completed" in page.locator(".turn-summary").inner_text()
            assert page.locator(".tool-card").count() == 1  # the start and the end make one card
            assert '"answer": 42' in page.locator(".tool-card").inner_text()
            page.wait_for_selector(".waterfall .wf-row.call >> nth=1", timeout=WAIT_MS)
            assert [rows.nth(i).get_attribute("data-kind") for i in range(rows.count())] == ["call", "tool", "call"]
            assert page.locator('.wf-row.tool[data-outcome="served"]').count() == 1
            assert page.evaluate("document.activeElement.dataset.toolId") == "slow_1"
            assert "outcome: served" in page.locator(".wf-detail:not([hidden])").inner_text()
            shoot(page, tmp_path / "finished-live.png")

            # and a fresh load shows it finished too
            page.reload()
            page.wait_for_selector('.turn[data-state="finished"] .turn-summary .reason', timeout=WAIT_MS)
            assert page.locator('.tool-card[data-state="served"]').count() == 1
            assert page.locator('.tool-card[data-state="running"]').count() == 0
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)
        child.stdout.close()


def _has_pending_call(store: loopscope.Store) -> bool:
    try:
        return any(e.type == "tool_call_start" for e in store.list_events("live-1"))
    except loopscope.StoreError:
        return False


@pytest.mark.parametrize(
    "path", ["/static/../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "/static/..%2f..%2fetc%2fpasswd"]
)
def test_the_browser_cannot_read_outside_the_static_folder(page, dashboard, path):
    response = page.request.get(dashboard.url.rstrip("/") + path)
    assert response.status in (400, 404)
    assert "root:" not in response.text()


def test_the_browser_cannot_post(page, dashboard):
    page.goto(dashboard.url)
    status = page.evaluate("fetch('/api/overview', {method: 'POST', body: '{}'}).then(r => r.status)")
    assert status == 405
