"""The ranks ConfigMap: compacted (ranks.py ``compacted``), bounded and read the same; and
corrected by a later read of the launcher (``corrected``)."""

from __future__ import annotations

from datetime import UTC, datetime

from mpijob_elastic.core.inputs.ranks import (
    COMPACT_AT,
    NO_REMOTE_SHELL,
    RankSnapshot,
    compacted,
    corrected,
    pushed,
)

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
START = int(AT.timestamp()) - 100_000


def shell(data: dict[str, str], host: str, pid: int, second: int, code: str | None) -> None:
    """One remote shell's reports: its start, its commit, and its exit unless it runs."""
    key = f"{host}_{pid}_{second}"
    data[key] = "start"
    data[f"{key}_committed"] = str(second + 5)
    if code is not None:
        data[f"{key}_exit"] = code


def long_run() -> dict[str, str]:
    """A long elastic run: hundreds of shells into three hosts ended (resets, relocations,
    one failure long ago), one running into each of two hosts."""
    data: dict[str, str] = {}
    for n in range(COMPACT_AT // 2):
        shell(data, f"job-worker-{n % 3}", 1000 + n, START + 60 * n, "1" if n == 7 else "0")
    shell(data, "job-worker-0", 9000, START + 60 * COMPACT_AT, None)
    shell(data, "job-worker-4", 9001, START + 60 * COMPACT_AT + 1, None)
    return data


def test_few_reports_are_left_alone() -> None:
    data: dict[str, str] = {}
    shell(data, "job-worker-0", 1, START, "0")
    shell(data, "job-worker-0", 2, START + 60, None)
    assert compacted(data) is None


def test_many_reports_keep_the_running_shells_and_each_hosts_latest() -> None:
    data = long_run()
    assert len(data) > COMPACT_AT
    kept = compacted(data)
    assert kept is not None
    # Two running shells (start, commit) and three hosts' latest ended ones (and exit).
    assert len(kept) == 2 * 2 + 3 * 3
    assert all(data[k] == v for k, v in kept.items())
    # Read the same as before: who is reached, since when, committed, last started.
    full, small = pushed(data, AT), pushed(kept, AT)
    for field in ("hosts", "since", "latest", "committed", "started", "known"):
        assert getattr(small, field) == getattr(full, field), field
    assert compacted(kept) is None


def test_many_keys_that_are_no_shells_reports_are_never_rewritten() -> None:
    """Else every turn would write the object as it is, and each write bring a turn."""
    data = {f"key-{n}": "x" for n in range(COMPACT_AT + 1)}
    shell(data, "job-worker-0", 1, START, "0")
    assert compacted(data) is None


def test_keys_that_are_no_report_are_kept_and_never_raise() -> None:
    data = long_run()
    data["job-worker-1_1_99999999999999999999999"] = "start"
    data["job-worker-1_1_99999999999999999999999_exit"] = "0"
    data["stray"] = "x"
    kept = compacted(data)
    assert kept is not None
    assert kept["stray"] == "x"


def test_a_read_corrects_only_the_shells_that_started_before_it_and_it_missed() -> None:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    second = int(at.timestamp())
    reports = pushed(
        {
            f"job-worker-0_1_{second - 30}": "start",
            f"job-worker-1_2_{second - 30}": "start",  # its exit report lost
            f"job-worker-2_3_{second}": "start",  # in the second the read began
            f"job-worker-3_4_{second - 30}": "start",
            f"job-worker-3_4_{second - 30}_committed": str(second - 29),
        },
        at,
    )
    read = RankSnapshot(at, frozenset({"job-worker-0"}))
    got = corrected(reports, read)
    assert got.hosts == frozenset({"job-worker-0", "job-worker-2"})
    assert set(got.since) == set(got.latest) == {"job-worker-0", "job-worker-2"}
    assert got.committed == frozenset()
    assert {k.split("_")[0] for k in got.running_shells} == {"job-worker-0", "job-worker-2"}
    # What the reports say of shells that ended stays: who was reached, and when.
    assert got.known == reports.known
    assert got.started == reports.started
    # A launcher where no remote shell runs at all: every older claim has ended.
    none_left = RankSnapshot(at, None, NO_REMOTE_SHELL)
    assert corrected(reports, none_left).hosts == frozenset({"job-worker-2"})
    # A read that failed, or none, says nothing.
    assert corrected(reports, RankSnapshot(at, None, "TimeoutError: ")) is reports
    assert corrected(reports, None) is reports
