"""Replacing methods with wrapt wrappers, and putting the originals back."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple


# named tuples, not dataclasses: ``import loopscope`` imports no ``dataclasses`` (nor ``inspect``)
class Patch(NamedTuple):
    owner: type
    name: str
    original: Any

    def undo(self) -> None:
        """Put the original back."""
        setattr(self.owner, self.name, self.original)


class Registration(NamedTuple):
    """A registration with a library whose extension point is a registration (a tracing
    processor, a global callback handler) rather than a method to wrap: ``undo`` takes it back."""

    undo: Callable[[], None]


def wrap(owner: type, name: str, wrapper: Callable[..., Any]) -> Patch | None:
    """Wrap ``owner.name`` (looked up in the class itself, not its bases); None if absent."""
    import wrapt  # here: ``import loopscope`` and ``instrument()`` before any SDK is imported do not need it

    original = owner.__dict__.get(name)
    if original is None:
        return None
    setattr(owner, name, wrapt.FunctionWrapper(original, wrapper))
    return Patch(owner, name, original)


def restore(patches: list[Patch | Registration]) -> None:
    for patch in reversed(patches):
        patch.undo()
    patches.clear()


def on_import(module: str, hook: Callable[[ModuleType], object]) -> None:
    """Call ``hook(module)`` once ``module`` is imported: now if it is already."""
    found = sys.modules.get(module)
    if found is not None:
        hook(found)
        return
    import wrapt

    wrapt.register_post_import_hook(hook, module)


def when_imported(
    module: str, patch: Callable[[ModuleType], Sequence[Patch | Registration | None]], where: str
) -> Registration:
    """Patch ``module`` now if it is imported, else as soon as it is: an adapter's heavy
    submodules (a resource, a tracer) are left unread until the application uses them.

    The returned registration undoes the patches, or makes a hook that has not fired inert
    (an import hook cannot be taken back)."""
    from .._guard import guard

    lock = threading.Lock()
    applied: list[Patch | Registration] = []
    state = {"live": True, "done": False}

    def apply(found: ModuleType) -> None:
        with lock, guard(where):
            if state["live"] and not state["done"]:
                state["done"] = True
                applied.extend(p for p in patch(found) if p is not None)

    def undo() -> None:
        with lock:
            state["live"] = False
            restore(applied)

    on_import(module, apply)
    return Registration(undo)
