"""The turn waterfall and the cost figures, in a real headless browser.

A two-round tool loop is recorded with the real openai SDK (streamed, through the
``chat.completions.stream`` helper) against the fake model server: model call 1 asks for
the ``weather`` tool, the tool runs, model call 2 answers. The page must draw one row
per model call and per tool call on one time axis, in start order, with bars placed as the
stored rows' times say; streamed calls carry a time-to-first-chunk mark; a failed call is
styled as failed; cost shows where a price is known and "—"/"no price" where it is not.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import webdata

import loopscope
from fakes.model_server import STANDS_FOR, FakeModelServer, Reply, ToolCall, Usage
from loopscope.dashboards.web.server import DashboardServer, make_server

WAIT_MS = 15_000
PRICED = "gpt-4o-mini"  # in genai-prices' database
UNPRICED = "house-model-7"  # in no price list
MARKUP_MODEL = "<img src=x onerror=window.__pwned=5>"  # a model name is data: shown as text, never run
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@loopscope.tool("weather")
def weather(city: str) -> dict[str, Any]:
    time.sleep(0.25)  # long enough for a bar a few pixels wide
    return {"city": city, "temp_c": 21}


def tool_loop(client: Any, model: str, prompt: str) -> str:
    """The loop an application writes: stream, run the tools asked for, ask again."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(4):
        with client.chat.completions.stream(
            model=model, messages=messages, tools=TOOLS, stream_options={"include_usage": True}
        ) as stream:
            message = stream.get_final_completion().choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = weather(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    raise AssertionError("the loop did not end")


def record(db: Path) -> None:
    loopscope.configure(db, flush_interval=0.05, prices=STANDS_FOR)  # the fake server stands for OpenAI: priced
    loopscope.instrument(anthropic=False)
    try:
        with FakeModelServer() as server:
            client = server.openai_client()
            first = Reply(
                text="Let me check.",
                tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")],
                usage=Usage(1200, 40, cached_tokens=200),
                delay=0.15,
                chunk_delay=0.02,
            )
            second = Reply(text="21 °C and dry in Paris.", usage=Usage(1300, 12), delay=0.1, chunk_delay=0.02)
            server.queue(first, second, match="[priced]")
            server.queue(
                Reply(text="Looking.", tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_o1")], delay=0.05),
                Reply.error(500, "the house model fell over"),
                match="[unpriced]",
            )
            server.queue(Reply(text="The answer runs on and on", stop="length"), match="[long]")
            server.queue(Reply(text="", stop="content_filter"), match="[filtered]")
            with loopscope.session("waterfall-outcomes"):
                for prompt in ("[long] Tell me everything.", "[filtered] Something the filter withholds."):
                    for _chunk in client.chat.completions.create(
                        model=PRICED, messages=[{"role": "user", "content": prompt}], stream=True
                    ):
                        pass
            with loopscope.session("waterfall-markup"):
                client.chat.completions.create(model=MARKUP_MODEL, messages=[{"role": "user", "content": "[markup]"}])
            with loopscope.session("waterfall-priced"):
                assert tool_loop(client, PRICED, "[priced] Weather in Paris?") == "21 °C and dry in Paris."
            with loopscope.session("waterfall-unpriced"), pytest.raises(openai.InternalServerError):
                tool_loop(client, UNPRICED, "[unpriced] Weather in Oslo?")
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()


@pytest.fixture(scope="module")
def loop_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("waterfall") / "loop.duckdb"
    record(db)
    return db


@pytest.fixture(scope="module")
def loop_dashboard(loop_db: Path) -> Iterator[DashboardServer]:
    yield from webdata.running(make_server(str(loop_db), port=0))


def session_url(server: DashboardServer, session_id: str) -> str:
    return f"{server.url}#/session/{urllib.parse.quote(session_id, safe='')}"


def bars(page: Any) -> list[dict[str, Any]]:
    """The waterfall's rows on screen, top to bottom: kind, name, outcome, and where the
    bar and the first-chunk mark are drawn (pixels)."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.waterfall .wf-row:not(.wf-head)')].map((row) => {
            const bar = row.querySelector('.wf-bar').getBoundingClientRect();
            const mark = row.querySelector('.wf-ttfc');
            return {
                kind: row.dataset.kind, name: row.dataset.name, outcome: row.dataset.outcome,
                label: [...row.querySelectorAll('.wf-label > :not(.wf-icon)')].map((el) => el.textContent).join(' '),
                title: row.title,
                bar_class: row.querySelector('.wf-bar').getAttribute('class'),
                left: bar.left, right: bar.right, mark: mark ? mark.getBoundingClientRect().left + 1 : null,
            };
        })"""
    )


def ms(value: Any) -> float:
    return value.timestamp() * 1000


def _js_round(ms: float) -> int:
    """The page's ``Math.round``: halves up (Python's ``round`` takes 258.5 to 258, the page to 259)."""
    return math.floor(ms + 0.5)


def test_a_tool_loop_is_one_waterfall_in_start_order(page, loop_db, loop_dashboard, tmp_path):
    store = loopscope.Store(str(loop_db))
    calls = store.model_calls("waterfall-priced")
    assert [c.position for c in calls] == [1, 2]
    start, end = (e for e in store.get_timeline("waterfall-priced") if e.type.startswith("tool_call"))
    tool_start = ms(start.created_at)
    tool_end = tool_start + end.content.duration_ms

    page.goto(session_url(loop_dashboard, "waterfall-priced"))
    page.wait_for_selector(".turn-summary .reason", timeout=WAIT_MS)
    page.wait_for_selector(".waterfall .wf-row.call >> nth=1", timeout=WAIT_MS)
    shown = bars(page)
    # one row per model call and per tool call, in start order, named by model / tool
    assert [(b["kind"], b["name"]) for b in shown] == [("call", PRICED), ("tool", "weather"), ("call", PRICED)]
    first, tool, second = shown
    # the tool bar starts after the first call's bar ends, the second call's after the tool's
    assert first["right"] <= tool["left"] + 1 and tool["right"] <= second["left"] + 1
    assert first["left"] < tool["left"] < second["left"]
    # and every bar is where the stored rows' times put it on the one axis (to 2% of the distance)
    t0, t1 = ms(calls[0].started_at), ms(calls[1].started_at)
    x0, x1 = first["left"], second["left"]

    def place(t: float) -> float:  # the x of time t on the page
        return x0 + (t - t0) / (t1 - t0) * (x1 - x0)
    tolerance = 0.02 * (x1 - x0)
    assert abs(tool["left"] - place(tool_start)) <= tolerance
    assert abs(tool["right"] - place(tool_end)) <= tolerance
    assert abs(first["right"] - place(ms(calls[0].ended_at))) <= tolerance
    assert abs(second["right"] - place(ms(calls[1].ended_at))) <= tolerance
    # streamed calls carry their time to first chunk, inside their bar where the row says
    for row, call in ((first, calls[0]), (second, calls[1])):
        assert call.streaming and call.time_to_first_chunk_ms is not None
        assert row["left"] <= row["mark"] <= row["right"]
        assert abs(row["mark"] - place(ms(call.started_at) + call.time_to_first_chunk_ms)) <= tolerance
    assert tool["mark"] is None
    # labels: name and duration; hover text: tokens and cost
    assert first["label"] == f"{PRICED} {_js_round(calls[0].duration_ms)} ms"
    assert tool["label"] == f"weather {_js_round(end.content.duration_ms)} ms"
    assert "1,200 in / 40 out" in first["title"] and "cache read 200" in first["title"]
    assert "cost: $" in first["title"] and "first chunk after" in first["title"]
    assert all(b["outcome"] in ("completed", "served") for b in shown)
    assert "weather (call_w1)" in tool["title"]
    shoot(page, tmp_path / "waterfall.png")


def usd(text: str) -> float:
    assert text.startswith("$"), text
    return float(text[1:])


def test_costs_show_where_priced_and_no_price_never_as_zero(page, loop_db, loop_dashboard, tmp_path):
    store = loopscope.Store(str(loop_db))
    priced = sum(c.cost_usd for c in store.model_calls("waterfall-priced"))
    assert priced > 0
    assert [c.cost_usd for c in store.model_calls("waterfall-unpriced")] == [None, None]

    page.goto(session_url(loop_dashboard, "waterfall-priced"))
    page.wait_for_selector(".turn-summary .reason", timeout=WAIT_MS)
    header = page.locator(".turn-head .cost").text_content()
    assert usd(header) == pytest.approx(priced, rel=0.03)  # two significant digits
    summary = page.locator(".turn-summary .sum-item").all_text_contents()
    assert {"2 model calls", "1 tool round", "1 tool call", f"cost {header}"} <= set(summary)

    page.goto(session_url(loop_dashboard, "waterfall-unpriced"))
    page.wait_for_selector(".turn-summary .reason", timeout=WAIT_MS)
    assert page.locator(".turn-head .cost").text_content() == "— no price"
    assert "cost — no price" in page.locator(".turn-summary .sum-item").all_text_contents()
    assert "$" not in page.locator(".turn").inner_text()  # never $0
    assert all("cost: — (no price)" in b["title"] for b in bars(page) if b["kind"] == "call")

    page.goto(loop_dashboard.url)
    page.wait_for_selector("table.sessions tbody tr", timeout=WAIT_MS)
    cost_column = page.evaluate(
        """() => {
            const heads = [...document.querySelectorAll('table.sessions th')].map((th) => th.innerText.toLowerCase());
            const at = heads.indexOf('cost');
            return Object.fromEntries([...document.querySelectorAll('table.sessions tbody tr')].map(
                (tr) => [tr.querySelector('.session-link').textContent, tr.children[at].textContent]));
        }"""
    )
    assert usd(cost_column["waterfall-priced"]) == pytest.approx(priced, rel=0.03)
    assert cost_column["waterfall-unpriced"] == "— no price"
    # the store's total: the priced calls' sum, and the one call with tokens but no price
    card = page.locator(".stat", has_text="Cost")
    every = store.model_calls(limit=None)
    unpriced = [c for c in every if c.cost_usd is None and c.usage]  # tokens, no price (the house and markup models)
    assert len(unpriced) == 2
    assert usd(card.locator(".stat-value").text_content()) == pytest.approx(sum(c.cost_usd or 0 for c in every), rel=0.03)
    assert card.locator(".stat-sub").text_content() == f"{len(every)} model calls, 2 without a price"
    shoot(page, tmp_path / "sessions-cost.png")


def test_how_a_call_ended_is_visible(page, loop_dashboard, tmp_path):
    page.goto(session_url(loop_dashboard, "waterfall-unpriced"))
    page.wait_for_selector(".waterfall .wf-row.call >> nth=1", timeout=WAIT_MS)
    shown = bars(page)
    assert [(b["kind"], b["outcome"]) for b in shown] == [("call", "completed"), ("tool", "served"), ("call", "error")]
    failed = shown[2]
    assert "o-error" in failed["bar_class"] and "error" in failed["label"]
    assert "InternalServerError" in failed["title"] and "the house model fell over" in failed["title"]

    page.goto(session_url(loop_dashboard, "waterfall-outcomes"))
    page.wait_for_selector(".turn .waterfall >> nth=1", timeout=WAIT_MS)
    shown = bars(page)
    assert [b["outcome"] for b in shown] == ["truncated", "content_filter"]
    assert "o-truncated" in shown[0]["bar_class"] and "truncated" in shown[0]["label"]
    assert "o-content_filter" in shown[1]["bar_class"] and "content filter" in shown[1]["label"]
    shoot(page, tmp_path / "outcomes.png")


def test_a_model_name_with_markup_shows_as_text(page, loop_dashboard):
    page.goto(session_url(loop_dashboard, "waterfall-markup"))
    page.wait_for_selector(".waterfall .wf-row.call", timeout=WAIT_MS)
    [call] = bars(page)
    assert call["name"] == MARKUP_MODEL and call["label"].startswith(MARKUP_MODEL)
    assert MARKUP_MODEL in call["title"]
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('img[src=x]').length") == 0


def test_turns_page_names_tool_rounds_and_model_calls(page, loop_dashboard, tmp_path):
    page.goto(loop_dashboard.url + "#/turns")
    page.wait_for_selector(".bar-row", timeout=WAIT_MS)
    heads = page.locator("th").all_inner_texts()
    assert {"MODEL CALLS", "TOOL ROUNDS", "MODEL CALLS / TURN", "TOOL ROUNDS / TURN"} <= {h.upper() for h in heads}
    assert not any(h.upper() == "ROUNDS" for h in heads)
    slowest = page.locator("section.panel", has_text="Slowest turns")
    row = slowest.locator("tbody tr", has_text="house-model-7")
    assert "— no price" in row.text_content()
    shoot(page, tmp_path / "turns-cost.png")


def shoot(page: Any, path: Path) -> None:
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
