"""The mock Horovod elastic driver and rank, without a cluster.

The driver is driven with a discovery script the test rewrites, a fake remote shell that
runs the command here (or refuses a host the way the API server refuses an exec), and a
fake rank that exits 137 when a marker file appears, which is what a rank reports when its
pod is deleted under it, 134 when the driver's removal mark reaches it, and 0 when it is
told to finish. The rank's kill emulation is tested against a fake kubectl.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from e2e.mockhorovod import (
    CRASH_EXIT_CODE,
    CRASH_FILE,
    KILLED_EXIT_CODE,
    RANK_STARTED_MARKER,
    REMOVED_EXIT_CODE,
    REMOVED_MARK,
    REMOVED_MESSAGE,
    RESET_FILE_SUFFIX,
)
from e2e.mockhorovod import events as ev
from e2e.mockhorovod.cli import parse_args
from e2e.mockhorovod.config import DEFAULT_RANK_COMMAND, ConfigError, DriverConfig
from e2e.mockhorovod.discovery import DiscoveryError, parse_discovery_output
from e2e.mockhorovod.driver import Driver, main
from e2e.mockhorovod.hook import COMMITTED_MARKER
from e2e.mockhorovod.hosts import cooldown_seconds
from e2e.mockhorovod.rank import check_pod, judge_pod, local_stop_reason
from e2e.mockhorovod.remote import remote_exit_code, remote_shell_command
from tests.controller import wait_for as wait_until

REPO = Path(__file__).resolve().parents[2]
Event = dict[str, Any]

FAKE_RANK = f"""#!/bin/sh
# $1 host, $2 stop file, $3 marker dir, $4 local rank: exits 137 once "$3/kill-$1" or
# "$3/kill-$1-$4" exists (its pod deleted), 0 once "$3/done-$1-$4" does (training done),
# 134 once its stop file holds the removal mark (no assignment), 0 on an empty one.
echo {RANK_STARTED_MARKER}
trap 'exit 0' TERM
while :; do
  if [ -e "$3/kill-$1" ] || [ -e "$3/kill-$1-$4" ]; then echo "pod $1 deleted" >&2; exit 137; fi
  if [ -e "$3/done-$1-$4" ]; then exit 0; fi
  if [ -e "$2" ]; then
    if [ "$(cat "$2")" = {REMOVED_MARK} ]; then echo "{REMOVED_MESSAGE}" >&2; exit 134; fi
    exit 0
  fi
  sleep 0.05
done
"""

# kubexec.sh's shape, run locally; hosts listed in the forbid file are refused as RBAC
# refuses a pods/exec the launcher's Role does not grant.
FAKE_RSH = """#!/bin/sh
POD_NAME=$1
shift
if grep -qx "$POD_NAME" {forbid} 2>/dev/null; then
  echo "Error from server (Forbidden): pods \\"$POD_NAME\\" is forbidden:" \\
    "User \\"system:serviceaccount:default:job-launcher\\"" \\
    "cannot create resource \\"pods/exec\\"" >&2
  exit 1
fi
exec /bin/sh -c "$*"
"""

FAKE_KUBECTL = """#!/bin/sh
# Answers `kubectl [flags] get pod NAME -o json` from STATE/NAME.json, STATE/NAME.err
# (a transient error), or NotFound.
state={state}
prev=""
name=""
for a in "$@"; do
  if [ "$prev" = "pod" ]; then name=$a; fi
  prev=$a
done
echo "$*" >> "$state/calls"
if [ -f "$state/$name.err" ]; then cat "$state/$name.err" >&2; exit 1; fi
if [ -f "$state/$name.json" ]; then cat "$state/$name.json"; exit 0; fi
echo "Error from server (NotFound): pods \\"$name\\" not found" >&2
exit 1
"""


def write_script(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)  # the driver may run it at any moment: never show half a file
    return path


@dataclass
class Rig:
    """Files for one driver run, and the events it has emitted so far."""

    tmp: Path
    events: list[Event] = field(default_factory=list)

    @property
    def discovery(self) -> Path:
        return self.tmp / "discover_hosts.sh"

    @property
    def forbid(self) -> Path:
        return self.tmp / "forbid"

    def set_hosts(self, *lines: str) -> None:
        body = "".join(f"echo {line}\n" for line in lines)
        write_script(self.discovery, "#!/bin/sh\n" + body)

    def set_discovery(self, body: str) -> None:
        write_script(self.discovery, "#!/bin/sh\n" + body + "\n")

    def kill(self, host: str, local_rank: int | None = None) -> None:
        suffix = "" if local_rank is None else f"-{local_rank}"
        (self.tmp / f"kill-{host}{suffix}").touch()

    def done(self, host: str, local_rank: int = 0) -> None:
        (self.tmp / f"done-{host}-{local_rank}").touch()

    def config(self, **overrides: Any) -> DriverConfig:
        fake_rank = write_script(self.tmp / "fake_rank.sh", FAKE_RANK)
        rsh = write_script(self.tmp / "kubexec.sh", FAKE_RSH.format(forbid=self.forbid))
        template = (
            f"exec /bin/sh {shlex.quote(str(fake_rank))} {{host}} {{stop_file}} "
            f"{shlex.quote(str(self.tmp))} {{local_rank}}"
        )
        base = DriverConfig(
            np=1,
            min_np=1,
            discovery_script=str(self.discovery),
            rsh_agent=str(rsh),
            rank_command=template,
            discovery_interval=0.1,
            discovery_timeout=2.0,
            stop_grace=1.0,
            commit_interval=0.3,
            work_dir=str(self.tmp / "work"),
            # The interface probe and its two-host minimum have tests of their own.
            network_interface="eth0",
        )
        return replace(base, **overrides)

    def of(self, *names: str, host: str | None = None) -> list[Event]:
        return [e for e in ev.of_kind(self.events, *names) if host is None or e.get("host") == host]


@dataclass
class Running:
    driver: Driver
    task: asyncio.Task[int]

    async def finish(self) -> int:
        self.driver.request_stop("stop_file")  # the training finished by itself
        return await asyncio.wait_for(self.task, 10)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield Rig(tmp_path)
    # A stubborn fake rank may outlive its driver; left running, its `kubexec.sh <host>`
    # command line would show up in every later KWOK test's read of a "launcher" (an exec
    # there runs on this machine) as a remote shell of that test's job.
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(tmp_path).encode() in cmdline.read_bytes():
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


async def start(rig: Rig, **overrides: Any) -> Running:
    cfg = rig.config(**overrides)
    cfg.validate()
    driver = Driver(cfg, on_event=rig.events.append)
    return Running(driver, asyncio.create_task(driver.run()))


async def wait_for(rig: Rig, predicate: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            seen = [(e["event"], e.get("host")) for e in rig.events]
            raise AssertionError(f"timed out waiting for {what}; events: {seen}")
        await asyncio.sleep(0.02)


async def after_commit(rig: Rig, run: Running) -> None:
    """Returns just after the job's next commit, so a test knows a whole commit interval
    lies ahead of it."""
    seen = run.driver.commits
    await wait_for(rig, lambda: run.driver.commits > seen, "the next commit")


def index_of(rig: Rig, record: Event) -> int:
    return next(i for i, e in enumerate(rig.events) if e is record)


def running_on(rig: Rig, host: str) -> int:
    return len(rig.of(ev.RANK_RUNNING, host=host))


def assert_no_failures(rig: Rig) -> None:
    assert rig.of(*ev.FAILURE_EVENTS) == []
    (exit_event,) = rig.of(ev.DRIVER_EXIT)
    assert exit_event["failures"] == 0
    assert exit_event["blacklisted"] == 0


# -- discovery parsing and helpers -------------------------------------------------------


def test_discovery_output_is_parsed_like_horovod() -> None:
    out = "w-10:2\n\n  w-2:2  \nw-3\nw-10:2"
    assert parse_discovery_output(out, slots_per_host=4) == {"w-10": 2, "w-2": 2, "w-3": 4}
    assert parse_discovery_output("", slots_per_host=None) == {}
    with pytest.raises(DiscoveryError, match="no ':slots'"):
        parse_discovery_output("w-0:1\nw-1", slots_per_host=None)
    with pytest.raises(DiscoveryError, match="bad slots"):
        parse_discovery_output("w-0:x", slots_per_host=None)
    with pytest.raises(DiscoveryError, match="listed with"):
        parse_discovery_output("w-0:1\nw-0:2", slots_per_host=None)


def test_remote_command_survives_kubexec_quoting(tmp_path: Path) -> None:
    """Horovod's string through /bin/sh -c, then kubexec.sh's "$*", then /bin/sh -c again
    must run the rank command unchanged."""
    kubexec = '#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n/bin/sh -c "$*"\n'
    agent = write_script(tmp_path / "kubexec.sh", kubexec)
    command = "cd /tmp && printf '%s|' 'a b' \"c'd\""
    out = subprocess.run(
        ["/bin/sh", "-c", remote_shell_command(str(agent), "w-0", command)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "a b|c'd|"


def test_remote_exit_code_from_kubectl_stderr() -> None:
    real = "command terminated with exit code 137"
    kwok = (
        "error: Internal error occurred: error executing command in container: "
        "cmd wait: /bin/sh -c cd /x && exec python3 -m e2e.mockhorovod.rank: exit status 137"
    )
    assert remote_exit_code(real) == 137
    assert remote_exit_code("+ set -x\n" + kwok) == 137
    assert remote_exit_code("Error from server (Forbidden): nope") is None


def test_cooldown_doubles_within_range() -> None:
    assert cooldown_seconds(1, 1, 1) == 1.0
    assert 4.0 <= cooldown_seconds(2, 100, 1) <= 6.0
    assert cooldown_seconds(2, 10, 5) == 10.0


def test_cli_mirrors_horovodrun_and_validates() -> None:
    cfg = parse_args(
        shlex.split(
            "-np 2 --min-np 1 --max-np 8 --host-discovery-script /x/d.sh "
            "--blacklist-cooldown-range 10 100 python train.py --lr 0.1"
        )
    )
    assert (cfg.np, cfg.min_np, cfg.max_np) == (2, 1, 8)
    assert cfg.discovery_script == "/x/d.sh"
    assert cfg.cooldown_range == (10, 100)
    assert cfg.command == ("python", "train.py", "--lr", "0.1")
    assert parse_args(["--min-np", "3"]).np == 3
    with pytest.raises(ConfigError):
        parse_args(["-np", "1", "--min-np", "2"])
    with pytest.raises(ConfigError, match="cannot be filled"):
        parse_args(["-np", "1", "--rank-command", "run {nope}"])
    assert main(["-np", "4", "--max-np", "2"]) == 2


def test_cli_rank_start_and_commit_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse_args(["-np", "1"])
    assert (cfg.rank_start_seconds, cfg.commit_marker) == (2.0, True)
    cfg = parse_args(["-np", "1", "--rank-start-seconds", "20", "--no-commit-marker"])
    assert (cfg.rank_start_seconds, cfg.commit_marker) == (20.0, False)
    monkeypatch.setenv("MOCKHOROVOD_RANK_START_SECONDS", "7.5")
    assert parse_args(["-np", "1"]).rank_start_seconds == 7.5
    assert parse_args(["-np", "1", "--rank-start-seconds", "0"]).rank_start_seconds == 0.0
    with pytest.raises(ConfigError, match="rank-start-seconds"):
        parse_args(["-np", "1", "--rank-start-seconds", "-1"])


# -- driver: membership ------------------------------------------------------------------


async def test_waits_for_np_then_starts_ranks_and_adds_new_hosts(rig: Rig) -> None:
    rig.set_hosts("a:2")
    run = await start(rig, np=3, min_np=1)
    await wait_for(rig, lambda: bool(rig.of(ev.WAITING_FOR_SLOTS)), "waiting_for_slots")
    await asyncio.sleep(0.3)
    assert rig.of(ev.RANK_STARTED) == []  # 2 slots < -np 3

    rig.set_hosts("a:2", "b:1")
    await wait_for(rig, lambda: running_on(rig, "a") == 2 and running_on(rig, "b") == 1, "3 ranks")
    (started,) = rig.of(ev.JOB_STARTED)
    assert started["available"] == 3

    rig.set_hosts("a:2", "b:1", "c:1")
    await wait_for(rig, lambda: running_on(rig, "c") == 1, "rank on c")
    assert [e["host"] for e in rig.of(ev.HOST_ADDED)] == ["a", "b", "c"]
    assert rig.of(ev.DISCOVERY)[-1]["hosts"] == ["a", "b", "c"]

    assert await run.finish() == 0
    stopped = rig.of(ev.RANK_STOPPED)
    assert len(stopped) == 4
    assert {e["reason"] for e in stopped} == {"shutdown"}
    assert_no_failures(rig)


async def test_host_leaving_discovery_is_graceful(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")

    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STOPPED, host="b")), "b stopped")
    (removed,) = rig.of(ev.HOST_REMOVED)
    assert removed["host"] == "b"
    assert removed["graceful"] is True
    (stopped,) = rig.of(ev.RANK_STOPPED, host="b")
    assert (stopped["reason"], stopped["exit_code"]) == ("host_removed", REMOVED_EXIT_CODE)
    # The pod that hosted b is deleted only now, after the driver let go: no failure.
    rig.kill("b")

    # A new pod reusing the name is a new host, not a blacklisted one.
    (rig.tmp / "kill-b").unlink()
    rig.set_hosts("a:1", "b:1")
    await wait_for(rig, lambda: running_on(rig, "b") == 2, "b re-added")
    assert len(rig.of(ev.HOST_ADDED, host="b")) == 2

    assert await run.finish() == 0
    assert_no_failures(rig)
    assert rig.of(ev.DRIVER_EXIT)[0]["hosts_removed"] == 1


# A rank as in a real container: it keeps running when the remote shell that started it is
# signalled (a killed `kubectl exec` does not end the command), and leaves only when its
# alive file is removed. $1 rank id, $2 the directory of alive files.
CONTAINED_RANK = f"""#!/bin/sh
alive="$2/alive-$1"
touch "$alive"
trap '' TERM
echo {RANK_STARTED_MARKER}
while [ -e "$alive" ]; do sleep 0.05; done
echo "{REMOVED_MESSAGE}" >&2
exit {REMOVED_EXIT_CODE}
"""


async def test_removed_host_is_notified_through_the_remote_shell(rig: Rig) -> None:
    rank = write_script(rig.tmp / "contained_rank.sh", CONTAINED_RANK)
    rig.set_hosts("a:1", "b:1")
    run = await start(
        rig,
        np=2,
        min_np=1,
        rank_command=f"exec /bin/sh {shlex.quote(str(rank))} {{rank_id}} {rig.tmp}",
        rank_alive_file=str(rig.tmp / "alive-{rank_id}"),
        stop_grace=8.0,
    )
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    removed_at = time.monotonic()
    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STOPPED, host="b")), "b stopped", 20)
    # It left on the notice, with exit 134, well before the driver's SIGTERM would come.
    assert time.monotonic() - removed_at < 4.0
    (stopped,) = rig.of(ev.RANK_STOPPED, host="b")
    assert (stopped["reason"], stopped["exit_code"]) == ("host_removed", REMOVED_EXIT_CODE)
    assert stopped["rsh_exit_code"] == REMOVED_EXIT_CODE  # the shell lived until the rank left
    assert stopped["ignored"] is True
    assert await run.finish() == 0
    assert_no_failures(rig)
    assert list(rig.tmp.glob("alive-*")) == []  # the shutdown let the rank on a go too


async def test_rank_dying_while_listed_blacklists_the_host(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:2")
    run = await start(rig, np=3, min_np=1)
    await wait_for(rig, lambda: running_on(rig, "a") == 1 and running_on(rig, "b") == 2, "ranks")

    rig.kill("b")  # pod deleted while still listed: what upstream controllers do
    await wait_for(rig, lambda: bool(rig.of(ev.HOST_BLACKLISTED)), "blacklist")
    failed = rig.of(ev.RANK_FAILED, host="b")
    assert failed
    assert failed[0]["exit_code"] == KILLED_EXIT_CODE
    assert failed[0]["exec_refused"] is False
    assert failed[0]["listed"] is True
    assert "pod b deleted" in failed[0]["stderr"]
    (black,) = rig.of(ev.HOST_BLACKLISTED)
    assert black["host"] == "b"
    assert black["permanent"] is True
    assert rig.of(ev.EXEC_FAILED) == []

    # Neither staying listed nor leaving and coming back brings a blacklisted name back.
    (rig.tmp / "kill-b").unlink()
    await asyncio.sleep(0.4)
    rig.set_hosts("a:1")
    await asyncio.sleep(0.3)
    rig.set_hosts("a:1", "b:2")
    await asyncio.sleep(0.4)
    assert len(rig.of(ev.RANK_STARTED, host="b")) == 2
    assert len(rig.of(ev.HOST_ADDED, host="b")) == 1
    assert rig.of(ev.HOST_REMOVED) == []  # a blacklisted host is not a graceful removal
    assert running_on(rig, "a") == 1

    assert await run.finish() == 0
    (exit_event,) = rig.of(ev.DRIVER_EXIT)
    assert exit_event["blacklisted_hosts"] == ["b"]
    assert exit_event["failures"] == len(failed) >= 1


def stubborn_template(rig: Rig) -> str:
    """A fake rank that ignores its stop file (as on another machine): it stays until the
    driver's safety-net signal, or until killed."""
    stop_block = FAKE_RANK[FAKE_RANK.index('  if [ -e "$2" ]') : FAKE_RANK.index("  sleep 0.05")]
    stubborn = write_script(rig.tmp / "stubborn.sh", FAKE_RANK.replace(stop_block, ""))
    return f"exec /bin/sh {stubborn} {{host}} {{stop_file}} {rig.tmp} {{local_rank}}"


async def test_rank_killed_while_its_host_is_leaving_is_a_failure(rig: Rig) -> None:
    # A removed host's ranks leave at the next commit; until then they hold their
    # assignment, so a pod deleted under them first is a failure, as in Horovod (the
    # upstream order, or a drain shorter than the poll plus the next commit).
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, rank_command=stubborn_template(rig), commit_interval=2.0)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    await after_commit(rig, run)

    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.HOST_REMOVED, host="b")), "b leaving")
    rig.kill("b")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_FAILED, host="b")), "b failed")
    assert rig.of(ev.RANK_UNASSIGNED) == []  # the commit had not come yet
    await wait_for(rig, lambda: bool(rig.of(ev.HOST_BLACKLISTED, host="b")), "b blacklisted")
    (failed,) = rig.of(ev.RANK_FAILED, host="b")
    assert failed["exit_code"] == KILLED_EXIT_CODE
    assert failed["listed"] is False
    assert rig.of(ev.RANK_STOPPED, host="b") == []
    assert await run.finish() == 0
    assert rig.of(ev.DRIVER_EXIT)[0]["hosts_removed"] == 0  # blacklisted, not removed


def kubexec_processes(rsh: Path, host: str) -> list[int]:
    """Pids of processes whose command line is ``... <rsh> <host> ...``: what the
    controller looks for from the launcher's side. Matched by this test's own script path:
    /proc shows every test's processes, and another run of this file may be at host b
    too."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv]
        text = " ".join(words)
        if f"{rsh} {host} " in text or f"{rsh}' '{host}' " in text:
            found.append(int(proc.name))
    return found


# kubexec.sh's real shape: the rank runs under `/bin/sh -c`, not exec'd, so the
# `kubexec.sh <host>` process lives exactly as long as the rank.
KUBEXEC_LIKE = """#!/bin/sh
POD_NAME=$1
shift
/bin/sh -c "$*"
"""


async def test_removed_rank_exits_134_at_the_next_commit_and_is_ignored(rig: Rig) -> None:
    rsh = write_script(rig.tmp / "kubexec.sh", KUBEXEC_LIKE)
    interval = 1.5
    rig.set_hosts("a:1", "b:1")
    seen: dict[str, list[int]] = {}

    def snapshot(record: Event) -> None:
        rig.events.append(record)
        if record.get("host") == "b" and record["event"] in (
            ev.HOST_REMOVED,
            ev.RANK_UNASSIGNED,
        ):
            seen[record["event"]] = kubexec_processes(rsh, "b")

    cfg = replace(
        rig.config(np=2, min_np=1, commit_interval=interval),
        rank_command=DriverConfig(np=1, min_np=1).rank_command,  # the real rank
        rsh_agent=str(rsh),
    )
    run = Running(driver := Driver(cfg, on_event=snapshot), asyncio.create_task(driver.run()))
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b", within=10)
    await after_commit(rig, run)

    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STOPPED, host="b")), "b gone", within=10)
    (removed,) = rig.of(ev.HOST_REMOVED, host="b")
    (reset,) = rig.of(ev.RESET)
    (unassigned,) = rig.of(ev.RANK_UNASSIGNED, host="b")
    (stopped,) = rig.of(ev.RANK_STOPPED, host="b")
    # Nothing at once: the rank and its remote shell were there when the driver noticed,
    # and still there when the commit took the assignment away.
    assert seen[ev.HOST_REMOVED]
    assert seen[ev.RANK_UNASSIGNED]
    assert removed["ts"] < reset["ts"] <= unassigned["ts"] < stopped["ts"]
    assert reset["reasons"] == ["hosts_updated"]
    assert unassigned["commit"] == reset["commit"]
    assert unassigned["reason"] == "host_removed"
    # It exited 134 by itself (not by a signal: the shell ended with it) within a commit.
    assert (stopped["exit_code"], stopped["rsh_exit_code"]) == (134, 134)
    assert (stopped["reason"], stopped["ignored"]) == ("host_removed", True)
    assert stopped["ts"] - unassigned["ts"] < interval + 1.0
    assert kubexec_processes(rsh, "b") == []
    assert running_on(rig, "a") == 1
    assert not rig.of(ev.RANK_STOPPED, host="a")

    assert await run.finish() == 0
    assert_no_failures(rig)
    assert rig.of(ev.DRIVER_EXIT)[0]["hosts_removed"] == 1


async def test_removed_rank_killed_after_the_commit_is_ignored_not_blacklisted(
    rig: Rig,
) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, rank_command=stubborn_template(rig), stop_grace=5.0)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_UNASSIGNED, host="b")), "b unassigned")
    rig.kill("b")  # its pod deleted after the commit: no assignment, so ignored
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STOPPED, host="b")), "b gone")
    (stopped,) = rig.of(ev.RANK_STOPPED, host="b")
    assert (stopped["exit_code"], stopped["ignored"]) == (KILLED_EXIT_CODE, True)
    await asyncio.sleep(0.7)  # two more commits: still no blacklist
    assert await run.finish() == 0
    assert_no_failures(rig)


async def test_failure_is_recorded_at_once_and_blacklisted_at_the_next_commit(rig: Rig) -> None:
    interval = 1.5
    rig.set_hosts("a:1", "b:2")
    run = await start(rig, np=3, min_np=1, commit_interval=interval)
    await wait_for(rig, lambda: running_on(rig, "a") == 1 and running_on(rig, "b") == 2, "ranks")
    await after_commit(rig, run)

    rig.kill("b", 0)  # one rank of b dies while b is listed
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_FAILED)), "the failure")
    (failed,) = rig.of(ev.RANK_FAILED)
    rig.set_hosts("a:1")  # the controller may drop it from discovery meanwhile
    await asyncio.sleep(0.5)
    assert rig.of(ev.HOST_BLACKLISTED) == []  # FAILURE recorded, no blacklist yet
    assert rig.of(ev.RESET) == []
    (removed,) = rig.of(ev.HOST_REMOVED, host="b")
    assert removed["graceful"] is False  # a failure is already recorded for it

    await wait_for(rig, lambda: bool(rig.of(ev.HOST_BLACKLISTED)), "blacklist", within=4)
    (black,) = rig.of(ev.HOST_BLACKLISTED)
    (reset,) = rig.of(ev.RESET)
    assert reset["reasons"] == ["failure", "hosts_updated"]  # b's unlisting was notified too
    assert black["commit"] == reset["commit"]
    assert (black["host"], black["failed_ranks"]) == ("b", [failed["rank_id"]])
    assert black["line"] == "blacklist failing host: b"
    assert index_of(rig, failed) < index_of(rig, reset) < index_of(rig, black)
    assert black["ts"] - failed["ts"] > 0.5
    # b's surviving rank loses its assignment at that commit and leaves, ignored.
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STOPPED, host="b")), "b's other rank")
    (other,) = rig.of(ev.RANK_STOPPED, host="b")
    assert (other["local_rank"], other["reason"], other["exit_code"]) == (1, "blacklisted", 134)
    assert len(rig.of(ev.RANK_FAILED)) == 1
    assert await run.finish() == 0
    assert rig.of(ev.DRIVER_EXIT)[0]["failures"] == 1


async def test_new_host_gets_ranks_only_at_the_next_commit(rig: Rig) -> None:
    interval = 1.5
    rig.set_hosts("a:1")
    run = await start(rig, np=1, min_np=1, commit_interval=interval)
    await wait_for(rig, lambda: running_on(rig, "a") == 1, "rank on a")
    assert rig.of(ev.RESET) == []  # the first ranks start at once, no commit needed
    await after_commit(rig, run)

    rig.set_hosts("a:1", "b:1")
    await wait_for(rig, lambda: "b" in rig.of(ev.DISCOVERY)[-1]["hosts"], "b discovered")
    (discovered,) = [e for e in rig.of(ev.DISCOVERY) if "b" in e["hosts"]]
    await asyncio.sleep(0.5)
    assert rig.of(ev.HOST_ADDED, host="b") == []
    assert rig.of(ev.RANK_STARTED, host="b") == []

    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b", within=4)
    (reset,) = rig.of(ev.RESET)
    (added,) = rig.of(ev.HOST_ADDED, host="b")
    (started,) = rig.of(ev.RANK_STARTED, host="b")
    assert reset["reasons"] == ["hosts_updated"]
    assert index_of(rig, discovered) < index_of(rig, reset) < index_of(rig, added)
    assert index_of(rig, added) < index_of(rig, started)
    assert added["ts"] - discovered["ts"] > 0.5
    assert await run.finish() == 0
    assert_no_failures(rig)


async def test_assigned_rank_exiting_0_ends_the_job_at_the_next_commit(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, commit_interval=1.0)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    await after_commit(rig, run)

    rig.done("a")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_EXITED)), "a's success")
    (success,) = rig.of(ev.RANK_EXITED)
    assert (success["host"], success["exit_code"], success["success"]) == ("a", 0, True)
    await asyncio.sleep(0.3)
    assert not run.task.done()  # the job ends at the commit, not at once

    # horovodrun exits 1: it had to stop b's rank, which was still training.
    assert await asyncio.wait_for(run.task, 5) == 1
    (reset,) = rig.of(ev.RESET)
    assert reset["reasons"] == ["success"]
    assert reset["ts"] > success["ts"]
    assert rig.of(ev.STOP_REQUESTED)[0]["reason"] == "success"
    (stopped,) = rig.of(ev.RANK_STOPPED)
    assert (stopped["host"], stopped["reason"]) == ("b", "shutdown")
    (exit_event,) = rig.of(ev.DRIVER_EXIT)
    assert (exit_event["exit_code"], exit_event["reason"]) == (1, "success")
    assert_no_failures(rig)


async def test_every_rank_exiting_0_ends_the_job_with_0(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, commit_interval=1.0)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    await after_commit(rig, run)
    rig.done("a")
    rig.done("b")
    assert await asyncio.wait_for(run.task, 5) == 0
    assert len(rig.of(ev.RANK_EXITED)) == 2
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "success"


async def test_refused_exec_at_the_start_ends_the_job_at_the_gloo_timeout(rig: Rig) -> None:
    # The first world waits in hvd.init for every rank: one whose exec was refused never
    # joins, so the others abort at the Gloo timeout and every rank is a FAILURE.
    rig.forbid.write_text("b\n")
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, gloo_timeout=1.5)
    await wait_for(rig, lambda: bool(rig.of(ev.EXEC_FAILED)), "exec_failed")
    (refused,) = rig.of(ev.EXEC_FAILED)
    assert refused["host"] == "b"
    assert refused["exit_code"] == 1
    assert "Forbidden" in refused["stderr"]
    assert rig.of(ev.RANK_FAILED, host="b")[0]["exec_refused"] is True
    assert await asyncio.wait_for(run.task, 6) == 1
    (timeout,) = rig.of(ev.GLOO_TIMEOUT)
    assert timeout["ts"] - rig.of(ev.JOB_STARTED)[0]["ts"] >= 1.5
    (aborted,) = rig.of(ev.RANK_FAILED, host="a")
    assert aborted["gloo_timeout"] is True
    (failed,) = rig.of(ev.JOB_FAILED)
    assert failed["line"] == "failure count == 2 -> stop running"
    (exit_event,) = rig.of(ev.DRIVER_EXIT)
    assert (exit_event["exec_failures"], exit_event["failures"]) == (1, 2)
    assert exit_event["reason"] == "all_failed"


async def test_cooldown_lets_a_blacklisted_host_back(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, cooldown_range=(1, 1))
    await wait_for(rig, lambda: running_on(rig, "a") == 1, "rank on a")
    await wait_for(rig, lambda: bool(rig.of(ev.RESET_COMPLETED)), "the first world up")
    rig.kill("a")
    await wait_for(rig, lambda: bool(rig.of(ev.HOST_BLACKLISTED)), "blacklist")
    assert rig.of(ev.HOST_BLACKLISTED)[0]["cooldown_seconds"] == 1.0
    (rig.tmp / "kill-a").unlink()
    await wait_for(rig, lambda: running_on(rig, "a") == 2, "a back after cooldown", within=4.0)
    assert rig.of(ev.HOST_UNBLACKLISTED, host="a")
    assert await run.finish() == 0


async def test_max_np_caps_slots_and_a_spare_host_takes_over(rig: Rig) -> None:
    rig.set_hosts("a:2", "b:2")
    run = await start(rig, np=2, min_np=1, max_np=3)
    await wait_for(rig, lambda: running_on(rig, "a") == 2 and running_on(rig, "b") == 1, "ranks")
    await asyncio.sleep(0.3)
    assert len(rig.of(ev.RANK_STARTED)) == 3

    rig.set_hosts("b:2")
    await wait_for(rig, lambda: running_on(rig, "b") == 2, "second rank on b")
    assert await run.finish() == 0
    assert_no_failures(rig)


# -- driver: fatal conditions -----------------------------------------------------------


async def test_below_min_np_past_elastic_timeout_fails(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=2, elastic_timeout=0.5)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    rig.set_hosts("a:1")
    assert await asyncio.wait_for(run.task, 5) == 1
    (below,) = rig.of(ev.BELOW_MIN_NP)
    assert (below["slots"], below["min_np"]) == (1, 2)
    (timeout,) = rig.of(ev.ELASTIC_TIMEOUT)
    assert timeout["phase"] == "running"
    (exit_event,) = rig.of(ev.DRIVER_EXIT)
    assert (exit_event["exit_code"], exit_event["reason"]) == (1, "elastic_timeout")


async def test_below_min_np_recovers_within_timeout(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=2, elastic_timeout=5.0)
    await wait_for(rig, lambda: running_on(rig, "b") == 1, "rank on b")
    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.BELOW_MIN_NP)), "below_min_np")
    rig.set_hosts("a:1", "c:1")
    await wait_for(rig, lambda: bool(rig.of(ev.MIN_NP_RESTORED)), "min_np_restored")
    assert await run.finish() == 0


async def test_never_reaching_np_fails_after_elastic_timeout(rig: Rig) -> None:
    rig.set_hosts("a:1")
    run = await start(rig, np=2, min_np=1, elastic_timeout=0.3)
    assert await asyncio.wait_for(run.task, 5) == 1
    assert rig.of(ev.ELASTIC_TIMEOUT)[0]["phase"] == "start"
    assert rig.of(ev.RANK_STARTED) == []


async def test_first_discovery_failure_is_fatal(rig: Rig) -> None:
    rig.set_discovery("echo boom >&2\nexit 3")
    run = await start(rig)
    assert await asyncio.wait_for(run.task, 5) == 1
    (failed,) = rig.of(ev.DISCOVERY_FAILED)
    assert (failed["first"], failed["exit_code"], failed["stderr"]) == (True, 3, "boom")
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "discovery_failed"


async def test_hanging_discovery_times_out(rig: Rig) -> None:
    rig.set_discovery("sleep 10")
    run = await start(rig, discovery_timeout=0.3)
    assert await asyncio.wait_for(run.task, 5) == 1
    assert rig.of(ev.DISCOVERY_FAILED)[0]["timeout"] is True


async def test_later_discovery_failure_keeps_last_hosts(rig: Rig) -> None:
    rig.set_hosts("a:1")
    run = await start(rig)
    await wait_for(rig, lambda: running_on(rig, "a") == 1, "rank on a")
    rig.set_discovery("exit 1")
    await wait_for(rig, lambda: len(rig.of(ev.DISCOVERY_FAILED)) >= 2, "discovery failures")
    assert rig.of(ev.DISCOVERY_FAILED)[0]["first"] is False
    rig.set_hosts("a:1")
    await asyncio.sleep(0.3)
    assert not run.task.done()
    assert rig.of(ev.HOST_REMOVED) == []
    assert len(rig.of(ev.DISCOVERY)) == 1  # the set never changed
    assert await run.finish() == 0


# -- the driver as a process, with the real rank ------------------------------------------


def fake_kubectl(tmp: Path) -> Path:
    state = tmp / "pods"
    state.mkdir(exist_ok=True)
    return write_script(tmp / "kubectl", FAKE_KUBECTL.format(state=shlex.quote(str(state))))


def set_pod(tmp: Path, name: str, **meta: Any) -> None:
    pod = {"metadata": {"name": name, "uid": f"uid-{name}", **meta}, "status": {"phase": "Running"}}
    path = tmp / "pods" / f"{name}.json"
    path.with_suffix(".tmp").write_text(json.dumps(pod))
    os.replace(path.with_suffix(".tmp"), path)


def driver_process(rig: Rig, *extra: str) -> subprocess.Popen[str]:
    rsh = write_script(rig.tmp / "kubexec.sh", FAKE_RSH.format(forbid=rig.forbid))
    args = [
        sys.executable,
        "-m",
        "e2e.mockhorovod",
        "-np",
        "2",
        "--min-np",
        "1",
        "--host-discovery-script",
        str(rig.discovery),
        "--rsh-agent",
        str(rsh),
        "--discovery-interval",
        "0.1",
        "--stop-grace",
        "2",
        "--log-file",
        str(rig.tmp / "events.jsonl"),
        "--rank-start-seconds",
        "0.3",
        *extra,
    ]
    return subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_file_events(
    log: Path, predicate: Callable[[list[Event]], bool], what: str, timeout: float = 8.0
) -> list[Event]:
    deadline = time.monotonic() + timeout
    while True:
        records = ev.read_events(log)
        if predicate(records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {[r['event'] for r in records]}")
        time.sleep(0.05)


def test_driver_process_with_real_ranks_and_kill_emulation(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    kubectl = fake_kubectl(tmp_path)
    set_pod(tmp_path, "w-0")
    set_pod(tmp_path, "w-1")
    rig.set_hosts("w-0:1", "w-1:1")
    stop = tmp_path / "stop"
    proc = driver_process(
        rig,
        "--stop-file",
        str(stop),
        "--rank-kubeconfig",
        str(tmp_path / "kubeconfig"),
        "--rank-namespace",
        "team-a",
        "--rank-kubectl",
        str(kubectl),
        "--rank-poll-interval",
        "0.1",
    )
    log = tmp_path / "events.jsonl"
    try:
        wait_file_events(
            log, lambda r: len(ev.of_kind(r, ev.RANK_RUNNING)) == 2, "two running ranks"
        )
        calls = tmp_path / "pods" / "calls"
        deadline = time.monotonic() + 5.0
        while "--namespace team-a get pod w-1 -o json" not in calls.read_text():
            assert time.monotonic() < deadline, calls.read_text()
            time.sleep(0.05)

        # w-1's pod reaches the end of its grace period while the host is still listed:
        # the rank is killed as the real one would be, and the driver takes it as Horovod
        # does.
        set_pod(tmp_path, "w-1", deletionTimestamp="2025-01-01T00:00:00Z")
        records = wait_file_events(
            log, lambda r: bool(ev.of_kind(r, ev.HOST_BLACKLISTED)), "w-1 blacklisted"
        )
        (failed,) = ev.of_kind(records, ev.RANK_FAILED)
        assert (failed["host"], failed["exit_code"]) == ("w-1", KILLED_EXIT_CODE)
        assert "grace period over" in failed["stderr"]

        stop.touch()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    records = ev.read_events(log)
    assert ev.parse_events(out) == records  # stdout carries the same lines
    (exit_event,) = ev.of_kind(records, ev.DRIVER_EXIT)
    assert exit_event["reason"] == "stop_file"
    assert (exit_event["failures"], exit_event["blacklisted_hosts"]) == (1, ["w-1"])
    assert RANK_STARTED_MARKER in err
    assert "Traceback" not in err


def test_driver_process_stops_ranks_on_sigterm(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.set_hosts("w-0:2")
    proc = driver_process(rig, "--network-interface", "eth0")
    log = tmp_path / "events.jsonl"
    try:
        records = wait_file_events(
            log, lambda r: len(ev.of_kind(r, ev.RANK_RUNNING)) == 2, "two running ranks"
        )
        work_dir = Path(ev.of_kind(records, ev.DRIVER_STARTED)[0]["work_dir"])
        assert work_dir.is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 1  # horovodrun exits 1 on SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    records = ev.read_events(log)
    assert ev.of_kind(records, ev.STOP_REQUESTED)[0]["reason"] == "sigterm"
    assert len(ev.of_kind(records, ev.RANK_STOPPED)) == 2
    assert ev.of_kind(records, ev.DRIVER_EXIT)[0]["exit_code"] == 1
    assert not work_dir.exists()  # its own temp dir is cleaned up
    pids = [int(line.rsplit("pid=", 1)[1]) for line in err.splitlines() if "pid=" in line]
    assert len(pids) == 2
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text()


# -- the rank's kill emulation -----------------------------------------------------------


GRACE_END = "2026-01-01T00:00:30Z"
GRACE_END_TS = datetime.fromisoformat(GRACE_END).timestamp()


def test_judge_pod() -> None:
    now = GRACE_END_TS - 20
    alive = json.dumps({"metadata": {"uid": "u1"}, "status": {"phase": "Running"}})
    assert judge_pod(0, alive, "", None, now) == judge_pod(0, alive, "", "u1", now)
    assert judge_pod(0, alive, "", None, now).state == "alive"
    assert judge_pod(0, alive, "", "u0", now).state == "gone"  # same name, new pod
    gone = 'Error from server (NotFound): pods "w-1" not found'
    assert judge_pod(1, "", gone, "u1", now).state == "gone"
    assert judge_pod(0, "", "", "u1", now).state == "gone"
    failed = json.dumps({"metadata": {"uid": "u1"}, "status": {"phase": "Failed"}})
    assert judge_pod(0, failed, "", "u1", now).state == "gone"
    assert judge_pod(1, "", "Unable to connect to the server", "u1", now).state == "unknown"
    assert judge_pod(0, "not json", "", "u1", now).state == "unknown"


def test_judge_pod_lets_a_terminating_pod_live_until_its_grace_period_ends() -> None:
    deleting = json.dumps(
        {"metadata": {"uid": "u1", "deletionTimestamp": GRACE_END}, "status": {"phase": "Running"}}
    )
    during = judge_pod(0, deleting, "", "u1", GRACE_END_TS - 1)
    assert (during.state, during.uid) == ("terminating", "u1")
    assert judge_pod(0, deleting, "", "u1", GRACE_END_TS).state == "gone"  # the SIGKILL
    finished = json.loads(deleting)
    finished["status"]["phase"] = "Failed"
    assert judge_pod(0, json.dumps(finished), "", "u1", GRACE_END_TS - 1).state == "gone"


def test_check_pod_with_fake_kubectl(tmp_path: Path) -> None:
    kubectl = str(fake_kubectl(tmp_path))
    set_pod(tmp_path, "w-0")
    verdict = check_pod(kubectl, "/k", "ns", "w-0", None, 5.0)
    assert (verdict.state, verdict.uid) == ("alive", "uid-w-0")
    (tmp_path / "pods" / "w-0.err").write_text("Unable to connect to the server\n")
    assert check_pod(kubectl, "/k", "ns", "w-0", "uid-w-0", 5.0).state == "unknown"
    (tmp_path / "pods" / "w-0.err").unlink()
    (tmp_path / "pods" / "w-0.json").unlink()
    assert check_pod(kubectl, "/k", "ns", "w-0", "uid-w-0", 5.0).state == "gone"
    assert check_pod(str(tmp_path / "missing"), None, None, "w-0", None, 5.0).state == "unknown"


def test_local_stop_reasons(tmp_path: Path) -> None:
    stop = tmp_path / "stop-1"
    assert local_stop_reason(stop, os.getpid()) is None
    stop.touch()
    assert local_stop_reason(stop, os.getpid()) == "stop file present"
    assert local_stop_reason(tmp_path / "gone" / "stop", None) == "driver work dir removed"
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert "gone" in (local_stop_reason(tmp_path / "stop-2", dead.pid) or "")


def rank_process(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "e2e.mockhorovod.rank", "--host", "w-0", "--rank-id", "r1", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def still_running_then_terminated(
    proc: subprocess.Popen[str], settle: float, after: Callable[[], bool] = lambda: True
) -> str:
    """Asserts the rank is still alive ``settle`` s after ``after`` holds and exits 0 on
    SIGTERM; its stderr. ``after`` lets a loaded machine start the rank's checks first."""
    try:
        wait_marker(proc)
        wait_until(after, 10, "the rank to get going")
        time.sleep(settle)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    return err


def wait_marker(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(RANK_STARTED_MARKER)


def test_rank_exits_137_when_its_pod_goes(tmp_path: Path) -> None:
    kubectl = fake_kubectl(tmp_path)
    set_pod(tmp_path, "w-0")
    args = ["--kubeconfig", "/k", "--kubectl", str(kubectl), "--poll-interval", "0.05"]
    proc = rank_process(tmp_path, *args)
    try:
        wait_marker(proc)
        time.sleep(0.3)
        assert proc.poll() is None  # alive pod: keeps "training"
        (tmp_path / "pods" / "w-0.json").unlink()  # pod deleted: kubectl says NotFound
        assert proc.wait(timeout=5) == KILLED_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert "pod not found" in err


def test_rank_outlives_its_terminating_pod_until_the_grace_period_ends(tmp_path: Path) -> None:
    kubectl = fake_kubectl(tmp_path)
    set_pod(tmp_path, "w-0")
    args = ["--kubeconfig", "/k", "--kubectl", str(kubectl), "--poll-interval", "0.05"]
    proc = rank_process(tmp_path, *args)
    try:
        wait_marker(proc)
        calls = (tmp_path / "pods" / "calls").read_text()
        # Marked before it reported running, so KWOK keeps a deleted pod while it runs.
        assert "annotate pod w-0 kwok.mpijob-elastic.io/rank-r1=running --overwrite" in calls
        grace_end = datetime.now(UTC) + timedelta(seconds=2)
        set_pod(tmp_path, "w-0", deletionTimestamp=grace_end.isoformat())
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # terminating, still training
        assert proc.wait(timeout=10) == KILLED_EXIT_CODE
        assert datetime.now(UTC) >= grace_end
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert "still training" in err
    assert "grace period over" in err


UNMARK = "annotate pod w-0 kwok.mpijob-elastic.io/rank-r1-"


@pytest.mark.parametrize("how", ["leaves", "sigkill"])
def test_rank_takes_its_mark_off_its_terminating_pod_however_it_ends(
    tmp_path: Path, how: str
) -> None:
    kubectl = fake_kubectl(tmp_path)
    grace_end = datetime.now(UTC) + timedelta(seconds=60)
    set_pod(tmp_path, "w-0", deletionTimestamp=grace_end.isoformat())
    alive = tmp_path / "alive-r1"
    args = ["--kubeconfig", "/k", "--kubectl", str(kubectl), "--poll-interval", "0.05"]
    proc = rank_process(tmp_path, *args, "--alive-file", str(alive))
    if how == "leaves":
        # Its first look at the pod says it is terminating: wait for that look, so a slow
        # start cannot let the SIGTERM come first.
        def looked() -> bool:
            calls = tmp_path / "pods" / "calls"
            return calls.exists() and "get pod w-0 -o json" in calls.read_text()

        assert "still training" in still_running_then_terminated(proc, 0.3, looked)
    else:
        # What kwok's exec does to the command when the kubectl exec client goes away.
        try:
            wait_marker(proc)
            assert UNMARK not in (tmp_path / "pods" / "calls").read_text()
            proc.kill()
        finally:
            proc.communicate()
    calls = tmp_path / "pods" / "calls"
    wait_until(lambda: UNMARK in calls.read_text(), 10, "the mark taken off")
    assert not alive.exists()  # nor is its alive file left behind


def test_rank_crashes_when_its_crash_file_appears(tmp_path: Path) -> None:
    rank_id = f"r{uuid.uuid4().hex}"
    crash = Path(CRASH_FILE.format(rank_id=rank_id))
    rank = [sys.executable, "-m", "e2e.mockhorovod.rank", "--host", "w-0", "--rank-id", rank_id]
    proc = subprocess.Popen(
        [*rank, "--poll-interval", "0.05"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_marker(proc)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.3)
        crash.touch()
        assert proc.wait(timeout=5) == CRASH_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
        crash.unlink(missing_ok=True)
    assert "crashing on purpose" in err
    assert not crash.exists()  # it cleans up after itself


def exits_removed_at_its_commit(
    proc: subprocess.Popen[str], notice: Callable[[], None], interval: float
) -> str:
    """Starts the rank, gives it the removal notice, and asserts it exits 134 within about
    a commit interval (not at its next poll, and not never); returns its stderr."""
    try:
        wait_marker(proc)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.3)
        notice()
        noticed = time.monotonic()
        assert proc.wait(timeout=interval + 3) == REMOVED_EXIT_CODE
        assert time.monotonic() - noticed < interval + 1.5  # slack for a loaded machine
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert REMOVED_MESSAGE in err
    return err


def test_rank_exits_134_at_its_commit_when_its_alive_file_is_removed(tmp_path: Path) -> None:
    alive = tmp_path / "alive-r1"
    args = ["--alive-file", str(alive), "--poll-interval", "0.05", "--commit-interval", "0.5"]
    proc = rank_process(tmp_path, *args)
    # What the driver's notice does through the remote shell.
    exits_removed_at_its_commit(proc, alive.unlink, 0.5)


def test_rank_learns_removal_only_at_its_commit(tmp_path: Path) -> None:
    """A removal mark in the local stop file is read at the commit, not at the next poll:
    with the mark there from the start, polls every 0.05 s and commits 1.5 s apart, the rank
    cannot exit before its first commit, which is 1.5 s after it was started at the
    earliest. (Bounding from the process start rather than from a mark written after the
    started line keeps this true however late a loaded machine reads that line.)"""
    stop = tmp_path / "stop-r1"
    stop.write_text(REMOVED_MARK)
    args = ["--stop-file", str(stop), "--poll-interval", "0.05", "--commit-interval", "1.5"]
    launched = time.monotonic()
    proc = rank_process(tmp_path, *args)
    try:
        wait_marker(proc)
        assert proc.wait(timeout=10) == REMOVED_EXIT_CODE
        assert time.monotonic() - launched >= 1.5
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert REMOVED_MESSAGE in err


def test_rank_ignores_transient_kubectl_errors(tmp_path: Path) -> None:
    kubectl = fake_kubectl(tmp_path)
    set_pod(tmp_path, "w-0")
    (tmp_path / "pods" / "w-0.err").write_text("Unable to connect to the server\n")
    args = ["--kubeconfig", "/k", "--kubectl", str(kubectl), "--poll-interval", "0.05"]
    err = still_running_then_terminated(rank_process(tmp_path, *args), settle=0.4)
    assert "still running" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("how", ["stop_file", "driver_gone", "sigterm"])
def test_rank_exits_quietly_when_let_go(tmp_path: Path, how: str) -> None:
    stop = tmp_path / "stop-r1"
    driver = subprocess.Popen(["sleep", "30"])
    proc = rank_process(
        tmp_path,
        "--stop-file",
        str(stop),
        "--driver-pid",
        str(driver.pid),
        "--poll-interval",
        "0.05",
    )
    try:
        wait_marker(proc)
        time.sleep(0.2)
        assert proc.poll() is None
        if how == "stop_file":
            stop.touch()
        elif how == "driver_gone":
            driver.kill()
            driver.wait()
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        for p in (proc, driver):
            if p.poll() is None:
                p.kill()
        _, err = proc.communicate()
        driver.wait()
    assert "Traceback" not in err


def test_rank_on_another_machine_ignores_local_checks(tmp_path: Path) -> None:
    """A stop file whose directory does not exist here means the driver runs elsewhere:
    the rank must not take the missing directory, or a foreign pid, as its cue to exit."""
    proc = rank_process(
        tmp_path,
        "--stop-file",
        str(tmp_path / "elsewhere" / "stop-r1"),
        "--driver-pid",
        "999999",
        "--poll-interval",
        "0.05",
    )
    still_running_then_terminated(proc, settle=0.3)


# -- the real driver's rules (issue 20 §1b): what the mock refuses because Horovod does ---


def slow_start_template(rig: Rig, host: str, seconds: float) -> str:
    """The fake rank, which on ``host`` takes ``seconds`` before it is up (hvd.init)."""
    fake = rig.tmp / "fake_rank.sh"
    return (
        f"if [ {{host}} = {host} ]; then sleep {seconds}; fi; "
        f"exec /bin/sh {shlex.quote(str(fake))} {{host}} {{stop_file}} "
        f"{shlex.quote(str(rig.tmp))} {{local_rank}}"
    )


async def world_up(rig: Rig, count: int = 1, within: float = 5.0) -> None:
    await wait_for(
        rig, lambda: len(rig.of(ev.RESET_COMPLETED)) >= count, f"world {count} up", within
    )


async def test_rule1_a_reset_onto_no_previous_host_ends_the_job(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1)
    await world_up(rig)
    rig.set_hosts("c:1", "d:1")  # every worker relocated in one rewrite
    assert await asyncio.wait_for(run.task, 5) == 1
    (refused,) = rig.of(ev.RESET_FAILED)
    assert refused["error"] == (
        "RuntimeError: No hosts from previous set remaining, unable to broadcast state."
    )
    assert (refused["previous"], refused["hosts"]) == (["a", "b"], ["c", "d"])
    (failed,) = rig.of(ev.JOB_FAILED)
    assert failed["line"] == "failed to activate new hosts -> stop running"
    assert rig.of(ev.RANK_STARTED, host="c") == []  # no rank ever started on the new hosts
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "no_previous_hosts"


async def test_rule1_a_reset_keeping_one_previous_host_goes_on(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1)
    await world_up(rig)
    rig.set_hosts("b:1", "c:1", "d:1")
    await wait_for(rig, lambda: running_on(rig, "d") == 1, "rank on d")
    assert rig.of(ev.RESET_FAILED) == []
    assert await run.finish() == 0
    assert_no_failures(rig)


async def test_rule2_a_change_during_a_reset_is_lost_until_the_next_change(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, rank_command=slow_start_template(rig, "c", 1.5))
    await world_up(rig)
    rig.set_hosts("a:1", "b:1", "c:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STARTED, host="c")), "c's rank spawned")
    rig.set_hosts("a:1", "c:1")  # b unlisted while the ranks wait for c in the rendezvous
    await wait_for(rig, lambda: bool(rig.of(ev.HOSTS_UPDATE_LOST)), "the lost notice")
    await world_up(rig, 2)
    commits = run.driver.commits
    await asyncio.sleep(1.5)
    assert run.driver.commits >= commits + 3  # training went on...
    assert rig.of(ev.RANK_UNASSIGNED, host="b") == []  # ...with b, no longer listed
    assert len(rig.of(ev.RESET)) == 1  # nothing re-sent

    rig.set_hosts("a:1", "c:1", "d:1")  # an unrelated change: now the reset drops b
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STOPPED, host="b")), "b let go")
    assert rig.of(ev.RANK_UNASSIGNED, host="b")[0]["reason"] == "host_removed"
    assert await run.finish() == 0


async def test_rule3_a_new_rank_slower_than_the_gloo_timeout_ends_the_job(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    template = slow_start_template(rig, "c", 3.0)
    run = await start(rig, np=2, min_np=1, rank_command=template, gloo_timeout=1.0)
    await world_up(rig)
    rig.set_hosts("a:1", "b:1", "c:1")
    assert await asyncio.wait_for(run.task, 8) == 1
    (timeout,) = rig.of(ev.GLOO_TIMEOUT)
    (c_rank,) = rig.of(ev.RANK_STARTED, host="c")
    assert timeout["missing"] == [c_rank["rank_id"]]
    aborted = {e["host"] for e in rig.of(ev.RANK_FAILED) if e.get("gloo_timeout")}
    assert aborted == {"a", "b", "c"}  # every rank of the new world aborts while assigned
    (failed,) = rig.of(ev.JOB_FAILED)
    assert failed["line"] == "failure count == 3 -> stop running"


async def test_rule3_a_new_rank_refused_ends_the_job_at_the_gloo_timeout(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, gloo_timeout=1.0)
    await world_up(rig)
    rig.forbid.write_text("c\n")  # listed, but its exec is refused (or its pod is gone)
    rig.set_hosts("a:1", "b:1", "c:1")
    assert await asyncio.wait_for(run.task, 8) == 1
    assert rig.of(ev.EXEC_FAILED, host="c")
    assert {e["host"] for e in rig.of(ev.RANK_FAILED)} == {"a", "b", "c"}
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "all_failed"


async def test_rule3_a_new_rank_within_the_gloo_timeout_joins(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    template = slow_start_template(rig, "c", 0.8)
    run = await start(rig, np=2, min_np=1, rank_command=template, gloo_timeout=3.0)
    await world_up(rig)
    rig.set_hosts("a:1", "b:1", "c:1")
    await world_up(rig, 2)
    (completed,) = rig.of(ev.RESET_COMPLETED)[1:]
    assert completed["seconds"] >= 0.8
    assert await run.finish() == 0
    assert_no_failures(rig)


async def test_rule4_below_min_np_every_rank_waits_in_the_reset(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1", "c:1")
    run = await start(rig, np=3, min_np=2, elastic_timeout=10.0)
    await world_up(rig)
    rig.set_hosts("a:1")  # below --min-np
    await wait_for(rig, lambda: bool(rig.of(ev.RESET_WAITING)), "the reset waiting")
    commits = run.driver.commits
    await asyncio.sleep(1.5)
    assert run.driver.commits == commits  # no training
    assert rig.of(ev.RANK_UNASSIGNED) == []  # the removed ranks wait too
    assert rig.of(ev.RANK_STOPPED) == []

    rig.set_hosts("a:1", "d:1")  # slots back: the reset goes on from the hosts of now
    await wait_for(rig, lambda: running_on(rig, "d") == 1, "rank on d")
    gone = {e["host"] for e in rig.of(ev.RANK_UNASSIGNED)}
    assert gone == {"b", "c"}
    assert await run.finish() == 0
    assert_no_failures(rig)


async def test_rule4_below_min_np_a_removed_rank_killed_meanwhile_is_a_failure(
    rig: Rig,
) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=2, elastic_timeout=0.8)
    await world_up(rig)
    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RESET_WAITING)), "the reset waiting")
    rig.kill("b")  # a drain's deadline: b's rank never left, so this kills an assigned rank
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_FAILED, host="b")), "b failed")
    assert await asyncio.wait_for(run.task, 5) == 1
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "elastic_timeout"


async def test_rule5_every_rank_failing_at_once_ends_the_job(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, commit_interval=1.0)
    await world_up(rig)
    await after_commit(rig, run)
    rig.kill("a")
    rig.kill("b")
    assert await asyncio.wait_for(run.task, 5) == 1
    (failed,) = rig.of(ev.JOB_FAILED)
    assert failed["line"] == "failure count == 2 -> stop running"
    assert rig.of(ev.HOST_BLACKLISTED) == []  # it stopped before blacklisting


async def test_rule5_every_recorded_slot_blacklisted_ends_the_job(rig: Rig) -> None:
    rig.set_hosts("a:2")
    run = await start(rig, np=2, min_np=1)
    await world_up(rig)
    rig.kill("a", 0)  # one slot of the only host
    assert await asyncio.wait_for(run.task, 5) == 1
    (black,) = rig.of(ev.HOST_BLACKLISTED)
    assert black["host"] == "a"
    (failed,) = rig.of(ev.JOB_FAILED)
    assert failed["line"] == "blacklisted slots count == 2 -> stop running"


async def test_rule6_sigterm_exits_1(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2)
    await world_up(rig)
    run.driver.request_stop("sigterm")
    assert await asyncio.wait_for(run.task, 10) == 1
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "sigterm"


async def test_rule7_without_a_network_interface_one_host_never_starts(rig: Rig) -> None:
    rig.set_hosts("a:2")
    run = await start(rig, np=2, min_np=1, network_interface=None, elastic_timeout=1.0)
    assert await asyncio.wait_for(run.task, 5) == 1
    (waiting,) = rig.of(ev.WAITING_FOR_HOSTS)
    assert (waiting["needed"], waiting["available"]) == (2, 1)
    assert rig.of(ev.RANK_STARTED) == []
    assert rig.of(ev.ELASTIC_TIMEOUT)[0]["phase"] == "start"


async def test_rule7_every_host_is_probed_through_the_remote_shell_first(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, network_interface=None)
    await world_up(rig)
    (probe,) = rig.of(ev.PROBE_STARTED)
    (probed,) = rig.of(ev.PROBE_DONE)
    assert probe["hosts"] == ["a", "b"]
    first_rank = rig.of(ev.RANK_STARTED)[0]
    assert index_of(rig, probe) < index_of(rig, probed) < index_of(rig, first_rank)
    assert len(rig.of(ev.RANK_STARTED)) == 2  # the probe's shells are not ranks
    assert await run.finish() == 0
    assert_no_failures(rig)


async def test_rule7_a_host_arriving_after_the_start_deadline_fails_the_start(rig: Rig) -> None:
    rig.set_hosts("a:1")
    run = await start(rig, np=2, min_np=1, network_interface=None, start_timeout=1.0)
    await asyncio.sleep(1.3)
    rig.set_hosts("a:1", "b:1")
    assert await asyncio.wait_for(run.task, 5) == 1
    assert rig.of(ev.START_FAILED)[0]["failed"] == ["a", "b"]
    assert rig.of(ev.RANK_STARTED) == []


async def test_rule7_a_refused_probe_fails_the_start(rig: Rig) -> None:
    rig.forbid.write_text("b\n")
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, network_interface=None, start_timeout=1.5)
    assert await asyncio.wait_for(run.task, 5) == 1
    assert rig.of(ev.START_FAILED)[0]["failed"] == ["b"]
    assert rig.of(ev.RANK_STARTED) == []


async def test_rule8_a_removed_rank_exiting_after_its_name_is_reassigned_fails_it(
    rig: Rig,
) -> None:
    # A rank that outlives its removal (here until the safety-net signal) exits after its
    # host name was listed and assigned again: Horovod judges the exit by (host, slot).
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, rank_command=stubborn_template(rig), stop_grace=2.0)
    await world_up(rig)
    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_UNASSIGNED, host="b")), "b unassigned")
    rig.set_hosts("a:1", "b:1")  # the name is reused by a new pod
    await wait_for(rig, lambda: len(rig.of(ev.RANK_STARTED, host="b")) == 2, "b assigned again")
    await wait_for(rig, lambda: bool(rig.of(ev.HOST_BLACKLISTED, host="b")), "b blacklisted", 8)
    (failed,) = rig.of(ev.RANK_FAILED, host="b")
    assert failed["reused_slot"] is True
    assert failed["rank_id"] == rig.of(ev.RANK_UNASSIGNED, host="b")[0]["rank_id"]
    assert await run.finish() == 0


async def test_rule8_host_updates_act_only_at_a_commit(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, commit_interval=2.0)
    await world_up(rig)
    await after_commit(rig, run)
    rig.set_hosts("a:1")
    await wait_for(rig, lambda: bool(rig.of(ev.HOST_REMOVED, host="b")), "b unlisted")
    await asyncio.sleep(0.8)
    assert rig.of(ev.RANK_UNASSIGNED) == []
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_UNASSIGNED, host="b")), "the commit", 3)
    assert await run.finish() == 0
    assert_no_failures(rig)


# -- issue 30: slow rank starts and the training's commit marker ---------------------------


def real_ranks(rig: Rig, start_seconds: float, **overrides: Any) -> dict[str, Any]:
    """Driver settings for the real rank (e2e/mockhorovod/rank.py) on every slot."""
    settings: dict[str, Any] = {
        "rank_command": DEFAULT_RANK_COMMAND,
        "rank_poll_interval": 0.1,
        "rank_start_seconds": start_seconds,
    }
    return settings | overrides


# kubexec.sh into "pods" of their own: the command runs in <pods>/<pod>, so a relative path
# in it names that pod's file, which the driver cannot see from where it runs.
POD_RSH = """#!/bin/sh
POD_NAME=$1
shift
mkdir -p {pods}/"$POD_NAME" && cd {pods}/"$POD_NAME" && exec /bin/sh -c "$*"
"""


def ranks_in_pods(rig: Rig, start_seconds: float, slow_host: str, extra: float) -> dict[str, Any]:
    """Real ranks, each in its own "pod" directory (a relative alive file), so that the
    driver reaches their files only through the remote shell, as in a real container;
    ``slow_host``'s rank starts ``extra`` seconds later than the others."""
    pods = rig.tmp / "pods"
    rsh = write_script(rig.tmp / "pod_rsh.sh", POD_RSH.format(pods=shlex.quote(str(pods))))
    template = (
        f"if [ {{host}} = {slow_host} ]; then sleep {extra}; fi; "
        "exec env PYTHONPATH={repo} {python} -m e2e.mockhorovod.rank {rank_args}"
    )
    return real_ranks(
        rig,
        start_seconds,
        rsh_agent=str(rsh),
        rank_command=template,
        rank_alive_file="alive-{rank_id}",
    )


def rank_of(rig: Rig, host: str, event: str = ev.RANK_RUNNING) -> Event:
    (record,) = rig.of(event, host=host)
    return record


async def test_issue30_a_slow_start_keeps_the_reset_open_and_a_change_meanwhile_is_lost(
    rig: Rig,
) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, **real_ranks(rig, 1.5))
    await world_up(rig, within=15)
    rig.set_hosts("a:1", "b:1", "c:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STARTED, host="c")), "c's rank spawned")
    rig.set_hosts("a:1", "c:1")  # b unlisted while c's rank is still starting
    await wait_for(rig, lambda: bool(rig.of(ev.HOSTS_UPDATE_LOST)), "the lost notice")
    await world_up(rig, 2, within=15)
    c_started, c_joined = rank_of(rig, "c", ev.RANK_STARTED), rank_of(rig, "c")
    (lost,) = rig.of(ev.HOSTS_UPDATE_LOST)
    assert c_started["ts"] < lost["ts"] < c_joined["ts"]  # inside c's start
    assert c_joined["ts"] - c_started["ts"] >= 1.5
    completed = rig.of(ev.RESET_COMPLETED)[1]
    assert completed["seconds"] >= 1.5
    assert completed["ranks"] == [c_started["rank_id"]]
    commits = run.driver.commits
    await asyncio.sleep(1.2)
    assert run.driver.commits >= commits + 2  # training went on...
    assert rig.of(ev.RANK_UNASSIGNED, host="b") == []  # ...with b, no longer listed
    assert len(rig.of(ev.RESET)) == 1  # nothing re-sent
    assert await run.finish() == 0
    assert_no_failures(rig)


def markers_by_rank(rig: Rig) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in rig.of(ev.COMMIT_MARKER_PRINTED):
        counts[record["rank_id"]] = counts.get(record["rank_id"], 0) + 1
    return counts


async def test_issue30_the_marker_comes_once_per_reset_after_the_slowest_new_rank_joined(
    rig: Rig,
) -> None:
    rig.set_hosts("a:1", "b:1")
    # d starts 3 s after c, so that c has joined well before d even when the machine's
    # load stretches c's start (0.96 s apart once, with 1.5 s between them).
    run = await start(rig, np=2, min_np=1, **ranks_in_pods(rig, 0.5, "d", 3.0))
    await world_up(rig, within=15)
    await wait_for(rig, lambda: len(markers_by_rank(rig)) == 2, "the first ranks' markers", 10)
    rig.set_hosts("a:1", "b:1", "c:1", "d:1")  # c starts in 0.5 s, d in 3.5 s
    await wait_for(rig, lambda: len(markers_by_rank(rig)) == 4, "c's and d's markers", 15)
    c_marker, d_marker = (rank_of(rig, h, ev.COMMIT_MARKER_PRINTED) for h in "cd")
    completed = rig.of(ev.RESET_COMPLETED)[1]
    assert rank_of(rig, "c")["ts"] < rank_of(rig, "d")["ts"] - 1.0  # c joined early...
    assert c_marker["ts"] > completed["ts"] >= rank_of(rig, "d")["ts"]  # ...printed after d
    requested = rig.of(ev.COMMIT_MARKER_REQUESTED)
    assert [r["resets"] for r in requested] == [[0], [completed["commit"]]]
    assert sorted(requested[1]["hosts"]) == ["c", "d"]
    assert requested[1]["commit"] > completed["commit"]
    for marker in (c_marker, d_marker):
        assert marker["reset"] == completed["commit"]
        assert marker["requested_commit"] == requested[1]["commit"]

    rig.set_hosts("a:1", "b:1", "c:1", "d:1", "e:1")  # another reset: only e is new
    await wait_for(rig, lambda: len(markers_by_rank(rig)) == 5, "e's marker", 15)
    await after_commit(rig, run)
    await after_commit(rig, run)
    assert set(markers_by_rank(rig).values()) == {1}  # once per rank and reset
    assert await run.finish() == 0
    assert_no_failures(rig)
    # The notices went through the remote shell (the files are the "pods'" own), and the
    # ranks left nothing behind.
    assert [p.name for p in (rig.tmp / "pods").glob("*/*")] == []


def rank_files(rig: Rig) -> set[tuple[bool, bool]]:
    """Whether each running rank's alive file and reset file exist (the default paths)."""
    found = set()
    for rank in rig.of(ev.RANK_RUNNING):
        alive = Path(f"/tmp/mockhorovod-rank-{rank['rank_id']}")
        found.add((alive.exists(), Path(f"{alive}{RESET_FILE_SUFFIX}").exists()))
    return found


def crash_rank(rank_id: str) -> Path:
    crash = Path(CRASH_FILE.format(rank_id=rank_id))
    crash.touch()
    return crash


async def test_issue30_no_marker_without_the_hook(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, **real_ranks(rig, 0.3, commit_marker=False))
    await world_up(rig, within=15)
    rig.set_hosts("a:1", "b:1", "c:1")
    await world_up(rig, 2, within=15)
    for _ in range(3):
        await after_commit(rig, run)
    assert rank_files(rig) == {(True, False)}  # alive files, and no reset file
    assert await run.finish() == 0
    assert rig.of(ev.COMMIT_MARKER_REQUESTED, ev.COMMIT_MARKER_PRINTED) == []
    assert rig.of(ev.DRIVER_STARTED)[0]["commit_marker"] is False


async def test_issue30_a_start_longer_than_the_gloo_timeout_aborts(rig: Rig) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, gloo_timeout=1.0, **real_ranks(rig, 4.0))
    assert await asyncio.wait_for(run.task, 10) == 1
    (timeout,) = rig.of(ev.GLOO_TIMEOUT)
    assert sorted(timeout["missing"]) == sorted(r["rank_id"] for r in rig.of(ev.RANK_STARTED))
    assert {e["host"] for e in rig.of(ev.RANK_FAILED) if e.get("gloo_timeout")} == {"a", "b"}
    assert rig.of(ev.JOB_FAILED)[0]["line"] == "failure count == 2 -> stop running"
    assert rig.of(ev.RANK_RUNNING, ev.COMMIT_MARKER_REQUESTED, ev.COMMIT_MARKER_PRINTED) == []


async def test_issue30_a_new_rank_crashing_in_its_start_aborts_at_the_gloo_timeout(
    rig: Rig,
) -> None:
    rig.set_hosts("a:1", "b:1")
    run = await start(rig, np=2, min_np=1, gloo_timeout=4.0, **real_ranks(rig, 2.0))
    await world_up(rig, within=15)
    rig.set_hosts("a:1", "b:1", "c:1")
    await wait_for(rig, lambda: bool(rig.of(ev.RANK_STARTED, host="c")), "c's rank spawned")
    crash = crash_rank(rank_of(rig, "c", ev.RANK_STARTED)["rank_id"])
    try:  # before its hvd.init: the others wait for it in Gloo
        assert await asyncio.wait_for(run.task, 15) == 1
    finally:
        crash.unlink(missing_ok=True)
    (failed_c,) = rig.of(ev.RANK_FAILED, host="c")
    assert (failed_c["exit_code"], failed_c["exec_refused"]) == (CRASH_EXIT_CODE, True)
    assert rig.of(ev.RANK_RUNNING, host="c") == []
    assert rig.of(ev.GLOO_TIMEOUT)[0]["missing"] == [failed_c["rank_id"]]
    aborted = {e["host"] for e in rig.of(ev.RANK_FAILED) if e.get("gloo_timeout")}
    assert aborted == {"a", "b"}  # the reset's other ranks abort while assigned
    assert rig.of(ev.DRIVER_EXIT)[0]["reason"] == "all_failed"


def rank_in_start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], float]:
    """A rank with a 5 s start and the kill emulation, once its loop polls its pod."""
    kubectl = fake_kubectl(tmp_path)
    set_pod(tmp_path, "w-0")
    args = ["--kubeconfig", "/k", "--kubectl", str(kubectl), "--poll-interval", "0.05"]
    launched = time.monotonic()
    proc = rank_process(tmp_path, *args, "--start-seconds", "5", *extra)
    calls = tmp_path / "pods" / "calls"
    wait_until(
        lambda: calls.exists() and "get pod w-0 -o json" in calls.read_text(), 10, "a pod check"
    )
    return proc, launched


@pytest.mark.parametrize(
    ("how", "code"),
    [("pod_gone", KILLED_EXIT_CODE), ("crash", CRASH_EXIT_CODE), ("stop_file", 0), ("sigterm", 0)],
)
def test_rank_in_its_start_reacts_as_it_does_later(tmp_path: Path, how: str, code: int) -> None:
    stop = tmp_path / "stop-r1"
    alive = tmp_path / "alive-r1"
    extra = ["--stop-file", str(stop), "--alive-file", str(alive), "--commit-marker"]
    proc, launched = rank_in_start(tmp_path, *extra)
    crash = Path(CRASH_FILE.format(rank_id="r1"))
    try:
        if how == "pod_gone":
            (tmp_path / "pods" / "w-0.json").unlink()
        elif how == "crash":
            crash.touch()
        elif how == "stop_file":
            stop.touch()
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == code
        assert time.monotonic() - launched < 5.0  # before its start was over
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
        crash.unlink(missing_ok=True)
    assert RANK_STARTED_MARKER not in out  # it never joined
    assert not alive.exists()
    assert "Traceback" not in err


def test_rank_joins_after_its_start_and_commits_when_its_reset_file_goes(tmp_path: Path) -> None:
    alive = tmp_path / "alive-r1"
    reset = Path(f"{alive}{RESET_FILE_SUFFIX}")
    args = ["--alive-file", str(alive), "--poll-interval", "0.05", "--commit-marker"]
    launched = time.monotonic()
    proc = rank_process(tmp_path, *args, "--start-seconds", "1")
    assert proc.stdout is not None
    try:
        wait_marker(proc)
        assert time.monotonic() - launched >= 1.0
        assert alive.exists()
        assert reset.exists()  # created before the start line: the driver may end it at once
        time.sleep(0.5)  # commits of its own print nothing: the reset is not known to end
        reset.unlink()  # the driver: a commit returned after the reset it joined
        assert proc.stdout.readline().strip() == COMMITTED_MARKER
        wait_until(reset.exists, 5, "the reset file back")
        time.sleep(0.3)
        reset.unlink()  # a later reset ended
        assert proc.stdout.readline().strip() == COMMITTED_MARKER
        wait_until(reset.exists, 5, "the reset file back")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    assert out == ""  # one marker per removal, none of its own
    assert not alive.exists()
    assert not reset.exists()
    assert "Traceback" not in err


def test_rank_without_the_hook_keeps_no_reset_file(tmp_path: Path) -> None:
    alive = tmp_path / "alive-r1"
    proc = rank_process(tmp_path, "--alive-file", str(alive), "--poll-interval", "0.05")
    still_running_then_terminated(proc, 0.3, alive.exists)
    assert list(tmp_path.iterdir()) == []
