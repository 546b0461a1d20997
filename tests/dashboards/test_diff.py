"""``loopscope diff`` end to end, on pairs of runs recorded through the hand API into one real
store (``diffdata.py``): the trajectory query (``Reader.trajectory``), the alignment of each pair
as a person would draw it, the ``--json`` shape (docs/diff.md), the terminal's text, the
dashboard's ``/api/diff`` and its side-by-side page in headless chromium at a phone's and a
laptop's width. One module, one recording: the CLI's and the page's tests read the same store.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import webdata

import diffdata
from loopscope.cli import diff as cli_diff
from loopscope.cli import main
from loopscope.dashboards.diff import compare
from loopscope.dashboards.web.server import DashboardServer, make_server
from loopscope.storage.queries import open_reader
from loopscope.storage.results import Trajectory

WAIT_MS = 15_000


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("diff") / "pairs.duckdb"
    diffdata.record(path)
    return str(path)


@pytest.fixture(scope="module")
def diffs(db: str) -> dict[str, dict[str, Any]]:
    reader = open_reader(db)
    out = {}
    for name in diffdata.PAIRS:
        a, b = reader.trajectory(f"{name}-a").trajectory, reader.trajectory(f"{name}-b").trajectory
        assert isinstance(a, Trajectory) and isinstance(b, Trajectory)
        out[name] = compare(a, b)
    return out


def drawn(result: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each row as (op, kind, name, position in A, position in B, changes): what a reader sees."""
    return [
        (r["op"], r["kind"], r["name"], r["a"] and r["a"]["index"], r["b"] and r["b"]["index"], r["changes"])
        for r in result["rows"]
    ]


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the trajectory query -------------------------------------------------------------------------------


def test_a_run_is_found_by_session_turn_or_prefix_and_reads_its_steps_in_order(db):
    reader = open_reader(db)
    session = reader.trajectory("retry-b").trajectory
    assert session is not None and session.kind == "session" and len(session.turn_ids) == 1
    assert [(s.kind, s.name, s.status) for s in session.steps] == [
        ("model_call", diffdata.MODEL, "completed"), ("tool_call", "lookup", "failed"),
        ("model_call", diffdata.MODEL, "completed"), ("tool_call", "lookup", "served"),
        ("model_call", diffdata.MODEL, "completed"), ("end", None, "completed"),
    ]
    failed = session.steps[1]
    assert failed.arguments == {"order": 7} and failed.call_id == "r1" and "orders service timed out" in (failed.error or "")
    assert session.steps[0].requested == ("lookup",) and session.steps[0].input_tokens == 100
    assert session.steps[-1].result == "Order 7 has shipped."  # the turn's answer
    turn_id = session.turn_ids[0]
    turn = reader.trajectory(turn_id).trajectory
    assert turn is not None and turn.kind == "turn" and turn.session_id == "retry-b" and turn.steps == session.steps
    by_prefix = reader.trajectory(turn_id[:10]).trajectory
    assert by_prefix is not None and by_prefix.id == turn_id
    several = reader.trajectory("re")  # reason-*, retry-*
    assert several.trajectory is None and set(several.candidates) == {"reason-a", "reason-b", "retry-a", "retry-b"}
    assert reader.trajectory("no-such-run").candidates == ()


# -- the alignment, as a person draws it ----------------------------------------------------------------

M, T, E = "model_call", "tool_call", "end"


def test_a_retried_tool_call_shows_as_two_added_steps_and_the_rest_stays_paired(diffs):
    model = diffdata.MODEL
    assert drawn(diffs["retry"]) == [
        ("same", M, model, 0, 0, []),
        ("added", T, "lookup", None, 1, []),  # the try that failed
        ("added", M, model, None, 2, []),  # the model asking again
        ("same", T, "lookup", 1, 3, []),  # the served call pairs with the served call
        ("same", M, model, 2, 4, []),
        ("same", E, None, 3, 5, []),
    ]
    result = diffs["retry"]
    assert result["rows"][1]["b"]["status"] == "failed"
    assert result["summary"] == {"same": 4, "changed": 0, "added": 2, "dropped": 0, "reordered": 0}
    assert result["delta"]["steps"] == 2 and result["delta"]["model_calls"] == 1 and result["delta"]["tool_calls"] == 1
    assert result["delta"]["input_tokens"] == 140 and result["delta"]["failed_tool_calls"] == 1
    assert result["rows"][4]["delta"]["input_tokens"] == 0  # the answer cost the same in both


def test_one_extra_step_is_added_and_the_call_that_asked_for_it_changed(diffs):
    model = diffdata.MODEL
    assert drawn(diffs["extra"]) == [
        ("changed", M, model, 0, 0, ["requested"]),
        ("same", T, "search", 1, 1, []),
        ("added", T, "fetch", None, 2, []),
        ("same", M, model, 2, 3, []),
        ("same", E, None, 3, 4, []),
    ]
    answer = diffs["extra"]["rows"][3]
    assert answer["delta"]["input_tokens"] == 50 and answer["delta"]["cost_usd"] > 0


def test_a_changed_argument_pairs_the_calls_and_names_what_changed(diffs):
    model = diffdata.MODEL
    assert drawn(diffs["args"]) == [
        ("same", M, model, 0, 0, []),
        ("changed", T, "weather", 1, 1, ["arguments", "result"]),
        ("same", M, model, 2, 2, []),
        ("same", E, None, 3, 3, []),
    ]
    row = diffs["args"]["rows"][1]
    assert (row["a"]["arguments"], row["b"]["arguments"]) == ({"city": "Paris"}, {"city": "Lyon"})


def test_a_different_end_reason_changes_the_end_and_drops_the_answer_b_never_gave(diffs):
    model = diffdata.MODEL
    assert drawn(diffs["reason"]) == [
        ("same", M, model, 0, 0, []),
        ("same", T, "book", 1, 1, []),
        ("dropped", M, model, 2, None, []),
        ("changed", E, None, 3, 2, ["end_reason", "result"]),
    ]
    end = diffs["reason"]["rows"][3]
    assert (end["a"]["status"], end["b"]["status"]) == ("completed", "max_rounds")
    assert end["delta"]["input_tokens"] == -100  # the turns' own totals


def test_steps_run_in_another_order_are_reported_moved_once(diffs):
    rows = diffs["moved"]["rows"]
    moved = [r for r in rows if r["op"] == "reordered"]
    assert [(r["name"], r["a"] and r["a"]["index"], r["b"] and r["b"]["index"]) for r in moved] == [
        ("alpha", 1, None), ("alpha", None, 2)]
    assert rows[moved[0]["partner"]] is moved[1] and rows[moved[1]["partner"]] is moved[0]
    assert diffs["moved"]["summary"]["reordered"] == 1 and diffs["moved"]["summary"]["added"] == 0


# -- --json and the terminal's text -------------------------------------------------------------------


def test_json_has_the_documented_shape(db, capsys):
    code, out, err = run(capsys, "--db", db, "diff", "args-a", "args-b", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert list(result) == ["version", "a", "b", "rows", "summary", "delta"] and result["version"] == 1
    assert list(result["a"]) == ["kind", "id", "session_id", "turn_ids", "totals"]
    totals = ["turns", "steps", "model_calls", "tool_calls", "failed_tool_calls", "input_tokens", "output_tokens",
              "total_tokens", "cost_usd", "latency_ms"]
    assert list(result["a"]["totals"]) == totals and list(result["delta"]) == totals
    row = result["rows"][1]
    assert list(row) == ["op", "kind", "name", "a", "b", "changes", "partner", "delta"]
    assert list(row["a"]) == ["index", "kind", "turn_id", "name", "call_id", "arguments", "result", "status", "error",
                              "requested", "started_at", "duration_ms", "input_tokens", "output_tokens", "cost_usd"]
    assert list(row["delta"]) == ["duration_ms", "input_tokens", "output_tokens", "cost_usd"]
    assert list(result["summary"]) == ["same", "changed", "added", "dropped", "reordered"]
    # --json before the command too, as every command takes it
    assert run(capsys, "--json", "--db", db, "diff", "args-a", "args-b")[1] == out


def test_the_terminal_shows_marks_positions_what_changed_and_the_totals(db, capsys):
    code, out, err = run(capsys, "--db", db, "diff", "retry-a", "retry-b")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("A: session retry-a  (1 turn, 4 steps)") and lines[1].startswith("B: session retry-b  (1 turn, 6 steps)")
    head = lines.index("     A    B  STEP")
    steps = lines[head + 1:lines.index("", head)]
    assert [(s[0], s[2:6].strip(), s[7:11].strip()) for s in steps] == [
        (" ", "1", "1"), ("+", "", "2"), ("+", "", "3"), (" ", "2", "4"), (" ", "3", "5"), (" ", "4", "6")]
    assert "tool lookup {\"order\": 7}  failed: TimeoutError: orders service timed out" in steps[1]
    assert "\x1b" not in out  # no colour in a pipe
    tokens_in = next(line for line in lines if line.startswith("tokens in"))
    assert tokens_in.split() == ["tokens", "in", "280", "420", "+140"]
    assert lines[-1].startswith("4 same, 0 changed, 2 added, 0 dropped, 0 reordered")
    code, out, err = run(capsys, "--db", db, "diff", "args-a", "args-b")
    assert '~    2    2  tool weather  arguments {"city": "Paris"} -> {"city": "Lyon"}; result' in out
    code, out, err = run(capsys, "--db", db, "diff", "reason-a", "reason-b")
    assert 'end  end reason "completed" -> "max_rounds"' in out
    code, out, err = run(capsys, "--db", db, "diff", "moved-a", "moved-b")
    assert "(moved: B step 3)" in out and "(moved: A step 2)" in out


def test_colour_on_a_terminal_marks_the_rows_and_stored_text_stays_escaped(db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that the stored value is not cut
    code, plain, _ = run(capsys, "--db", db, "diff", "args-a", "args-b")
    assert "\\u001b[2Jcleared" in plain and "\x1b" not in plain  # a pipe: the stored ESC shown as JSON writes it, no colour
    colour = cli_diff._colour
    monkeypatch.setattr(cli_diff, "_colour", lambda: True)  # a terminal
    code, out, err = run(capsys, "--db", db, "diff", "args-a", "args-b")
    assert code == 0, err
    changed = next(line for line in out.splitlines() if "tool weather" in line)
    assert changed.startswith("\x1b[33m~") and changed.endswith("\x1b[0m")  # the changed row in yellow
    assert re.sub(r"\x1b\[\d+m", "", out) == plain  # nothing else differs: the stored ESC is still an escape
    monkeypatch.setattr(cli_diff.sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour()  # a terminal: colour
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour()  # unless NO_COLOR says no


def test_a_run_not_found_or_named_by_too_short_a_prefix_is_one_clear_line(db, capsys):
    code, out, err = run(capsys, "--db", db, "diff", "retry-a", "nope")
    assert (code, out) == (2, "")
    assert err.strip().startswith("loopscope: error: no session or turn 'nope' in ")
    code, out, err = run(capsys, "--db", db, "diff", "re", "retry-a")
    assert code == 2 and "'re' matches several sessions or turns (reason-a, reason-b, retry-a, retry-b)" in err


# -- the dashboard ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def diff_dashboard(db: str) -> Iterator[DashboardServer]:
    yield from webdata.running(make_server(db, port=0))


def test_the_api_answers_the_diff_and_a_clear_400_for_a_run_not_found(diff_dashboard, diffs):
    url = diff_dashboard.url + "api/diff?" + urllib.parse.urlencode({"a": "extra-a", "b": "extra-b"})
    with urllib.request.urlopen(url, timeout=30) as response:
        assert json.loads(response.read()) == json.loads(json.dumps(diffs["extra"]))
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(diff_dashboard.url + "api/diff?a=extra-a&b=nope", timeout=30)
    assert caught.value.code == 400 and "no session or turn 'nope'" in json.loads(caught.value.read())["error"]


@pytest.mark.parametrize("width", [420, 1280])
def test_the_diff_page_shows_both_runs_side_by_side_and_fits_the_window(page, diff_dashboard, width, tmp_path):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(diff_dashboard.url + "#/diff?a=retry-a&b=retry-b")
    page.wait_for_selector(".diff-row.op-added", timeout=WAIT_MS)
    rows = page.evaluate(
        """() => [...document.querySelectorAll('.diff-row[data-op]')].map((r) => [r.dataset.op, r.dataset.kind,
            ...['.side-a', '.side-b'].map((side) => { const head = r.querySelector(`${side} .diff-step-head`);
                return head ? [...head.children].map((el) => el.textContent.trim()).join(' ') : ''; })])"""
    )
    assert [r[:2] for r in rows] == [["same", M], ["added", T], ["added", M], ["same", T], ["same", M], ["same", E]]
    assert rows[1][2:] == ["", "tool lookup failed"] and rows[0][2] == rows[0][3] == f"model {diffdata.MODEL} completed"
    assert rows[5][2:] == ["end completed", "end completed"]
    assert page.inner_text("#diff-counts .op-added").strip().endswith("2 only in B")
    assert page.inner_text("tr[data-total='input_tokens'] td.delta") == "+140"
    wide = page.evaluate(
        """() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
            out: [...document.querySelectorAll('body *')].filter((el) => el.getBoundingClientRect().right > window.innerWidth + 0.5
                && !el.closest('.table-scroll')).slice(0, 5).map((el) => `${el.tagName}.${el.getAttribute('class')}`)})"""
    )
    page.screenshot(path=str(tmp_path / f"diff-{width}.png"), full_page=True)
    assert wide["scroll"] <= wide["inner"] and wide["out"] == [], wide


def test_compare_with_from_a_session_picks_b_and_shows_what_changed(page, diff_dashboard):
    page.goto(diff_dashboard.url + "#/session/args-a")
    page.wait_for_selector(".session-head .compare-link", timeout=WAIT_MS)
    page.click(".session-head .compare-link")
    page.wait_for_selector("#diff-b", timeout=WAIT_MS)
    assert page.input_value("#diff-a") == "args-a"
    page.fill("#diff-b", "args-b")
    page.click("#diff-go")
    page.wait_for_selector(".diff-row.op-changed", timeout=WAIT_MS)
    assert "#/diff?a=args-a&b=args-b" in page.url
    changed = page.locator(".diff-row.op-changed")
    assert changed.count() == 1
    assert changed.locator(".side-a .diff-args.diff-changed").inner_text().replace(" ", "") == '{"city":"Paris"}'
    assert changed.locator(".side-b .diff-args.diff-changed").inner_text().replace(" ", "") == '{"city":"Lyon"}'
    # a turn's summary offers the same for the turn
    page.goto(diff_dashboard.url + "#/session/reason-b")
    page.wait_for_selector(".turn-summary .compare-link", timeout=WAIT_MS)
    href = page.get_attribute(".turn-summary .compare-link", "href")
    turn_id = open_reader(diff_dashboard.store.path).trajectory("reason-b").trajectory.turn_ids[0]  # type: ignore[union-attr]
    assert href == f"#/diff?a={turn_id}&s=reason-b"
    page.click(".turn-summary .compare-link")
    page.wait_for_selector("#diff-runs option[label='session']", state="attached", timeout=WAIT_MS)
    # B is picked from the session's turns first, then the sessions
    options = page.evaluate("[...document.querySelectorAll('#diff-runs option')].map((o) => [o.value, o.label])")
    assert options[0] == [turn_id, f"turn 1 of reason-b: max_rounds, {diffdata.MODEL}"]
    assert ["retry-a", "session"] in options


def test_a_run_not_found_is_said_on_the_page(page, diff_dashboard):
    page.goto(diff_dashboard.url + "#/diff?a=retry-a&b=nope")
    page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
    assert "no session or turn 'nope'" in page.inner_text("#error")


def test_static_files_are_served_with_the_page(diff_dashboard):
    for name in ("diff.js", "diff.css"):
        with urllib.request.urlopen(diff_dashboard.url + "static/" + name, timeout=30) as response:
            assert response.status == 200 and len(response.read()) > 500
