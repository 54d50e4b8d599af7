"""What the API server sends, at any depth it accepts (10,000 levels), decodes; what the
caches hold nests at most MAX_DEPTH levels, whichever way it came in (issue 31)."""

from __future__ import annotations

import json
import sys
from typing import Any

from mpijob_elastic.machinery import decoding
from mpijob_elastic.machinery.store import MAX_DEPTH, TOO_DEEP, compact

# A document the API server stores, and Python's decoder refuses.
DEPTH = 9000


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth - 1):
        value = {"x": value} if i % 2 else [value]
    return {"x": value}


def depth_and_leaf(value: Any) -> tuple[int, Any]:
    depth = 1
    while True:
        inner = value.get("x") if isinstance(value, dict) else value[0]
        if not isinstance(inner, dict | list):
            return depth, inner
        value, depth = inner, depth + 1


def deep_job(depth: int) -> str:
    # What `kubectl get -o json` of the job would print: brackets and quotes in strings too.
    job = {
        "kind": "MPIJob",
        "metadata": {"name": "deep", "annotations": {"a": 'say "{[" and \\ then ]}'}},
        "spec": nested(depth),
    }
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(4 * depth)
    try:
        return json.dumps(job)
    finally:
        sys.setrecursionlimit(limit)


def test_a_document_too_deep_for_the_decoder_is_read_cut_at_the_bound() -> None:
    text = deep_job(DEPTH)
    try:
        json.loads(text)
        raise AssertionError("the plain decoder took it: the case proves nothing")
    except RecursionError:
        pass
    job = decoding.loads(text.encode())
    assert job["metadata"] == {"name": "deep", "annotations": {"a": 'say "{[" and \\ then ]}'}}
    # The job's own object is level 1, its spec level 2.
    assert depth_and_leaf(job["spec"]) == (MAX_DEPTH - 1, TOO_DEEP)


def test_a_document_the_decoder_takes_is_left_as_it_is() -> None:
    text = deep_job(400)
    assert decoding.loads(text) == json.loads(text)
    assert depth_and_leaf(decoding.loads(text)["spec"]) == (400, 1)


def test_the_cut_keeps_what_follows_the_deep_value() -> None:
    deep = json.loads(deep_job(MAX_DEPTH + 5))
    text = json.dumps({"items": [deep, {"kind": "MPIJob", "metadata": {"name": "next"}}]})
    items = json.loads(decoding.cut(text.encode()))["items"]
    assert items[1] == {"kind": "MPIJob", "metadata": {"name": "next"}}
    assert depth_and_leaf(items[0]["spec"]) == (MAX_DEPTH - 3, TOO_DEEP)


def test_a_cached_object_nests_at_most_the_bound() -> None:
    # Deep enough that the recursion of a copy or of the caches' own walk would give up.
    job = {"metadata": {"name": "deep"}, "spec": nested(950)}
    held = compact(job)
    assert depth_and_leaf(held["spec"]) == (MAX_DEPTH - 1, TOO_DEEP)
    shallow = {"metadata": {"name": "shallow"}, "spec": nested(MAX_DEPTH - 1)}
    assert compact(shallow) == shallow
