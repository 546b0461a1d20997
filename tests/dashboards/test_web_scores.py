"""Scores in the web dashboard, in headless chromium: a turn's card shows its scores (and its
tool call's card that call's; one given from the command line while the page is open shows
without a reload), and the Scores page lists them by agent, model and tool and
among the recent ones, without the page getting wider than a phone's window."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import webdata
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.cli import main
from loopscope.dashboards.web.server import DashboardServer, make_server

WAIT_MS = 15_000


@pytest.fixture(scope="module")
def scored_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("scores") / "scores.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), capture_content=True, flush_interval=0.05)
    try:
        with loopscope.turn(session_id="scored", agent="concierge", input="Dinner outside?", model="gpt-4o",
                            provider="openai") as t:
            t.generation("Checking.", tool_calls=[{"id": "call_w", "name": "get_weather", "arguments": {"city": "Paris"}}],
                         response_id="resp_1")
            with loopscope.tool("get_weather", call_id="call_w") as call:
                call.set_result({"temp_c": 21})
                loopscope.score(None, "tool_ok", label="pass", source="code")
            t.generation("21 °C: a terrace works.", finish_reason="stop", response_id="resp_2")
        loopscope.score(t, "helpful", value=1, label="up", explanation="answered the question")
        loopscope.score("resp_2", "accurate", value=0.5)
    finally:
        loopscope.shutdown()
    return db


@pytest.fixture(scope="module")
def scored_dashboard(scored_db: Path) -> Iterator[DashboardServer]:
    yield from webdata.running(make_server(str(scored_db), port=0))


def test_a_score_shows_on_its_turn_and_tool_call_and_the_scores_page_lists_it(page: Any, scored_db: Path,
                                                                             scored_dashboard: DashboardServer):
    page.goto(scored_dashboard.url + "#/session/scored")
    page.wait_for_selector(".turn .turn-scores .score-chip[data-score='helpful']", timeout=WAIT_MS)
    turn_chips = page.locator(".turn > .turn-scores .score-chip")
    assert sorted(turn_chips.all_text_contents()) == ["accurate 0.50 · model call #2", "helpful 1 up"]
    assert "answered the question" in page.get_attribute(".score-chip[data-score='helpful']", "title")
    tool_chip = page.locator(".tool-card[data-tool-id='call_w'] .score-chip")
    assert tool_chip.text_content() == "tool_ok pass"

    # a thumbs-up from a script while the page is open: it shows on the turn without a reload
    turn_id = page.get_attribute(".turn[data-correlation-id]", "data-correlation-id")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--db", str(scored_db), "score", turn_id, "late_thumbs", "--label", "down"]) == 0
    page.wait_for_selector(".turn > .turn-scores .score-chip[data-score='late_thumbs'].bad", timeout=WAIT_MS)

    page.set_viewport_size({"width": 420, "height": 900})
    page.click("#nav a[data-route='scores']")
    page.wait_for_selector("table[data-table='scores-recent'] tbody tr[data-score-id]", timeout=WAIT_MS)
    recent = page.locator("table[data-table='scores-recent'] tbody tr")
    assert recent.count() == 4
    assert any(text.startswith("helpful") for text in page.locator("table[data-table='scores-recent'] .score-chip").all_text_contents())
    by_tool = page.locator("table[data-table='scores-tools'] tbody tr").all_inner_texts()
    assert len(by_tool) == 1 and "tool_ok" in by_tool[0] and "get_weather" in by_tool[0] and "pass 1" in by_tool[0]
    by_agent = page.locator("table[data-table='scores-agents'] tbody tr").all_inner_texts()
    assert len(by_agent) == 4 and all("concierge" in row for row in by_agent)
    wide = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"the Scores page is {wide} px wider than a 420 px window"
    page.click("table[data-table='scores-recent'] tbody tr .session-link")
    page.wait_for_selector(".turn .turn-scores .score-chip", timeout=WAIT_MS)
