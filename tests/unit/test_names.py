"""The names users and operators see, each spelled in one place (names.py) and documented:
the annotations a user writes are exactly the ones the parser reads, the warnings call
only the others unknown, docs/configuration.md's table lists them, and every Event reason
the controller emits is listed in docs/configuration.md ("Status and events")."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.reports.spec_warnings import check
from mpijob_elastic.core.spec.parse import parse
from tests.unit.simulation import make_job

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mpijob_elastic"
CONFIGURATION = ROOT / "docs" / "configuration.md"
PREFIX = "mpijob-elastic.io/"
# The modules of the spec's parser: every annotation they name is one a user writes.
PARSER = ("core/spec/parse.py", "core/spec/fields.py")


def sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text(), str(path))


def string_literals(tree: ast.Module) -> Iterator[str]:
    """The module's strings, f-strings' literal parts included, docstrings left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.value


def names_values() -> set[str]:
    return {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}


class Recording(dict[str, Any]):
    """Annotations that remember every key read from them."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_the_parser_reads_exactly_the_user_annotations() -> None:
    annotations = Recording({names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "4"})
    job = make_job(2, annotations=annotations)
    job["metadata"]["annotations"] = annotations
    parse(job, 30)
    read = {key for key in annotations.read if key.startswith(PREFIX)}
    assert read == set(names.USER_ANNOTATIONS)


def test_every_annotation_the_parser_names_is_a_user_annotation() -> None:
    # What the parser could read on a path the job above does not take.
    for module, tree in sources():
        if module not in PARSER:
            continue
        named = {
            getattr(names, node.attr)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "names"
            and node.attr.startswith("ANN_")
        }
        assert named <= set(names.USER_ANNOTATIONS), f"{module}: {named}"


def test_every_name_under_the_prefix_is_spelled_in_names_py() -> None:
    values = names_values()
    found = {}
    for module, tree in sources():
        if module == "core/names.py":
            continue
        for text in string_literals(tree):
            # The bare prefix is how the warnings recognise a name that might be ours.
            if PREFIX in text and text != PREFIX and text not in values:
                found[text] = module
    assert found == {}, "spell these in core/names.py and use the constant"


def test_every_user_annotation_is_known_to_the_warnings() -> None:
    annotations = dict.fromkeys(names.USER_ANNOTATIONS, "1")
    assert [str(w) for w in check(make_job(2, annotations=annotations), None, queue=None)] == []


def section(heading: str) -> str:
    text = CONFIGURATION.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_docs_table_lists_exactly_the_user_annotations() -> None:
    rows = re.findall(r"^\| `([^`]+)` \|", section("Per job: annotations on the MPIJob"), re.M)
    assert sorted(rows) == sorted(names.USER_ANNOTATIONS)


# Call sites whose reason is not a string the source spells, with the reasons each sends.
# A new one fails the test below until it is listed here.
STANDINGS = {"Admitted", "Pending", "Evicted", "KueueNotInstalled", "KueueNotPermitted"}
STANDINGS |= {"WorkloadRefused", "WorkloadOutdated"}
DYNAMIC = {
    # desired.py's _queue: Kueue missing or not granted as themselves, the rest with
    # "Queue" before, but for a refused Workload write (conditions.py's WriteRefused says it).
    ("core/planning/desired.py", "standing.reason"): {"KueueNotInstalled", "KueueNotPermitted"},
    ("core/planning/desired.py", "f'Queue{standing.reason}'"): {
        "QueueAdmitted",
        "QueuePending",
        "QueueEvicted",
        "QueueWorkloadOutdated",
    },
    # Turn.event itself, which sends what its callers (read above) give it.
    ("core/outputs/turn.py", "reason"): set(),
    # reports.py's refused: a pod template refused, or any other refused write.
    ("core/reports/conditions.py", "event"): {"PodTemplateRejected", "WriteRefused"},
}


def constants() -> dict[str, str]:
    """Every module-level ``NAME = "text"`` of the package whose name has one value."""
    found: dict[str, set[str]] = {}
    for _, tree in sources():
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else None
            target = node.target if isinstance(node, ast.AnnAssign) else target
            value = getattr(node, "value", None)
            if (
                isinstance(target, ast.Name)
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
            ):
                found.setdefault(target.id, set()).add(value.value)
    return {name: next(iter(v)) for name, v in found.items() if len(v) == 1}


def emitted() -> tuple[set[str], dict[tuple[str, str], str]]:
    """The reasons of every ``turn.event(type, reason, ...)`` and ``Emit(type, reason,
    ...)`` in the package, and the call sites whose reason is computed."""
    known = constants()
    reasons: set[str] = set()
    unresolved = {}
    for module, tree in sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func
            is_event = isinstance(func, ast.Attribute) and func.attr == "event"
            if not (is_event or (isinstance(func, ast.Name) and func.id == "Emit")):
                continue
            reason = node.args[1]
            if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                reasons.add(reason.value)
            elif isinstance(reason, ast.Name) and reason.id in known:
                reasons.add(known[reason.id])
            else:
                unresolved[(module, ast.unparse(reason))] = f"{module}:{node.lineno}"
    return reasons, unresolved


def test_every_standing_reason_is_one_the_event_table_knows() -> None:
    found = set()
    for _, tree in sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Standing"
                and len(node.args) > 1
            ):
                reason = node.args[1]
                assert isinstance(reason, ast.Constant), ast.unparse(node)
                found.add(reason.value)
    assert found == STANDINGS, "a new queue standing: list the Event it sends in DYNAMIC"


def test_every_event_reason_emitted_is_documented() -> None:
    reasons, unresolved = emitted()
    unknown = {site: at for site, at in unresolved.items() if site not in DYNAMIC}
    assert unknown == {}, "a reason this test cannot read: list what it sends in DYNAMIC"
    for site in unresolved:
        reasons |= DYNAMIC[site]
    events = section("Status and events")
    events = events[events.index("- Events on the MPIJob:") :]
    events = events[: events.index("\n- ", 1)]
    listed = set(re.findall(r"`([A-Z][A-Za-z]+)`", events))
    assert sorted(reasons - listed) == [], "emitted but not in docs/configuration.md"
    assert sorted(listed - reasons) == [], "in docs/configuration.md but never emitted"
