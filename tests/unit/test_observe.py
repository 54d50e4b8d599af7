"""One observe for the controller, the simulation and render: the caches in, ``Observed`` out."""

from __future__ import annotations

from datetime import UTC, datetime

from mpijob_elastic.core import names
from mpijob_elastic.core.inputs.growth_state import Share
from mpijob_elastic.core.inputs.observe import Gathered, Listed, observe
from mpijob_elastic.core.queueing.kueue import QUEUE_LABEL, Queue
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
        Gathered(leaving_nodes={"n1": "cordoned"}),
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
    later = observe(job, main.get, handover.get, memory, 10.0 + 3600)
    assert later.deleting == frozenset()


def test_what_the_shell_gathered_is_taken_only_where_it_applies() -> None:
    """The fleet's values only for an opportunistic job, Kueue's only for a queue-labelled
    one: the shell may pass them all, and the decisions of any other job never see them."""
    fleet = [Share("ns/other", 2, None)]
    gathered = Gathered(
        fleet=fleet,
        capacity_changed=datetime(2026, 1, 1, tzinfo=UTC),
        gone=[_obj("Pod", "job-worker-3", "w3", "job-uid")],
        preemptors={"w3": "ns/big"},
        queue=Queue(True),
    )
    plain = make_job(2)
    seen = observe(plain, lambda _: None, lambda _: None, JobMemory(), 0.0, gathered)
    assert (seen.fleet, seen.capacity_changed, seen.gone, seen.preemptors, seen.queue) == (
        (),
        None,
        (),
        None,
        None,
    )
    both = make_job(2, annotations={names.ANN_OPPORTUNISTIC: "true"})
    both["metadata"]["labels"] = {QUEUE_LABEL: "q"}
    seen = observe(both, lambda _: None, lambda _: None, JobMemory(), 0.0, gathered)
    assert seen.fleet == fleet
    assert seen.capacity_changed == gathered.capacity_changed
    assert seen.gone == gathered.gone
    assert seen.preemptors == {"w3": "ns/big"}
    assert seen.queue == Queue(True)
