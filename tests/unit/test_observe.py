"""One observe for the controller, the simulation and render: the caches in, ``Observed`` out."""

from __future__ import annotations

from mpijob_elastic.core import names
from mpijob_elastic.core.inputs.observe import Listed, observe
from mpijob_elastic.machinery.job_memory import JobMemory
from tests.unit.simulation import make_job


def _obj(kind: str, name: str, uid: str, owner: str | None = None) -> dict[str, object]:
    refs = [{"kind": names.KIND, "name": "job", "uid": owner, "controller": True}] if owner else []
    meta = {"name": name, "namespace": "ns", "uid": uid, "ownerReferences": refs}
    return {"kind": kind, "metadata": meta}


def test_children_strays_memory_and_nodes_are_read() -> None:
    job = make_job(2)
    uid = job["metadata"]["uid"]
    worker = _obj("Pod", "job-worker-0", "w0", uid)
    other = _obj("Pod", "other-worker-0", "o0", "other-uid")
    orphan = _obj("ConfigMap", "job-config", "c0")
    relabelled = _obj("Role", "job-launcher", "r0", uid)
    old_view = _obj("Role", "job-launcher", "r0", uid)
    legacy = _obj("Pod", "job-worker-1", "w1", uid)
    main = {
        "Pod": Listed([worker, other]),
        "ConfigMap": Listed([orphan]),
        "Role": Listed([relabelled]),
    }
    handover = {"Pod": Listed([legacy]), "Role": Listed([old_view])}
    memory = JobMemory()
    memory.deletes["w0"] = 10.0
    observed = observe(
        job,
        main.get,
        handover.get,
        memory,
        11.0,
        leaving_nodes={"n1": "cordoned"},
    )
    assert [p["metadata"]["name"] for p in observed.pods] == ["job-worker-0"]
    assert observed.role is relabelled
    assert observed.config_map is None, "an orphan is neither a child nor a stray"
    # The pod only the hand-over cache holds; the Role both caches show (relabelled
    # already) is the job's child, not a stray.
    assert sorted(o["metadata"]["uid"] for o in observed.strays) == ["w1"]
    assert observed.deleting == {"w0"}
    assert observed.leaving_nodes == {"n1": "cordoned"}
    # The memory runs on the clock passed in.
    later = observe(job, main.get, handover.get, memory, 10.0 + 3600, leaving_nodes=None)
    assert later.deleting == frozenset()
