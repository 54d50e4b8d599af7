"""JSON from the API server, at any depth the server accepts.

The API server stores objects nested up to 10,000 levels, and a CRD's unpruned fields (an
MPIJob's pod templates, ``schedulingPolicy``) let any tenant who may create MPIJobs write
one. Python's decoder recurses and gives up near 1,000 levels: one such job in a list page
failed every relist of its namespace's MPIJobs, so no job there was reconciled again
(issue 31). Such a document is decoded with every value nested deeper than
``store.MAX_DEPTH`` replaced by ``store.TOO_DEEP``, as the caches hold every object anyway;
the spec's reader then refuses the job, naming the field (``shapes.pod_template``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from mpijob_elastic.machinery.store import MAX_DEPTH, TOO_DEEP

# A JSON string (escapes included) or a bracket: brackets inside strings are not nesting.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_OPENING = frozenset(b"[{")
_REPLACEMENT = json.dumps(TOO_DEEP).encode()


def loads(data: bytes | str) -> Any:
    """``json.loads``, except that a document too deep for it is read cut at MAX_DEPTH."""
    try:
        return json.loads(data)
    except RecursionError:
        return json.loads(cut(data.encode() if isinstance(data, str) else data))


def cut(data: bytes) -> bytes:
    """``data`` with each value whose brackets open below MAX_DEPTH levels replaced by
    TOO_DEEP. The scan visits strings and brackets only, at the regular expression's
    speed; it runs only for a document the decoder refused."""
    kept: list[bytes] = []
    depth = 0
    resume = 0
    for token in _TOKEN.finditer(data):
        char = data[token.start()]
        if char == ord('"'):
            continue
        if char in _OPENING:
            depth += 1
            if depth == MAX_DEPTH + 1:
                kept += (data[resume : token.start()], _REPLACEMENT)
        else:
            if depth == MAX_DEPTH + 1:
                resume = token.end()
            depth -= 1
    kept.append(data[resume:])
    return b"".join(kept)
