"""Two decorated tools the recorder tests call: a weather lookup and a table booking that
fails for ``"never"``."""

from __future__ import annotations

from typing import Any

import loopscope


@loopscope.tool
def weather(city: str) -> dict[str, Any]:
    return {"city": city, "temp_c": 21}


@loopscope.tool
def book(when: str) -> str:
    if when == "never":
        raise LookupError("no table then")
    return f"booked {when}"
