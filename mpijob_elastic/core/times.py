"""Timestamps as the API server writes them, and the finer ones our drain marks need."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final

# The times read from objects others write (annotations on the job's ConfigMap and pods,
# Workloads' conditions) are believed within these bounds only: a deadline is such a time
# plus at most an int32 of seconds (68 years), or less an hour or a day, and datetime
# ends at year 9999 and begins at year 1: a worker-failures annotation edited to
# "3 9999-12-31T23:59:59Z" raised OverflowError in every reconcile. No object of a
# running cluster dates from outside.
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(9000, 1, 1, tzinfo=UTC)


def format_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_precise_time(t: datetime) -> str:
    """RFC 3339 with microseconds: a drain deadline must not come a second early."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    """The time, or None when it is none or lies outside ``EARLIEST`` to ``LATEST``."""
    if not isinstance(value, str):
        return None
    return _parse(value)


# Every plan reads each pod's timestamps again (six per worker), and strptime is slow: it
# was a fifth of the time of planning a 100-worker job. Pods keep their timestamps, so
# the same strings come back on every turn; the datetimes are immutable and can be shared.
@lru_cache(maxsize=8192)
def _parse(value: str) -> datetime | None:
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            found = datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
        return found if EARLIEST <= found <= LATEST else None
    return None
