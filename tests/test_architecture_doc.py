"""docs/architecture.md's module table matches the tree, so the page cannot drift from the code:
every module of ``loopscope/`` is named there (a package's ``__init__.py`` by its file path or by
its folder path, ``loopscope/ingest/otlp/``), and every ``loopscope/...`` path the page names
exists. A failure names the paths to add or to fix."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "loopscope"
DOC = ROOT / "docs" / "architecture.md"

# a path in backticks: `loopscope/storage/api.py`, `loopscope/ingest/otlp/`
NAMED = re.compile(r"`(loopscope/[^`\s]*)`")


def _named() -> set[str]:
    return set(NAMED.findall(DOC.read_text()))


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _is_named(module: Path, named: set[str]) -> bool:
    path = module.relative_to(ROOT).as_posix()
    if path in named:
        return True
    return module.name == "__init__.py" and f"{module.parent.relative_to(ROOT).as_posix()}/" in named


def test_the_page_names_every_module_of_the_package() -> None:
    named = _named()
    missing = [m.relative_to(ROOT).as_posix() for m in _modules() if not _is_named(m, named)]
    assert not missing, (
        "docs/architecture.md's module table does not name these modules (add a row "
        f"`path | one-line job`, or name them in a row of their folder): {missing}"
    )


def test_every_path_the_page_names_exists() -> None:
    gone = sorted(p for p in _named() if not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names paths that do not exist (moved or removed?): {gone}"


def test_the_check_sees_the_table() -> None:
    """The two checks above would pass vacuously if the page's paths were not found at all."""
    named = _named()
    assert "loopscope/storage/api.py" in named and "loopscope/recorder/adapter.py" in named
    assert len(_modules()) > 50
