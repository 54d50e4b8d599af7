"""The patches of a job's pods in the write order's ``config hash`` and ``pod marks`` steps
(write_order.py): the launcher's config-hash annotation, which refreshes its mounted host
lists, the workers' drain marks, and the rank-holder label the PodDisruptionBudget counts
(host_rules.py). Each carries the pod's observed resourceVersion."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Action, AnnotatePod
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.planning.desired import Desired


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _holder_labels(want: Desired, observed: Observed) -> dict[str, dict[str, str | None]]:
    """The rank-holder label to set or remove, per worker whose label is not as wanted
    (the PodDisruptionBudget counts only labelled workers). Terminating pods are left
    alone: the budget does not count them anyway."""
    if not want.objects:
        return {}  # frozen or finished: nothing of the job's children changes
    changes: dict[str, dict[str, str | None]] = {}
    going = {w.uid for w in want.deletes} | {
        v.worker.uid for v in want.victims if v.action == "delete"
    }
    for pod in observed.pods:
        meta = pod["metadata"]
        name = meta["name"]
        if (
            meta.get("deletionTimestamp")
            or meta.get("uid") in observed.deleting
            or meta.get("uid") in going
            or (meta.get("labels") or {}).get(names.LABEL_ROLE) != names.ROLE_WORKER
        ):
            continue
        has = (meta.get("labels") or {}).get(names.LABEL_HOLDS_RANKS) == "true"
        if has != (name in want.rank_holders):
            changes[name] = {names.LABEL_HOLDS_RANKS: "true" if not has else None}
    return changes


def refresh_launcher(want: Desired, observed: Observed) -> list[Action]:
    """The launcher's config-hash annotation, when its host lists changed: the annotation
    change makes its mounted files refresh in well under a second (ranks.py)."""
    job_name = str(observed.job["metadata"]["name"])
    launcher = next(
        (
            p
            for p in observed.pods
            if p["metadata"]["name"] == names.launcher_name(job_name)
            and not p["metadata"].get("deletionTimestamp")
        ),
        None,
    )
    if launcher is None or want.config_hash is None:
        return []
    current = (launcher["metadata"].get("annotations") or {}).get(names.ANN_CONFIG_HASH)
    if current == want.config_hash:
        return []
    return [
        AnnotatePod(
            launcher["metadata"]["name"],
            {names.ANN_CONFIG_HASH: want.config_hash},
            _resource_version(launcher),
        )
    ]


def pod_marks(want: Desired, observed: Observed) -> list[Action]:
    """The workers' drain marks to set or clear, and their rank-holder labels (in the
    same patch where a worker gets both)."""
    labels = _holder_labels(want, observed)
    writes: list[Action] = []
    for w in want.workers:
        if w.marked and not w.terminating:
            writes.append(
                AnnotatePod(
                    w.name,
                    {names.ANN_DRAINING_SINCE: None},
                    _resource_version(w.pod),
                    labels.pop(w.name, {}),
                )
            )
    for v in want.victims:
        if v.action == "mark":
            # Stamped when sent, after the host-list write that dropped the victim landed:
            # the drain counts from the drop, not from the plan made before it.
            writes.append(
                AnnotatePod(
                    v.worker.name,
                    {},
                    _resource_version(v.worker.pod),
                    labels.pop(v.worker.name, {}),
                    stamp=names.ANN_DRAINING_SINCE,
                )
            )
    pods = {p["metadata"]["name"]: p for p in observed.pods}
    return writes + [
        AnnotatePod(name, {}, _resource_version(pods[name]), change)
        for name, change in sorted(labels.items())
    ]
