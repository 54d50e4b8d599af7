"""Timestamps as the API server writes them, and the finer ones our drain marks need."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def format_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_precise_time(t: datetime) -> str:
    """RFC 3339 with microseconds: a drain deadline must not come a second early."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None
