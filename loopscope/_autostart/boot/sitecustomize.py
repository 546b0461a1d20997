"""Runs at interpreter start-up under ``loopscope run``: turns loopscope on, then runs
the ``sitecustomize`` this one shadows, if any (a virtualenv's, or
``opentelemetry-instrument``'s), so both take effect."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, the one Python would have run."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _start() -> None:
    if os.environ.get("LOOPSCOPE_AUTOSTART") != "1":
        return
    try:
        import loopscope  # noqa: F401
    except ImportError:
        # an interpreter that has not got loopscope installed: borrow the copy that put this
        # file on the path (appended, so the application's own packages still win)
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    try:
        from loopscope._autostart import start
    except Exception as exc:  # the application must start regardless
        sys.stderr.write(f"loopscope: not recording: cannot import loopscope ({exc})\n")
        return
    start()


_start()
_chain()
