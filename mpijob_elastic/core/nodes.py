"""Nodes that are going away: the earliest notice that workers on them will be lost.

A worker deleted by a node drain, a scale-down or a spot reclaim can still leave Horovod
gracefully if its grace period outlasts the next commit (docs/spot.md), but acting on
the notice that comes before the deletion is better: the worker leaves discovery, its
ranks go at their next commit, and a replacement is already starting on another node.
The notices read here are a cordon (``spec.unschedulable``, which ``kubectl drain`` sets
first) and a taint from a list of well-known ones (``--leaving-node-taints``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

Obj = dict[str, Any]

# Taints that say a node is about to go. Each is set before its pods are evicted:
DEFAULT_LEAVING_TAINTS = (
    # Karpenter, on a node it is about to disrupt (consolidation, drift, expiry, spot).
    "karpenter.sh/disrupted",
    # The cluster autoscaler, on a node it scales down.
    "ToBeDeletedByClusterAutoscaler",
    # AWS node termination handler (queue mode), on a spot interruption notice (2 min).
    "aws-node-termination-handler/spot-itn",
    # GKE, on a spot or preemptible node that received its termination notice (30 s).
    "cloud.google.com/impending-node-termination",
)

# The taints Kubernetes itself puts on a node that cannot take pods (TaintNodesByCondition:
# not-ready, unreachable, unschedulable, pressures). The API server's admission gives every
# new node `node.kubernetes.io/not-ready` until its kubelet reports Ready.
CONDITION_TAINTS = "node.kubernetes.io/"


def slim(node: Obj) -> Obj:
    """What the controller reads of a node; a node's status (images, conditions) is the
    bulk of it and would cost memory in a cache of every node."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta},
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
    }


def leaving(node: Mapping[str, Any], taints: Collection[str]) -> str | None:
    """Why the node is going away (for messages), or None if it is not."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    for taint in spec.get("taints") or []:
        if isinstance(taint, Mapping) and taint.get("key") in taints:
            return f"tainted {taint['key']}"
    return None


def takes_pods(node: Mapping[str, Any], taints: Collection[str]) -> bool:
    """Whether the node takes new pods, as far as its own state says: not going away, and
    without a taint of Kubernetes' that keeps pods off. (Its room, and the pods' own
    tolerations, are the scheduler's to judge.)"""
    if leaving(node, taints) is not None:
        return False
    return not any(
        isinstance(t, Mapping)
        and str(t.get("key", "")).startswith(CONDITION_TAINTS)
        and t.get("effect") in ("NoSchedule", "NoExecute")
        for t in (node.get("spec") or {}).get("taints") or []
    )
