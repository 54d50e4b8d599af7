"""What a job says that nothing reads: names close to the real ones, and an API version
this controller does not serve.

A misspelled annotation (``mpijob-elastic.io/min-replica``) or a field at the wrong level
(``Worker.maxReplicas``, ``Worker.replica``) is ignored, and the user believes the job is
elastic when it is not. Nothing here refuses the job (an extra field is legal): each
finding is a warning that names the field, with a "did you mean" when the name is close
to one that is read. ``launcher_command.py`` adds what the launcher's command contradicts.

What the controller can see of these: the API server prunes unknown fields from an
MPIJob wherever the CRD's schema lists the fields (spec, a replica spec), before
admission and before any watch, so ``spec.maxReplicas`` or ``Worker.replica`` never
reach it; annotations and the keys of ``mpiReplicaSpecs`` (a map of any role name) do.
``render`` reads the manifest as written, so it warns about all of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.queueing.kueue import Queue, elastic
from mpijob_elastic.core.reports import launcher_command
from mpijob_elastic.core.shapes import FieldError
from mpijob_elastic.core.spec.model import JobSpec

PREFIX = "mpijob-elastic.io/"
# The annotations a user sets on an MPIJob: the ones the parser reads (names.py).
USER_ANNOTATIONS = names.USER_ANNOTATIONS
SUFFIXES = tuple(a.removeprefix(PREFIX) for a in USER_ANNOTATIONS)
ROLES = ("Launcher", "Worker")
REPLICA_FIELDS = ("replicas", "restartPolicy", "template")
SPEC_FIELDS = ("slotsPerWorker", "mainContainer", "cleanPodPolicy", "runPolicy", "mpiReplicaSpecs")
V2BETA1 = f"{names.GROUP}/v2beta1"


def unsupported_version(job: Mapping[str, Any]) -> str | None:
    """Why a manifest's MPIJob is not this controller's to act on, or None. The API
    server only serves kubeflow.org/v1 through this project's CRD, so the controller
    never receives another version; ``render`` reads files, which may hold any."""
    version = job.get("apiVersion")
    if version == names.API_VERSION:
        return None
    if version == V2BETA1:
        return (
            f"apiVersion {V2BETA1} is not served by mpijob-elastic, which runs "
            f"{names.API_VERSION} MPIJobs only; {V2BETA1} MPIJobs are run by the Kubeflow "
            "MPI Operator v2 (github.com/kubeflow/mpi-operator)"
        )
    return (
        f"apiVersion {version!r} is not {names.API_VERSION}, the only version mpijob-elastic runs"
    )


def check(job: Mapping[str, Any], spec: JobSpec | None, queue: Queue | None) -> list[FieldError]:
    """Every warning about the job, in the order of its fields; the launcher's command is
    compared with the bounds only once the spec is valid (``spec``). Any JSON at all:
    it runs before ``parse`` has judged the job. ``queue``: the job's in Kueue, if any."""
    if not isinstance(job, Mapping):
        return []
    found = _annotations(job) + _unknown_fields(job)
    if spec is not None and spec.opportunistic and queue is not None and not elastic(job, queue):
        found.append(
            FieldError(
                f"metadata.annotations[{names.ANN_OPPORTUNISTIC}]",
                "ignored for a job queued in Kueue without workload slices: it runs only "
                "the workers Kueue admitted (with --kueue-workload-slices it grows through "
                "Kueue, a slice at a time)",
            )
        )
    if spec is not None:
        found += launcher_command.check(spec)
    return found


def _annotations(job: Mapping[str, Any]) -> list[FieldError]:
    meta = job.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    found = []
    for key in annotations:
        if isinstance(key, str) and key.startswith(PREFIX) and key not in USER_ANNOTATIONS:
            # Compared without the prefix, which every candidate shares.
            hint = _did_you_mean(key.removeprefix(PREFIX), SUFFIXES)
            hint = hint.replace("mean ", f"mean {PREFIX}") if hint else ""
            found.append(
                FieldError(f"metadata.annotations[{key}]", f"unknown annotation, ignored{hint}")
            )
    return found


def _unknown_fields(job: Mapping[str, Any]) -> list[FieldError]:
    spec = job.get("spec")
    if not isinstance(spec, Mapping):
        return []
    found = _extra(spec, "spec", SPEC_FIELDS, "field")
    specs = spec.get("mpiReplicaSpecs")
    if not isinstance(specs, Mapping):
        return found
    found += _extra(specs, "spec.mpiReplicaSpecs", ROLES, "replica type")
    for role in ROLES:
        replica = specs.get(role)
        if isinstance(replica, Mapping):
            found += _extra(replica, f"spec.mpiReplicaSpecs.{role}", REPLICA_FIELDS, "field")
    return found


def _extra(obj: Mapping[str, Any], path: str, known: Sequence[str], what: str) -> list[FieldError]:
    found = []
    for key in obj:
        if key not in known:
            hint = _annotation_hint(str(key)) or _did_you_mean(str(key), known)
            found.append(FieldError(f"{path}.{key}", f"unknown {what}, ignored{hint}"))
    return found


def _annotation_hint(key: str) -> str:
    """The bounds and durations are annotations, not fields: a field named like one
    (``maxReplicas``, ``min_replicas``) points at the annotation."""
    plain = _plain(key)
    for annotation in USER_ANNOTATIONS:
        if _plain(annotation.removeprefix(PREFIX)) == plain:
            return f"; did you mean the annotation {annotation}?"
    return ""


def _plain(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1)
        close = [k for k in known if close and k.lower() == close[0]]
    return f"; did you mean {close[0]}?" if close else ""
