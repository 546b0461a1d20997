"""Errors the store raises to its users."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be used as asked: a bad path, a foreign or newer file."""


class StoreLockedError(StoreError):
    """Another process holds the store's file and did not let go in time."""
