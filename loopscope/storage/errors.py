"""Errors the store raises to its users."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be used as asked: a bad path, a foreign or newer file."""


class StoreLockedError(StoreError):
    """Another process holds the store's file and did not let go in time."""


class SQLRefusedError(StoreError):
    """SQL given to :meth:`~loopscope.Store.sql` asked for more than reading the store:
    another file (COPY TO, EXPORT, read_csv, glob, ATTACH), or an extension (INSTALL,
    LOAD). Nothing was done."""
