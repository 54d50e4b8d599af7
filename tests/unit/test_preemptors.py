"""The job's Preempted Event names who took a worker's room, ``preempted by <ns>/<pod>``,
from the scheduler's Preempted Events (core/sizing/preemptors.py, docs/capacity.md): it waits a
bounded time for them, never holds the backoff back, and names each victim once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mpijob_elastic.app import preemptions
from mpijob_elastic.core import names
from mpijob_elastic.core.sizing.preemptors import WAIT, Pending, message, parse_pending
from tests.unit.simulation import Cluster
from tests.unit.test_opportunistic import events, growth, job, preempt, run, turn, workers

VICTIMS = ("job-worker-6", "job-worker-7")
HIGH = "team-b/trainer-0"


def grown() -> Cluster:
    c = job()
    run(c, 8, 60)
    assert len(workers(c)) == 8
    return c


def waiting(c: Cluster) -> Pending:
    cm = c.get("ConfigMap", "job-config") or {}
    return parse_pending((cm["metadata"].get("annotations") or {}).get(names.ANN_PREEMPTED))


def test_the_event_waits_for_the_schedulers_and_names_the_preemptor() -> None:
    c = grown()
    uids = preempt(c, *VICTIMS)
    c.tick(0.5)
    # The turn that sees the conditions comes before the scheduler's Events: the victims
    # count at once (the backoff begins), the job's Event waits, and the turn comes back
    # by the end of the wait.
    requeue = turn(c, 6, preemptors={})
    assert growth(c).attempts == 1
    assert events(c, "Preempted") == []
    assert [n for _, n in waiting(c).victims] == list(VICTIMS)
    assert requeue <= WAIT.total_seconds()
    # One of the two known is not enough; both are, even with the pods gone by then.
    c.tick(0.5)
    turn(c, 6, preemptors={uids[VICTIMS[0]]: HIGH})
    assert events(c, "Preempted") == []
    c.tick(0.5)
    turn(c, 6, preemptors={uid: HIGH for uid in uids.values()})
    preempted = events(c, "Preempted")
    assert len(preempted) == 1, preempted
    assert preempted[0].startswith(
        f"opportunistic workers job-worker-6, job-worker-7 preempted by {HIGH}; they leave "
        "gracefully"
    ), preempted
    assert waiting(c) == Pending()
    # Never twice, whatever comes later.
    run(c, 6, 20, preemptors={uid: HIGH for uid in uids.values()})
    assert len(events(c, "Preempted")) == 1
    assert growth(c).attempts == 1


def test_a_victim_whose_preemptor_never_shows_is_reported_after_the_wait() -> None:
    c = grown()
    uids = preempt(c, *VICTIMS)
    c.tick(0.5)
    known = {uids[VICTIMS[1]]: "team-b/other-0"}
    turn(c, 6, preemptors=known)
    assert events(c, "Preempted") == []
    run(c, 6, WAIT.total_seconds() + 1, preemptors=known)
    preempted = events(c, "Preempted")
    assert len(preempted) == 1, preempted
    assert (
        "job-worker-7 preempted by team-b/other-0; job-worker-6 preempted by the " in (preempted[0])
    )
    assert preempted[0].endswith(
        "(the scheduler's Preempted Event on each pod names the preemptor)"
    ), preempted


def test_without_the_schedulers_events_the_event_goes_at_once_and_says_why() -> None:
    c = grown()
    preempt(c, VICTIMS[0])
    c.tick(0.5)
    turn(c, 7)  # Observed.preemptors None: this controller may not read Events
    preempted = events(c, "Preempted")
    assert len(preempted) == 1, preempted
    assert "job-worker-6 preempted by the scheduler for a pod of higher priority" in (preempted[0])
    assert "may not list and watch Events" in preempted[0]
    assert waiting(c) == Pending()


def test_the_message_groups_victims_by_preemptor() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    text = message(
        [("a", "w-1"), ("b", "w-2"), ("c", "w-3")],
        {"a": "ns/p", "b": "ns/q", "c": "ns/p"},
        "why",
        at,
    )
    assert text.startswith(
        "opportunistic workers w-1, w-3 preempted by ns/p; w-2 preempted by ns/q;"
    )
    assert "(" not in text


def test_the_waiting_victims_round_trip_and_junk_reads_as_none() -> None:
    pending = Pending(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=1.5), (("u", "w-1"),))
    assert parse_pending(pending.format()) == pending
    for junk in (None, "", "x u/w-1", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z nope"):
        assert parse_pending(junk) == Pending()


def test_the_cache_keeps_the_victim_and_the_preemptor_of_the_schedulers_event() -> None:
    # As the kube-scheduler 1.34 of the local cluster wrote it (read as core/v1).
    event = {
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {
            "name": "early-worker-7.18eb8190fd5f7908",
            "namespace": "t",
            "resourceVersion": "363",
            "managedFields": [{"manager": "kube-scheduler"}],
        },
        "involvedObject": {"kind": "Pod", "namespace": "t", "name": "early-worker-7", "uid": "v"},
        "reason": "Preempted",
        "message": "Preempted by pod p on node kwok-capacity",
        "action": "Preempting",
        "related": {"kind": "Pod", "namespace": "t", "name": "late-worker-0", "uid": "p"},
    }
    kept = preemptions.slim(event)
    assert kept["metadata"] == {
        "name": "early-worker-7.18eb8190fd5f7908",
        "namespace": "t",
        "resourceVersion": "363",
    }
    assert kept["involvedObject"] == {"name": "early-worker-7", "uid": "v"}
    assert preemptions.preemptor(kept) == "t/late-worker-0"
    # kind's scheduler (core/v1 recorder): no related object, the UID of its note.
    uid = "e7cf8e16-af0f-423e-9f51-cf0c4ae7a65e"
    legacy = {**event, "related": None, "message": f"Preempted by pod {uid} on node w"}
    assert preemptions.preemptor(preemptions.slim(legacy)) == f"pod {uid}"
    assert preemptions.preemptor(preemptions.slim({**legacy, "message": "other"})) is None


def test_a_victim_named_by_two_preemptors_is_credited_to_the_first() -> None:
    """Issue 33: the scheduler chose a terminating victim again for the next preemptor and
    recorded a second Event on it; the job's Event credited both victims to the second
    preemptor (4 of 6 runs). The room each freed went to the first that took it."""

    def event(victim: str, by: str, at: str | None) -> dict[str, object]:
        return preemptions.slim(
            {
                "metadata": {"name": f"{victim}.{by}", "namespace": "t"},
                "involvedObject": {"kind": "Pod", "name": victim, "uid": victim},
                "related": {"kind": "Pod", "namespace": "t", "name": by},
                "eventTime": at,
            }
        )

    # In the cache's order, the later Event on "a" comes first; one without a readable
    # time never wins over one with.
    found = preemptions.first_preemptors(
        [
            event("a", "p2", "2026-12-06T02:00:01.500000Z"),
            event("a", "p1", "2026-12-06T02:00:01.200000Z"),
            event("b", "p2", "2026-12-06T02:00:01.500000Z"),
            event("b", "p3", None),
        ]
    )
    assert found == {"a": "t/p1", "b": "t/p2"}
    victims = (("a", "job-worker-6"), ("b", "job-worker-7"))
    text = message(victims, found, "", datetime(2026, 12, 6, tzinfo=UTC))
    assert "job-worker-6 preempted by t/p1; job-worker-7 preempted by t/p2" in text
