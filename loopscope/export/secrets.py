"""Kept so that ``loopscope.export.secrets`` (which README and docs/secrets.md name) still
imports: the credential shapes live in :mod:`loopscope.content.secrets`."""

from __future__ import annotations

from ..content.secrets import *  # noqa: F403
