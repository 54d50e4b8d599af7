"""The informer's cache as a plain value: no I/O, no clock, no event loop.

It holds the objects of one kind by (namespace, name), an index by controller owner, and
tombstones of recently deleted UIDs, and it decides what each input does to them: a watch
event, a fresh list that replaces everything, or the result of the controller's own
write. Those rules are where the subtle bugs of a cache live (a late write result
resurrecting a deleted object, a relist forgetting a newer write), so they are kept here,
where unit tests can reach every case without a cluster.

Every object passes through a transform before it is stored (client-go's SetTransform).
The default, ``slim``, drops what no reader of this cache looks at but every object
carries; it is not a projection to the fields the controller reads, because the
controller PUTs ConfigMaps, Roles and RoleBindings built from the cached object and reads
pods' spec and status, and a field missing from a PUT is a field deleted.
"""

from __future__ import annotations

import builtins
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

Obj = dict[str, Any]
Key = tuple[str, str]
Transform = Callable[[Obj], Obj]
Change = tuple[str, Obj]

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

# UIDs of recently deleted objects, so a write result that arrives after the DELETED event
# cannot resurrect its object in the cache; the race lasts one request, a few thousand
# deletions are plenty.
DELETED_UIDS_KEPT = 4096

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# Strings up to this long are interned in cached objects: names, label values, phases.
INTERNED_MAX_LENGTH = 64
# How deep a cached object nests: what lies deeper is held as TOO_DEEP. A real object nests
# about 20 levels; the API server takes 10,000, and Python's recursion (the decoder, copies
# of a template) gives up near 1,000 (issue 31; decoding.py).
MAX_DEPTH = 128
TOO_DEEP = f"(nested deeper than {MAX_DEPTH} levels: not read)"
# The pod conditions the controller reads: an eviction about to come, an unschedulable pod.
POD_CONDITIONS_READ = ("DisruptionTarget", "PodScheduled")


def object_key(obj: Obj) -> Key:
    """(namespace, name); the namespace is "" for cluster-scoped objects."""
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def uid(obj: Obj) -> str | None:
    return cast(str | None, obj["metadata"].get("uid"))


def controller_uid(obj: Obj) -> str | None:
    """The UID in the ownerReference marked ``controller: true``, if any."""
    for ref in obj["metadata"].get("ownerReferences", ()):
        if ref.get("controller"):
            return cast(str, ref["uid"])
    return None


def is_older(obj: Obj, than: Obj) -> bool:
    """Whether ``obj`` is an older version than ``than``.

    resourceVersions are opaque by contract, but every apiserver backed by etcd serves
    integers; when either one is not, we cannot tell and say "not older", so newer data is
    never refused.
    """
    try:
        return int(obj["metadata"]["resourceVersion"]) < int(than["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


def same_version(obj: Obj, other: Obj) -> bool:
    return bool(obj["metadata"].get("resourceVersion") == other["metadata"].get("resourceVersion"))


def slim(obj: Obj) -> Obj:
    """``obj`` without managedFields and kubectl's last-applied annotation.

    Both are bookkeeping for other writers (server-side apply, ``kubectl apply``) and
    often the larger part of a small object. The argument is never changed: what is
    dropped is dropped from a copy of the levels on the way, so a caller's own write
    result can be passed in and still used afterwards.
    """
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict) or LAST_APPLIED not in annotations:
        annotations = None
    if "managedFields" not in meta and annotations is None:
        return obj
    meta = {k: v for k, v in meta.items() if k != "managedFields"}
    if annotations is not None:
        kept = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        if kept:
            meta["annotations"] = kept
        else:
            del meta["annotations"]
    return {**obj, "metadata": meta}


def interned(value: Any, depth: int = 1) -> Any:
    """``value`` rebuilt with every key and short string interned, and anything nested
    deeper than MAX_DEPTH levels (``value`` itself at ``depth``) held as TOO_DEEP.

    The JSON parser shares keys only within one document, and every watch event is a
    document of its own: a thousand pods held a thousand copies of "containerStatuses",
    of their namespace, their labels' values, "Running". Long strings (scripts, messages)
    are rarely repeated and are kept as they are. The bound is kept in the same pass, so
    no reader of a cache meets a depth its own recursion cannot take.
    """
    if isinstance(value, dict | list) and depth > MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {sys.intern(k): interned(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [interned(v, depth + 1) for v in value]
    if isinstance(value, str) and len(value) <= INTERNED_MAX_LENGTH:
        return sys.intern(value)
    return value


def _pick(obj: Mapping[str, Any] | None, keys: Iterable[str]) -> Obj:
    return {k: obj[k] for k in keys if k in obj} if isinstance(obj, Mapping) else {}


def slim_pod(obj: Obj) -> Obj:
    """A pod as the controller reads it: its metadata (``slim``), and of its spec and
    status only what ``workers.py``, ``capacity.py``, ``status.py`` and ``desired.py``
    look at. Pods are never replaced (PUT) from the cache, only created, patched and
    deleted, so nothing dropped here can be written back as a deletion.

    The rest (volumes, env, tolerations, the kubelet's conditions and image IDs) was
    four fifths of a pod's memory: about 18 KB each, 160 MB at 1000 jobs of 8 workers.
    """
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    view: Obj = {
        **_pick(obj, ("apiVersion", "kind")),
        "metadata": slim({"metadata": obj.get("metadata")})["metadata"],
        "spec": {
            # The grace period: a notice's deadline where nothing else gives one.
            **_pick(spec, ("nodeName", "terminationGracePeriodSeconds")),
            "containers": [
                _pick(c, ("name", "readinessProbe")) for c in spec.get("containers") or ()
            ],
        },
        "status": {
            **_pick(status, ("phase", "reason", "message")),
            "conditions": [
                _pick(c, ("type", "status", "reason", "message", "lastTransitionTime"))
                for c in status.get("conditions") or ()
                if isinstance(c, Mapping) and c.get("type") in POD_CONDITIONS_READ
            ],
            "containerStatuses": [
                _pick(c, ("name", "ready", "state")) for c in status.get("containerStatuses") or ()
            ],
        },
    }
    return cast(Obj, interned(view))


def compact(obj: Obj) -> Obj:
    """``slim``, interned: what the controller's caches hold of objects it may PUT back."""
    return cast(Obj, interned(slim(obj)))


def metadata_only(obj: Obj) -> Obj:
    """``obj`` as its kind and slimmed metadata: enough to tell whose it is and to patch
    it conditionally, for caches of objects that are mostly not ours."""
    return cast(
        Obj,
        interned(
            {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                **slim({"metadata": obj.get("metadata")}),
            }
        ),
    )


def whole_if_controlled_by(kind: str, group: str, keep: Transform) -> Transform:
    """``keep`` for an object whose controller ownerReference is a ``kind`` of API group
    ``group``; ``metadata_only`` for any other. A label selector cannot say "controlled by
    one of our jobs", and anyone who may create objects in a watched namespace can give
    them our labels: forty such ConfigMaps of 1 MB each grew the controller by 43 MB when
    they were held whole (issue 31). Their metadata is all a reader of these caches looks
    at (whose an object is, by name)."""

    def transform(obj: Obj) -> Obj:
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
            if (
                ref.get("controller")
                and ref.get("kind") == kind
                and str(ref.get("apiVersion", "")).startswith(f"{group}/")
            ):
                return keep(obj)
        return metadata_only(obj)

    return transform


def _identity(obj: Obj) -> Obj:
    return obj


class Store:
    """Objects of one kind, as the last list, watch events and the controller's writes left
    them.

    Objects handed out are the store's own dicts, shared with every reader: never mutate
    them.
    """

    def __init__(self, transform: Transform | None = slim) -> None:
        """``transform`` is applied to every object on its way in; None keeps them whole."""
        self._transform = transform or _identity
        self._objects: dict[Key, Obj] = {}
        self._owned: dict[str, set[Key]] = {}
        self._deleted_uids: OrderedDict[str, None] = OrderedDict()

    # -- reading ----------------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        return self._objects.get((namespace, name))

    def list(self, namespace: str | None = None) -> builtins.list[Obj]:
        """All objects, or those in ``namespace``, ordered by (namespace, name)."""
        return [
            obj
            for key, obj in sorted(self._objects.items())
            if namespace is None or key[0] == namespace
        ]

    def by_owner(self, owner_uid: str) -> builtins.list[Obj]:
        """The objects whose controller ownerReference names ``owner_uid``, ordered by key."""
        return [self._objects[key] for key in sorted(self._owned.get(owner_uid, ()))]

    # -- changing ---------------------------------------------------------------------------

    def upsert(self, obj: Obj) -> bool:
        """Take the result of the controller's own write; whether it was stored.

        An older version than the stored one is refused (a slow write result must not
        take the cache back in time), as is an object whose deletion was already seen (it
        must not come back to life).
        """
        obj_uid = uid(obj)
        if obj_uid is not None and obj_uid in self._deleted_uids:
            return False
        key = object_key(obj)
        current = self._objects.get(key)
        if current is not None and is_older(obj, current):
            return False
        self._put(key, self._transform(obj))
        return True

    def apply(self, event_type: str, obj: Obj) -> Obj | None:
        """Apply one watch event; the object to report with it, or None to report nothing.

        ADDED and MODIFIED are skipped when the store holds a newer version (the
        controller upserted its own write; the watch will deliver that version shortly).
        DELETED is always reported, but removes only the incarnation it names: the store
        may already hold a successor of the same name that the controller created.
        """
        obj = self._transform(obj)
        key = object_key(obj)
        current = self._objects.get(key)
        if event_type == DELETED:
            if current is not None and uid(current) == uid(obj):
                self._remove(key, current)
            self._remember_deleted(obj)
            return obj
        if current is not None and is_older(obj, current):
            return None
        self._put(key, obj)
        return obj

    def transform(self, obj: Obj) -> Obj:
        """``obj`` as this store keeps it."""
        return self._transform(obj)

    def replace(
        self, items: Iterable[Obj], resource_version: str, *, transformed: bool = False
    ) -> builtins.list[Change]:
        """Make the store equal a fresh list taken at ``resource_version``; what changed.

        ``transformed``: the items went through ``transform`` already (a paged list keeps
        each page's items as the store will, so whole objects are held one page at a
        time, not all at once: 160 MB at 1000 jobs, most of it never returned to the OS).

        An object the list shows older than the stored one, or does not show at all but
        that is newer than the list, was written by the controller after the list's
        snapshot: it stays.
        """
        kept = items if transformed else map(self._transform, items)
        listed = {object_key(obj): obj for obj in kept}
        snapshot = {"metadata": {"resourceVersion": resource_version}}
        changes: builtins.list[Change] = []
        for key, obj in listed.items():
            current = self._objects.get(key)
            if current is None:
                changes.append((ADDED, obj))
            elif same_version(obj, current) or is_older(obj, current):
                continue
            else:
                changes.append((MODIFIED, obj))
            self._put(key, obj)
        for key, current in builtins.list(self._objects.items()):
            if key not in listed and not is_older(snapshot, current):
                self._remove(key, current)
                changes.append((DELETED, current))
        return changes

    def _put(self, key: Key, obj: Obj) -> None:
        current = self._objects.get(key)
        if current is not None:
            self._unindex(key, current)
            if uid(current) != uid(obj):
                # Replaced by a new incarnation while nobody watched: the old one is gone.
                self._remember_deleted(current)
        self._objects[key] = obj
        owner = controller_uid(obj)
        if owner is not None:
            self._owned.setdefault(owner, set()).add(key)

    def _remove(self, key: Key, current: Obj) -> None:
        del self._objects[key]
        self._unindex(key, current)
        self._remember_deleted(current)

    def _unindex(self, key: Key, obj: Obj) -> None:
        owner = controller_uid(obj)
        if owner is None:
            return
        keys = self._owned[owner]
        keys.discard(key)
        if not keys:
            del self._owned[owner]

    def _remember_deleted(self, obj: Obj) -> None:
        obj_uid = uid(obj)
        if obj_uid is None:
            return
        self._deleted_uids[obj_uid] = None
        self._deleted_uids.move_to_end(obj_uid)
        if len(self._deleted_uids) > DELETED_UIDS_KEPT:
            self._deleted_uids.popitem(last=False)
