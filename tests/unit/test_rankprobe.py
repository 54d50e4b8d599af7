"""RankProbes: background reads of the launcher, and what they remember between reads."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

from mpijob_elastic.core.actions import Probe
from mpijob_elastic.core.inputs.ranks import pushed
from mpijob_elastic.machinery.rankprobe import RankProbes

KEY = ("ns", "job")
PROBE = Probe("job-launcher", "main")


def shells(*hosts: str) -> bytes:
    return b"".join(f"/bin/sh\0/etc/mpi/kubexec.sh\0{h}\0cmd\0".encode() for h in hosts)


async def read(probes: RankProbes, answered: asyncio.Event) -> None:
    answered.clear()
    probes.request(KEY, PROBE)
    await asyncio.wait_for(answered.wait(), 5)


def test_a_shell_that_ends_while_others_go_on_is_lost_until_acted_on() -> None:
    outputs = [
        shells("job-worker-0", "job-worker-1", "job-worker-2"),
        shells("job-worker-0", "job-worker-2"),
        shells("job-worker-0", "job-worker-2"),
    ]

    async def main() -> None:
        answered = asyncio.Event()

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            assert (ns, pod, container) == ("ns", "job-launcher", "main")
            return outputs.pop(0)

        probes = RankProbes(execute, lambda _key: answered.set())
        await read(probes, answered)
        first = probes.answer(KEY)
        assert first is not None
        assert first.hosts == frozenset({"job-worker-0", "job-worker-1", "job-worker-2"})
        assert first.lost == frozenset()
        await read(probes, answered)
        second = probes.answer(KEY)
        assert second is not None
        assert second.lost == frozenset({"job-worker-1"})
        # A read before the planner acted keeps the loss.
        await read(probes, answered)
        third = probes.answer(KEY)
        assert third is not None
        assert third.lost == {"job-worker-1"}
        probes.acted_on(KEY, third)
        acted = probes.answer(KEY)
        assert acted is not None
        assert acted.lost == frozenset()
        await probes.stop()

    asyncio.run(main())


def test_all_shells_ending_at_once_is_the_run_ending_not_failures() -> None:
    outputs = [shells("job-worker-0", "job-worker-1"), b"python\0train.py\0"]

    async def main() -> None:
        answered = asyncio.Event()

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            return outputs.pop(0)

        probes = RankProbes(execute, lambda _key: answered.set())
        await read(probes, answered)
        await read(probes, answered)
        snapshot = probes.answer(KEY)
        assert snapshot is not None
        assert snapshot.hosts is None
        assert snapshot.lost == frozenset()

    asyncio.run(main())


def test_a_failed_read_is_an_answer_that_cannot_be_read() -> None:
    async def main() -> None:
        answered = asyncio.Event()

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            raise PermissionError("403 Forbidden: cannot get pods/exec")

        probes = RankProbes(execute, lambda _key: answered.set())
        await read(probes, answered)
        snapshot = probes.answer(KEY)
        assert snapshot is not None
        assert snapshot.hosts is None
        assert "403 Forbidden" in snapshot.error

    asyncio.run(main())


def test_one_read_at_a_time_per_job() -> None:
    async def main() -> None:
        started = 0
        release = asyncio.Event()

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            nonlocal started
            started += 1
            await release.wait()
            return shells("job-worker-0")

        probes = RankProbes(execute, lambda _key: None)
        for _ in range(5):
            probes.request(KEY, PROBE)
        await asyncio.sleep(0.05)
        assert started == 1
        release.set()
        await asyncio.sleep(0.05)
        await probes.stop()

    asyncio.run(main())


def test_reads_of_all_jobs_together_are_bounded() -> None:
    async def main() -> None:
        running = 0
        most = 0
        release = asyncio.Event()
        answered: list[tuple[str, str]] = []

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await release.wait()
            running -= 1
            return shells("job-worker-0")

        probes = RankProbes(execute, answered.append, in_flight=3, per_second=1000)
        keys = [("ns", f"job-{i}") for i in range(10)]
        for key in keys:
            probes.request(key, PROBE)
        # Started 1 ms apart: on a loaded machine the third may take longer than 50 ms.
        for _ in range(200):
            if running == 3:
                break
            await asyncio.sleep(0.01)
        assert running == 3
        release.set()
        for _ in range(100):
            if len(answered) == len(keys):
                break
            await asyncio.sleep(0.01)
        # Every job was read in the end, never more than three at once.
        assert sorted(answered) == sorted(keys)
        assert most == 3
        await probes.stop()

    asyncio.run(main())


def test_a_read_without_a_free_slot_keeps_the_last_answer() -> None:
    async def main() -> None:
        release = asyncio.Event()
        answered: list[tuple[str, str]] = []
        other = ("ns", "other")

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            if pod == "busy":
                await release.wait()
            return shells("job-worker-0", "job-worker-1")

        probes = RankProbes(execute, answered.append, in_flight=1, slot_wait=0)
        probes.request(KEY, PROBE)
        await asyncio.sleep(0.05)
        first = probes.answer(KEY)
        assert first is not None
        assert first.hosts == frozenset({"job-worker-0", "job-worker-1"})
        probes.request(other, Probe("busy", "main"))
        await asyncio.sleep(0.05)
        # The slot is taken and the read may not wait: no answer, not an unreadable one.
        probes.request(KEY, PROBE)
        await asyncio.sleep(0.05)
        assert probes.answer(KEY) is first
        assert answered == [KEY]
        release.set()
        await asyncio.sleep(0.05)
        assert answered == [KEY, other]
        # And the job's next read, with a slot free, goes through.
        probes.request(KEY, PROBE)
        await asyncio.sleep(0.05)
        assert answered == [KEY, other, KEY]
        await probes.stop()

    asyncio.run(main())


def test_reads_start_at_most_per_second_for_all_jobs_together() -> None:
    async def main() -> None:
        starts: list[float] = []
        answered: list[tuple[str, str]] = []
        loop = asyncio.get_running_loop()

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            starts.append(loop.time())
            return shells("job-worker-0")

        probes = RankProbes(execute, answered.append, per_second=20)
        keys = [("ns", f"job-{i}") for i in range(5)]
        for key in keys:
            probes.request(key, PROBE)
        for _ in range(200):
            if len(answered) == len(keys):
                break
            await asyncio.sleep(0.01)
        assert sorted(answered) == sorted(keys)
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert min(gaps) >= 0.045, gaps
        await probes.stop()

    asyncio.run(main())


def report(rv: str, data: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "job-ranks", "resourceVersion": rv}, "data": data}


def test_reports_lose_a_worker_whose_shell_failed_while_others_go_on() -> None:
    at = datetime.now(UTC)
    probes = RankProbes(lambda *_: asyncio.sleep(0, b""), lambda _key: None)
    started = {f"job-worker-{i}_{100 + i}_5": "start" for i in range(3)}
    first = probes.pushed(KEY, report("1", started), True, at)
    assert first is not None
    assert first.hosts == first.known == frozenset({"job-worker-0", "job-worker-1", "job-worker-2"})
    # Since the shell's start second, which its key names.
    assert first.since["job-worker-0"] == datetime.fromtimestamp(5, UTC)
    # worker-1's rank died (exit 1), worker-2's finished (exit 0): only worker-1 is lost.
    ended = {**started, "job-worker-1_101_5_exit": "1", "job-worker-2_102_5_exit": "0"}
    second = probes.pushed(KEY, report("2", ended), True, at)
    assert second is not None
    assert second.hosts == frozenset({"job-worker-0"})
    assert second.lost == frozenset({"job-worker-1"})
    # The same report again: same answer, as of now.
    later = at + timedelta(seconds=3)
    again = probes.pushed(KEY, report("2", ended), True, later)
    assert again is not None
    assert again.lost == frozenset({"job-worker-1"})
    assert again.at == later
    probes.acted_on(KEY, again)
    handled = probes.pushed(KEY, report("2", ended), True, later)
    assert handled is not None
    assert handled.lost == frozenset()
    # No launcher running: no snapshot, and the next launcher starts afresh.
    assert probes.pushed(KEY, report("2", ended), False, later) is None
    fresh = probes.pushed(KEY, report("3", {"job-worker-0_7_9_exit": "1"}), True, later)
    assert fresh is not None
    assert fresh.hosts == frozenset()
    assert fresh.lost == frozenset()


def test_all_shells_ending_at_once_is_the_run_ending_not_ranks_lost() -> None:
    at = datetime.now(UTC)
    probes = RankProbes(lambda *_: asyncio.sleep(0, b""), lambda _key: None)
    started = {"job-worker-0_1_5": "start", "job-worker-1_2_5": "start"}
    probes.pushed(KEY, report("1", started), True, at)
    ended = {**started, "job-worker-0_1_5_exit": "1", "job-worker-1_2_5_exit": "1"}
    last = probes.pushed(KEY, report("2", ended), True, at)
    assert last is not None
    assert last.lost == frozenset()
    assert last.hosts == frozenset()


def test_each_host_is_known_since_the_first_read_that_showed_it() -> None:
    outputs = [
        shells("job-worker-0"),
        shells("job-worker-0", "job-worker-1"),
        shells("job-worker-0", "job-worker-1"),
        shells("job-worker-0"),
    ]

    async def main() -> None:
        answered = asyncio.Event()

        async def execute(ns: str, pod: str, container: str | None) -> bytes:
            return outputs.pop(0)

        probes = RankProbes(execute, lambda _key: answered.set())
        reads = []
        for _ in range(4):
            await read(probes, answered)
            snapshot = probes.answer(KEY)
            assert snapshot is not None
            reads.append(snapshot)
        assert reads[0].since == {"job-worker-0": reads[0].at}
        assert reads[1].since == {"job-worker-0": reads[0].at, "job-worker-1": reads[1].at}
        # Still there: since the read that first showed it, not since this one.
        assert reads[2].since == {"job-worker-0": reads[0].at, "job-worker-1": reads[1].at}
        assert reads[3].since == {"job-worker-0": reads[0].at}
        await probes.stop()

    asyncio.run(main())


def test_reports_say_which_hosts_committed_since_their_latest_shell_started() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    t = int(at.timestamp())
    data = {
        # worker-0: two shells (two slots), the later one without its marker yet.
        f"job-worker-0_1_{t - 50}": "start",
        f"job-worker-0_1_{t - 50}_committed": str(t - 40),
        f"job-worker-0_2_{t - 9}": "start",
        # worker-1: its shell reported the marker.
        f"job-worker-1_3_{t - 9}": "start",
        f"job-worker-1_3_{t - 9}_committed": str(t - 1),
        # worker-2: a marker of a shell that has ended says nothing of the one that runs.
        f"job-worker-2_4_{t - 90}": "start",
        f"job-worker-2_4_{t - 90}_committed": str(t - 80),
        f"job-worker-2_4_{t - 90}_exit": "134",
        f"job-worker-2_5_{t - 3}": "start",
        # worker-3: a start second past any clock (a forged key) is taken as now, and one
        # of 20 digits neither raises.
        "job-worker-3_6_253402300800": "start",
        "job-worker-4_7_99999999999999999999": "start",
    }
    got = pushed(data, at)
    assert got.hosts == frozenset(f"job-worker-{i}" for i in range(5))
    assert got.committed == frozenset({"job-worker-1"})
    assert got.since["job-worker-0"] == at - timedelta(seconds=50)
    assert got.latest["job-worker-0"] == at - timedelta(seconds=9)
    assert got.latest["job-worker-2"] == at - timedelta(seconds=3)
    assert got.since["job-worker-3"] == got.since["job-worker-4"] == at
    # Every shell of worker-0 marked: committed.
    data[f"job-worker-0_2_{t - 9}_committed"] = str(t)
    assert "job-worker-0" in pushed(data, at).committed
