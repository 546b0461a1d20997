"""Fixtures for the web dashboard: a sample store, a server over it, a headless browser."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import webdata

from loopscope.dashboards.web.server import DashboardServer, make_server

CHROMIUM = os.environ.get("LOOPSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def sample_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("web") / "sample.duckdb"
    webdata.record_sample(db)
    return db


@pytest.fixture(scope="session")
def dashboard(sample_db: Path) -> Iterator[DashboardServer]:
    """The dashboard over the sample store, on 127.0.0.1 and a free port."""
    yield from webdata.running(make_server(str(sample_db), port=0))


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium, headless, driven by playwright (never a downloaded browser).

    Module-scoped: playwright's sync API keeps an asyncio loop running in this thread
    while it is open, which other tests' ``asyncio.run`` must not meet.
    """
    if not Path(CHROMIUM).exists():
        reason = f"no chromium at {CHROMIUM}: install it (apt-get install chromium) to run the browser tests"
        if os.environ.get("LOOPSCOPE_REQUIRE_BROWSER") == "1":  # CI: never skip them silently
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    """A fresh page that fails the test on any script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")  # type: ignore[attr-defined]
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on(
        "console",
        lambda msg: (
            errors.append(msg.text) if msg.type == "error" and "Failed to load resource" not in msg.text else None
        ),
    )
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"errors in the page: {errors}"
