"""``mpijob-elastic render``: the children the controller would make for a manifest, on
the controller's own observe -> plan path, without a cluster."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Create, Replace
from mpijob_elastic.core.inputs.observe import Listed, observe
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.reports.spec_warnings import check, unsupported_version
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.machinery.job_memory import JobMemory


def _running(pod: dict[str, Any]) -> dict[str, Any]:
    """The status of a pod whose containers all run, as a kubelet would report it."""
    containers = pod["spec"].get("containers") or []
    return {
        "phase": "Running",
        "containerStatuses": [
            {"name": c["name"], "ready": True, "state": {"running": {}}} for c in containers
        ],
    }


def render_children(job: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    """Every child of a job once its workers run: the plans of a job starting up, replayed."""
    job.setdefault("metadata", {}).setdefault("namespace", "default")
    job["metadata"].setdefault("uid", "<uid>")
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    now = datetime.now(UTC)
    for _ in range(3):
        pods = [{**o, "status": _running(o)} for (kind, _), o in objects.items() if kind == "Pod"]
        views = {
            kind: Listed(o for (k, _), o in objects.items() if k == kind) for kind, _ in objects
        }
        views["Pod"] = Listed(pods)
        # Nothing was written, so there is nothing to remember: a fresh memory.
        observed = observe(job, views.get, lambda _: None, JobMemory(), 0.0)
        for action in plan_writes(observed, settings, now).actions:
            if isinstance(action, Create | Replace):
                objects[(action.obj["kind"], action.obj["metadata"]["name"])] = action.obj
    return list(objects.values())


def _read(path: Path) -> str:
    """The manifest's text, or SystemExit with one line naming the file."""
    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as err:
        raise SystemExit(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise SystemExit(f"{path}: not UTF-8 text (byte {err.start})") from None


def _load(path: Path) -> list[Any]:
    text = _read(path)
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SystemExit(f"{path}: {where}{problem}") from None


def run(path: Path, settings: Settings) -> int:
    """``mpijob-elastic render``: every child of each MPIJob in the file on stdout, the
    warnings and errors on stderr, one line each; non-zero if any job is refused."""
    jobs = [d for d in _load(path) if isinstance(d, dict) and d.get("kind") == names.KIND]
    if not jobs:
        print(f"{path}: no {names.KIND} found", file=sys.stderr)
        return 1
    out: list[dict[str, Any]] = []
    for job in jobs:
        meta = job.get("metadata")
        name = meta.get("name", "?") if isinstance(meta, dict) else "?"
        unsupported = unsupported_version(job)
        if unsupported is not None:
            print(f"{path}: {names.KIND} {name}: {unsupported}", file=sys.stderr)
            return 1
        # As the controller would see it in Kueue, whose caches render does not read.
        queue = kueue.queued(
            job,
            kueue.Queue(
                installed=False,
                slices=settings.kueue_workload_slices,
                unlabelled=kueue.unlabelled_queue(settings),
            ),
        )
        try:
            spec = parse(job, settings.default_drain_seconds)
        except InvalidSpec as err:
            for warning in check(job, None, queue):
                print(f"{names.KIND} {name}: warning: {warning}", file=sys.stderr)
            for error in err.errors:
                print(f"{names.KIND} {name}: {error}", file=sys.stderr)
            return 1
        for warning in check(job, spec, queue):
            print(f"{names.KIND} {name}: warning: {warning}", file=sys.stderr)
        out += render_children(job, settings)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)
    return 0
