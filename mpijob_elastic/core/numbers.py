"""Whole numbers read from objects the controller does not fully control.

A tenant can edit the job's ConfigMap and its annotations, the launcher can write any key
into ``<job>-ranks``, and Kueue's Workloads are written by others too: whatever such a
value holds must read as a number or as none, never raise (issue 31). ``int()`` refuses
more than 4300 digits and also takes ``"1_0"``, ``" 4 "``, ``"+4"`` and other scripts'
digits, none of which the controller writes; and a number far beyond what is meant sets
a backoff, a loop or a datetime off its scale. So a number is read in ASCII digits only,
up to a bound the caller names.
"""

from __future__ import annotations

from typing import Final

# The bound where the caller names none: the Kubernetes API's int32 counts and seconds.
INT32_MAX: Final = 2**31 - 1


def whole(value: object, maximum: int = INT32_MAX) -> int | None:
    """``value`` as a whole number from 0 to ``maximum``; None for anything else.

    A JSON integer (not a bool: ``true`` is no number to a user), or a string of ASCII
    digits, leading zeros allowed.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value <= maximum else None
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        return None
    digits = value.lstrip("0") or "0"
    # Compared as text first: int() refuses more than 4300 digits, and is slow well below.
    if len(digits) > len(str(maximum)):
        return None
    number = int(digits)
    return number if number <= maximum else None
