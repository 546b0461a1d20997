"""The "What loopscope promises" table (docs/promises.md, summed up in README.md) names the
tests that hold each promise: every test file and test it names must exist, so the table
cannot drift from the suite."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table() -> str:
    page = (ROOT / "docs" / "promises.md").read_text()
    start = page.index("# What loopscope promises")
    end = page.find("\n## ", start + 1)  # the page's next section, if it ever gets one
    return page[start : end if end != -1 else len(page)]


def test_the_readme_points_to_the_promises_page() -> None:
    assert "(docs/promises.md)" in (ROOT / "README.md").read_text()


def test_every_test_the_promises_table_names_exists() -> None:
    table = _table()
    named: list[tuple[str, str | None]] = []
    for cell in re.findall(r"`([^`]+)`", table):
        path = re.match(r"((?:tests|benchmarks)/[\w/]+(?:\.py)?/?)(?:::(\w+))?$", cell)
        if path:
            named.append((path.group(1), path.group(2)))
        elif re.match(r"::(\w+)$", cell):  # `::name`: a test of the file named before it in the cell
            named.append((named[-1][0], cell[2:]))
    assert len(named) > 20
    missing = []
    for file, test in named:
        target = ROOT / file
        if not target.exists():
            missing.append(file)
        elif test and not re.search(rf"^(?:async )?def {test}\(", target.read_text(), re.MULTILINE):
            missing.append(f"{file}::{test}")
    assert not missing, missing
