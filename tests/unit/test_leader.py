"""The Lease decisions, without a cluster: who may write the Lease, and when."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from mpijob_elastic.app import leader
from mpijob_elastic.app.leader import Observation, Record, Step, Timings

T = Timings()
WALL = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def held_by(holder: str, duration: int = 15, transitions: int = 3) -> Record:
    return Record(holder, duration, "a", "r", transitions)


def test_no_lease_is_created() -> None:
    assert leader.decide(None, "me", 0.0) is Step.CREATE


def test_our_own_lease_is_renewed_however_old() -> None:
    assert leader.decide(Observation(held_by("me"), 0.0), "me", 1000.0) is Step.RENEW


def test_someone_elses_lease_is_left_alone_for_its_duration_from_when_we_saw_it() -> None:
    seen = Observation(held_by("other", duration=15), since=100.0)
    assert leader.decide(seen, "me", 114.9) is Step.WAIT
    assert leader.decide(seen, "me", 115.0) is Step.ACQUIRE


def test_a_released_lease_is_taken_at_once() -> None:
    released = leader.released(held_by("other"), WALL)
    assert leader.decide(Observation(released, since=100.0), "me", 100.0) is Step.ACQUIRE


def test_the_expiry_clock_restarts_only_when_the_record_changes() -> None:
    first = leader.observe(None, held_by("other"), 100.0)
    assert leader.observe(first, held_by("other"), 110.0) is first
    renewed = Record("other", 15, "a", "r2", 3)
    assert leader.observe(first, renewed, 110.0) == Observation(renewed, 110.0)
    # A renewal seen at 110 keeps the lease alive until 125, whatever the remote clock says.
    assert leader.decide(leader.observe(first, renewed, 110.0), "me", 120.0) is Step.WAIT


def test_claiming_someone_elses_lease_counts_a_transition() -> None:
    claimed = leader.claim(held_by("other", transitions=3), "me", T, WALL)
    assert claimed == Record(
        "me", 15, "2026-01-02T03:04:05.678901Z", "2026-01-02T03:04:05.678901Z", 4
    )


def test_a_new_lease_starts_at_zero_transitions() -> None:
    assert leader.claim(None, "me", T, WALL).transitions == 0


def test_a_released_lease_taken_over_counts_a_transition_and_its_release_did_not() -> None:
    released = leader.released(held_by("other", transitions=3), WALL)
    assert released.transitions == 3
    assert leader.claim(released, "me", T, WALL).transitions == 4


def test_renewing_keeps_the_acquire_time_and_transitions() -> None:
    renewed = leader.claim(held_by("me", transitions=3), "me", T, WALL)
    assert renewed == Record("me", 15, "a", "2026-01-02T03:04:05.678901Z", 3)


def test_a_fractional_lease_duration_is_rounded_up() -> None:
    assert leader.claim(None, "me", Timings(2.5, 2.0, 0.5), WALL).duration_seconds == 3


def test_release_clears_the_holder_and_expires_at_once() -> None:
    released = leader.released(held_by("me"), WALL)
    assert (released.holder, released.duration_seconds) == ("", 1)


def test_a_leader_is_deposed_at_the_renew_deadline() -> None:
    assert not leader.deposed(100.0, 109.9, T)
    assert leader.deposed(100.0, 110.0, T)


def test_records_round_trip_through_a_lease() -> None:
    record = Record("me", 15, "a", "r", 2)
    assert Record.of({"spec": record.spec()}) == record
    assert Record.of({"spec": {}}) == Record("", 0, None, None, 0)


def test_client_go_defaults() -> None:
    assert (T.lease_duration, T.renew_deadline, T.retry_period) == (15.0, 10.0, 2.0)
    assert T.problems() == []


@pytest.mark.parametrize(
    ("timings", "needle"),
    [
        (Timings(10.0, 10.0, 2.0), "lease duration must exceed the renew deadline"),
        (Timings(15.0, 2.0, 2.0), "renew deadline must exceed"),
        (Timings(15.0, 10.0, 0.0), "retry period must be positive"),
    ],
)
def test_timings_that_could_make_two_leaders_are_refused(timings: Timings, needle: str) -> None:
    assert any(needle in p for p in timings.problems())


def test_the_namespace_comes_from_the_downward_api_then_the_service_account(
    tmp_path: Path,
) -> None:
    mounted = tmp_path / "namespace"
    mounted.write_text("from-file\n")
    assert leader.default_namespace({"POD_NAMESPACE": "from-env"}, mounted) == "from-env"
    assert leader.default_namespace({}, mounted) == "from-file"
    assert leader.default_namespace({}, tmp_path / "missing") == ""


def test_identities_differ_between_processes_of_one_pod() -> None:
    assert leader.default_identity() != leader.default_identity()
