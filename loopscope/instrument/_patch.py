"""Replacing methods with wrapt wrappers, and putting the originals back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt


@dataclass
class Patch:
    owner: type
    name: str
    original: Any

    def undo(self) -> None:
        """Put the original back."""
        setattr(self.owner, self.name, self.original)


@dataclass
class Registration:
    """A registration with a library whose extension point is a registration (a tracing
    processor, a global callback handler) rather than a method to wrap: ``undo`` takes it back."""

    undo: Callable[[], None]


def wrap(owner: type, name: str, wrapper: Callable[..., Any]) -> Patch | None:
    """Wrap ``owner.name`` (looked up in the class itself, not its bases); None if absent."""
    original = owner.__dict__.get(name)
    if original is None:
        return None
    setattr(owner, name, wrapt.FunctionWrapper(original, wrapper))
    return Patch(owner, name, original)


def restore(patches: list[Patch | Registration]) -> None:
    for patch in reversed(patches):
        patch.undo()
    patches.clear()
