"""The mock rank: what runs on one slot of a worker pod, started by the mock driver through
``kubexec.sh``.

On a real cluster a rank lives in its container: it sleeps until the driver stops it
(SIGTERM, exit 0), and a deleted pod's worker keeps it alive (the default worker command
waits for exec'd processes after SIGTERM) until it leaves or the grace period's SIGKILL
ends it. On KWOK a command run through ``kubectl exec`` is a local process of kwok's and
outlives its fake pod, so with ``--kubeconfig`` the rank *emulates* that kubelet:

* it marks its pod with the annotation ``kwok.mpijob-elastic.io/rank-<rank id>`` while it
  runs (a watcher process takes the mark off once the rank is gone, however it ends),
  which is how KWOK's ``pod-delete-after-grace`` stage (``hack/kwok/stages.yaml``)
  knows a process still runs in the container: such a pod stays Terminating until its
  ``deletionTimestamp`` (the end of its grace period), any other goes at once, as under
  the default worker command;
* it polls ``kubectl get pod <host> -o json`` and exits 137 (what a killed container
  reports) once the pod is gone (a force delete, or the stage at the end of the grace
  period), the grace period is over, the pod finished (phase Succeeded/Failed) or it was
  replaced by a new pod of the same name (uid changed). A pod that is merely terminating
  does not kill it: it keeps training, so the driver can let it go gracefully first.

The rank commits every ``--commit-interval`` seconds (Horovod's ``state.commit()``), and
that is where it learns that it has no assignment any more (rank -1, its host left
discovery, was blacklisted or lost slots): its ``--alive-file`` was removed by the driver
through the remote shell, or, on the driver's machine, its stop file holds the removal
mark. It then exits 134 with Horovod's "... has been removed from elastic job", an exit
the driver ignores. Until that commit it keeps running, and so does the remote shell
(``kubexec.sh <host> ...``) the driver started it through.

Ending a rank at the end of the job takes more than a signal, because killing the
``kubectl exec`` client does not necessarily end the remote command on KWOK. The driver
passes ``--stop-file`` (a per-rank file in the driver's work dir) and ``--driver-pid``;
when the stop file's directory exists here, the rank shares the driver's machine and also
exits 0 at once when the stop file appears empty, the directory vanishes (the driver
cleaned up) or the driver's pid is gone (the driver was killed). Where the directory does
not exist (a real pod) those checks are off: another machine's pid means nothing here.

A test makes a rank crash, on KWOK and in a real pod alike, by creating
``/tmp/mockhorovod-crash-<rank id>`` where the rank runs (``kubectl exec <worker> -- touch
...``): the rank then exits ``CRASH_EXIT_CODE`` while its host still holds it, which is a
Horovod failure.

A real rank starts slowly (import torch, CUDA, the data set: 10-60 s on a GPU node) before
``hvd.init`` returns, and only then has it joined. ``--start-seconds`` plays that: the rank
prints its start line that long after it was started, and meanwhile reacts to everything
above except the removal (it has no commit before it joined): its pod's deletion, the stop
file, the driver's death, the crash file and signals. A rank that dies in its start never
joined, which Horovod's other ranks wait for in Gloo.

With ``--commit-marker`` the rank is a training with the controller's commit hook
(``contrib/mpijob_elastic_notice.py``, ``report_commits``): it cannot see the driver's
commits, so the driver tells it when a commit has returned after the reset it joined by
removing ``<alive file>.reset`` (see ``RESET_FILE_SUFFIX``), and the rank then calls its
hooked ``state.commit()``, which prints the hook's marker on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from e2e.mockhorovod import (
    CRASH_EXIT_CODE,
    CRASH_FILE,
    KILLED_EXIT_CODE,
    RANK_ANNOTATION_PREFIX,
    RANK_STARTED_MARKER,
    REMOVED_EXIT_CODE,
    REMOVED_MARK,
    REMOVED_MESSAGE,
    RESET_FILE_SUFFIX,
)
from e2e.mockhorovod.hook import TrainingState, reporting_state

PodState = Literal["alive", "terminating", "gone", "unknown"]

# How often a persistent kubectl error is repeated on stderr; one line per poll would
# drown the launcher log when the API server is briefly away.
ERROR_REPORT_INTERVAL = 10.0
# How long a rank keeps trying to mark its pod, and its pause after a refusal.
MARK_SECONDS = 30.0
MARK_RETRY_PAUSE = 0.5


@dataclass(frozen=True)
class PodVerdict:
    """What one ``kubectl get pod`` said about the rank's pod.

    ``unknown`` (kubectl failed for another reason) never kills the rank: a flaky API
    server is not a deleted pod, and a false kill would be reported as a Horovod failure.
    """

    state: PodState
    reason: str
    uid: str | None = None


def _timestamp(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _read_pod(returncode: int, stdout: str, stderr: str) -> dict[str, Any] | PodVerdict:
    """The pod kubectl printed, or the verdict when it printed none."""
    if returncode != 0:
        if "NotFound" in stderr or "not found" in stderr:
            return PodVerdict("gone", "pod not found")
        return PodVerdict("unknown", f"kubectl exited {returncode}: {stderr.strip()[:300]}")
    if not stdout.strip():
        return PodVerdict("gone", "pod not found")  # kubectl get --ignore-not-found
    try:
        pod: Any = json.loads(stdout)
    except ValueError:
        return PodVerdict("unknown", "kubectl printed no JSON")
    if not isinstance(pod, dict):
        return PodVerdict("unknown", "kubectl printed no pod object")
    return pod


def judge_pod(
    returncode: int, stdout: str, stderr: str, known_uid: str | None, now: float
) -> PodVerdict:
    """Decides from kubectl's result whether the pod the rank runs in still exists.

    A terminating pod's ``deletionTimestamp`` is the end of its grace period, when a
    kubelet kills what still runs in the container; until then the rank lives on.
    """
    pod = _read_pod(returncode, stdout, stderr)
    if isinstance(pod, PodVerdict):
        return pod
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    uid = meta.get("uid") if isinstance(meta.get("uid"), str) else None
    phase = status.get("phase")
    deletion = meta.get("deletionTimestamp")
    if deletion and phase not in ("Succeeded", "Failed"):
        deadline = _timestamp(str(deletion))
        if deadline is not None and now >= deadline:
            return PodVerdict("gone", f"grace period over at {deletion}", uid)
        return PodVerdict("terminating", f"pod terminating, grace period ends at {deletion}", uid)
    if phase in ("Succeeded", "Failed"):
        return PodVerdict("gone", f"pod phase {phase}", uid)
    if known_uid is not None and uid is not None and uid != known_uid:
        return PodVerdict("gone", f"pod replaced (uid {known_uid} -> {uid})", uid)
    return PodVerdict("alive", f"pod phase {phase}", uid)


def check_pod(
    kubectl: str,
    kubeconfig: str | None,
    namespace: str | None,
    host: str,
    known_uid: str | None,
    timeout: float,
) -> PodVerdict:
    """Runs kubectl once and judges the result; never raises for kubectl's failures."""
    cmd = [kubectl]
    if kubeconfig:
        cmd += ["--kubeconfig", kubeconfig]
    if namespace:
        cmd += ["--namespace", namespace]
    cmd += ["get", "pod", host, "-o", "json"]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return PodVerdict("unknown", f"kubectl timed out after {timeout:g}s")
    except OSError as exc:
        return PodVerdict("unknown", f"cannot run {kubectl}: {exc}")
    return judge_pod(proc.returncode, proc.stdout, proc.stderr, known_uid, time.time())


def _annotate(args: argparse.Namespace, change: str, *extra: str) -> list[str]:
    cmd = [args.kubectl, "--kubeconfig", args.kubeconfig]
    if args.namespace:
        cmd += ["--namespace", args.namespace]
    return [*cmd, "annotate", "pod", args.host, change, *extra]


def mark_key(args: argparse.Namespace) -> str:
    return f"{RANK_ANNOTATION_PREFIX}{args.rank_id or os.getpid()}"


def mark_pod(args: argparse.Namespace) -> str | None:
    """Puts this rank's annotation on its pod; kubectl's complaint if that failed.

    The annotation is what tells KWOK a process still runs in the container (see the module
    docstring). A failure is reported, never fatal: an unmarked pod only goes at once when
    deleted, as it did before ranks were modelled. A kubelet knows of the process from its
    start, so the mark is worth waiting for: on a loaded machine one ``kubectl`` may take
    longer than ``--kubectl-timeout`` (the likely reason a CI run once waited 30 s for a
    growth step's marks), so it gets ``MARK_SECONDS`` and is tried again after a refusal
    other than the pod's absence.
    """
    cmd = _annotate(args, f"{mark_key(args)}=running", "--overwrite")
    deadline = time.monotonic() + max(MARK_SECONDS, args.kubectl_timeout)
    while True:
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=max(0.1, deadline - time.monotonic()),
                stdin=subprocess.DEVNULL,
            )
        except (subprocess.TimeoutExpired, OSError) as exc:
            return str(exc)
        if proc.returncode == 0:
            return None
        gone = "NotFound" in proc.stderr  # the rank's poll ends it at once
        if gone or time.monotonic() + MARK_RETRY_PAUSE >= deadline:
            return proc.stderr.strip()[:300]
        time.sleep(MARK_RETRY_PAUSE)


def unmark_pod_when_gone(args: argparse.Namespace, alive: Path | None) -> subprocess.Popen[bytes]:
    """Starts a watcher that takes the annotation off once this process is gone.

    However the rank ends, its mark must go with it, as the process goes from the
    container's process list: kwok's exec SIGKILLs the command when the ``kubectl exec``
    client goes away (the driver stopping a rank), which leaves no chance to clean up in
    the rank itself. So a shell in a session of its own holds the read end of a pipe whose
    only write end is this process's; the kernel closes it when this process dies, however
    it dies, and the shell then removes the mark. The returned handle owns the write end:
    dropping it would close the pipe, so keep it until the rank is done. It also removes
    the rank's alive file and reset file, which a killed rank leaves behind on this machine.
    """
    cmd = [
        "/bin/sh",
        "-c",
        f'cat >/dev/null; [ -z "$1" ] || rm -f "$1" "$1{RESET_FILE_SUFFIX}"; shift; exec "$@"',
        "sh",
        str(alive or ""),
        *_annotate(args, f"{mark_key(args)}-"),
    ]
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def crash_file(rank_id: str) -> Path | None:
    return Path(CRASH_FILE.format(rank_id=rank_id)) if rank_id else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def removal_marked(stop_file: Path) -> bool:
    """Whether the driver wrote the removal mark into the stop file (rank -1)."""
    try:
        return stop_file.read_text().strip() == REMOVED_MARK
    except OSError:
        return False


def local_stop_reason(stop_file: Path, driver_pid: int | None) -> str | None:
    """Why a rank on the driver's machine should end quietly now, if it should.

    A stop file with the removal mark is not one: the rank learns of that at its commit."""
    if stop_file.exists() and not removal_marked(stop_file):
        return "stop file present"
    if not stop_file.parent.is_dir():
        return "driver work dir removed"
    if driver_pid is not None and not pid_alive(driver_pid):
        return f"driver pid {driver_pid} gone"
    return None


class _Terminated(Exception):
    """Raised from the signal handler so a pending sleep or kubectl call unwinds."""


_armed = True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Raises at most once, and never after run() has decided its exit code, so a late
    # SIGTERM cannot turn a clean exit into a traceback.
    global _armed
    if _armed:
        _armed = False
        raise _Terminated(signum)


def _disarm() -> None:
    global _armed
    _armed = False


def _err(args: argparse.Namespace, text: str) -> None:
    # The remote shell's stream may be gone once the driver let go; losing a log line is
    # better than a traceback that turns a quiet exit into a failure.
    with contextlib.suppress(OSError, ValueError):
        print(f"mockhorovod-rank {args.host}/{args.local_rank}: {text}", file=sys.stderr)
        sys.stderr.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m e2e.mockhorovod.rank",
        description=(
            "Mock Horovod rank; with --kubeconfig it plays the kubelet's kill on KWOK: it "
            "outlives a terminating pod until its grace period ends, then exits 137."
        ),
    )
    parser.add_argument("--host", required=True, help="the worker pod this rank runs on")
    parser.add_argument("--rank-id", default="", help="the driver's id for this rank")
    parser.add_argument("--local-rank", type=int, default=0)
    parser.add_argument(
        "--kubeconfig", help="enables the kill emulation; needs get and patch on the pod"
    )
    parser.add_argument("--namespace", help="the pod's namespace (default: the context's)")
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument(
        "--commit-interval",
        type=float,
        default=1.0,
        help="seconds between commits, where the rank learns it was removed (exit 134)",
    )
    parser.add_argument("--kubectl-timeout", type=float, default=5.0)
    parser.add_argument("--stop-file", help="exit 0 when it appears (same machine only)")
    parser.add_argument("--driver-pid", type=int, help="exit 0 when it is gone (same machine)")
    parser.add_argument(
        "--alive-file", help="created at start; removed: no assignment, exit 134 at the commit"
    )
    parser.add_argument("--kill-exit-code", type=int, default=KILLED_EXIT_CODE)
    parser.add_argument(
        "--start-seconds",
        type=float,
        default=0.0,
        help="how long the rank takes to join (import torch, hvd.init) before its start line",
    )
    parser.add_argument(
        "--commit-marker",
        action="store_true",
        help="print the commit hook's marker when the driver removes <alive-file>.reset",
    )
    return parser


def watch_for_delete(
    kubectl: str, kubeconfig: str, namespace: str | None, host: str
) -> subprocess.Popen[bytes]:
    """A kubectl that exits 0 the moment the pod is deleted.

    A real kubelet kills the container within milliseconds of the deletion; polling every
    half second would let the controller's host-list update reach the driver first, turning
    what Horovod sees as a failure into a graceful removal. A watch is as fast as the
    controller's own.
    """
    # The watch ends with the rank: a rank killed outright (SIGKILL, a test's teardown)
    # must not leave a kubectl waiting for ever on a cluster that is gone. setpriv (util-
    # linux) sets that up in the child: a preexec_fn would run Python between fork and
    # exec in a process with threads, whose fork handlers can raise there.
    cmd = ["setpriv", "--pdeathsig", "KILL", "--", kubectl, "--kubeconfig", kubeconfig]
    if namespace:
        cmd += ["--namespace", namespace]
    cmd += ["wait", "--for=delete", f"pod/{host}", "--timeout=-1s"]
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass
class _Loop:
    """What the rank's loop carries from one poll to the next."""

    args: argparse.Namespace
    # --kubeconfig given: the rank watches the pod it runs in.
    watch: bool
    alive: Path | None
    stop_file: Path | None
    local: bool
    crash: Path | None
    commit_interval: float
    # When the rank's start (import torch, hvd.init) is over and it joins.
    start_until: float
    # --commit-marker: the driver removes this file when a commit returned after the reset
    # the rank is in, and the hooked state's commit() then prints the marker.
    reset_file: Path | None = None
    state: TrainingState | None = None
    joined: bool = False
    next_commit: float = math.inf
    markers: int = 0
    known_uid: str | None = None
    last_error_report: float = 0.0
    told_terminating: bool = False
    watcher: subprocess.Popen[bytes] | None = None

    def join(self) -> None:
        """``hvd.init`` returned: the alive and reset files exist before the start line,
        since the driver may let the rank go, or end its reset, at once after it."""
        args = self.args
        self.alive = _touch(args, self.alive, "only signals let it go")
        self.reset_file = _touch(args, self.reset_file, "it never prints the commit marker")
        with contextlib.suppress(OSError, ValueError):
            print(
                f"{RANK_STARTED_MARKER} host={args.host} rank_id={args.rank_id} pid={os.getpid()}",
                flush=True,
            )
        self.joined = True
        self.next_commit = time.monotonic() + self.commit_interval

    def commit_after_reset(self) -> None:
        """The driver removed the reset file: a commit returned after the reset this rank
        joined (its first commit), or after a later one. The hooked ``state.commit()``
        prints the marker; the reset file is back for the next reset."""
        if self.state is None or self.reset_file is None or self.reset_file.exists():
            return
        if self.markers:
            self.state.reset()  # Horovod's State.on_reset, for the reset since the last one
        with contextlib.suppress(OSError, ValueError):
            self.state.commit()
        self.markers += 1
        self.reset_file = _touch(self.args, self.reset_file, "it prints no more markers")

    def exit_code(self) -> int | None:
        """Why the rank ends now, as its exit code; None: it trains on (or starts on)."""
        args = self.args
        if self.local and self.stop_file is not None:
            reason = local_stop_reason(self.stop_file, args.driver_pid)
            if reason is not None:
                _err(args, f"{reason}: exiting 0")
                return 0
        if time.monotonic() >= self.next_commit and self._removed_at_commit():
            _err(
                args,
                f"rank {args.rank_id} on {args.host} {REMOVED_MESSAGE} "
                f"(no assignment at the commit), exiting {REMOVED_EXIT_CODE}",
            )
            return REMOVED_EXIT_CODE
        if self.crash is not None and self.crash.exists():
            with contextlib.suppress(OSError):
                self.crash.unlink()
            _err(args, f"{self.crash} appeared: crashing on purpose, exiting {CRASH_EXIT_CODE}")
            return CRASH_EXIT_CODE
        return self._check_pod() if self.watch else None

    def _removed_at_commit(self) -> bool:
        """state.commit(): where a hosts-updated notice reaches the rank."""
        while self.next_commit <= time.monotonic():
            self.next_commit += self.commit_interval
        return (self.alive is not None and not self.alive.exists()) or (
            self.local and self.stop_file is not None and removal_marked(self.stop_file)
        )

    def _check_pod(self) -> int | None:
        args = self.args
        verdict = check_pod(
            args.kubectl,
            args.kubeconfig,
            args.namespace,
            args.host,
            self.known_uid,
            args.kubectl_timeout,
        )
        if verdict.state == "gone":
            _err(args, f"{verdict.reason}: killed, exiting {args.kill_exit_code}")
            return int(args.kill_exit_code)
        if verdict.state == "terminating" and not self.told_terminating:
            self.told_terminating = True
            _err(args, f"{verdict.reason}: still training until let go or killed")
        if verdict.state in ("alive", "terminating"):
            self.known_uid = verdict.uid
            if self.watcher is None:
                self.watcher = watch_for_delete(
                    args.kubectl, args.kubeconfig, args.namespace, args.host
                )
        elif time.monotonic() - self.last_error_report > ERROR_REPORT_INTERVAL:
            self.last_error_report = time.monotonic()
            _err(args, f"pod check failed, still running: {verdict.reason}")
        return None

    def wait(self) -> int | None:
        """Sleep until the next poll, or until the pod's deletion ends the rank."""
        args = self.args
        until = self.next_commit if self.joined else self.start_until
        pause = max(0.0, min(args.poll_interval, until - time.monotonic()))
        if self.watcher is None:
            time.sleep(pause)
            return None
        try:
            code = self.watcher.wait(timeout=pause)
        except subprocess.TimeoutExpired:
            return None
        if code == 0:
            _err(args, f"pod {args.host} deleted: killed, exiting {args.kill_exit_code}")
            return int(args.kill_exit_code)
        _err(args, f"watch for deletion ended with {code}; polling decides")
        self.watcher = None  # the next poll decides, and restarts it
        return None


def _touch(args: argparse.Namespace, path: Path | None, otherwise: str) -> Path | None:
    """The file, created; None if there is none or it cannot be (then ``otherwise``)."""
    if path is None:
        return None
    try:
        path.touch()
    except OSError as exc:
        _err(args, f"cannot create {path}, so {otherwise}: {exc}")
        return None
    return path


def _new_loop(args: argparse.Namespace, watch: bool, alive: Path | None, began: float) -> _Loop:
    stop_file = Path(args.stop_file) if args.stop_file else None
    reset_file: Path | None = None
    state: TrainingState | None = None
    if args.commit_marker:
        if alive is None:
            _err(args, "no --alive-file, so the driver cannot ask for the commit marker")
        else:
            reset_file = Path(f"{alive}{RESET_FILE_SUFFIX}")
            state = reporting_state()
    return _Loop(
        args,
        watch,
        alive,
        stop_file,
        stop_file is not None and stop_file.parent.is_dir(),
        crash_file(args.rank_id),
        max(0.01, float(args.commit_interval)),
        began + max(0.0, float(args.start_seconds)),
        reset_file,
        state,
    )


def run(args: argparse.Namespace) -> int:
    began = time.monotonic()  # the start (import torch, hvd.init) counts from here
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    watch = args.kubeconfig is not None
    loop: _Loop | None = None
    unmarker: subprocess.Popen[bytes] | None = None
    alive = Path(args.alive_file) if args.alive_file else None
    try:
        # Marked before it reports running (and before its slow start), so a pod deleted
        # right after the driver saw the rank start already counts as one with a process
        # in it.
        if watch:
            unmarker = unmark_pod_when_gone(args, alive)
            if (problem := mark_pod(args)) is not None:
                _err(args, f"cannot mark the pod, so KWOK will remove it at once: {problem}")
        loop = _new_loop(args, watch, alive, began)
        while True:
            if not loop.joined and time.monotonic() >= loop.start_until:
                loop.join()
            code = loop.exit_code()
            if code is None and loop.joined:
                loop.commit_after_reset()
            if code is None:
                code = loop.wait()
            if code is not None:
                return code
    except _Terminated:
        return 0  # the graceful path: the driver let go of this rank
    finally:
        _disarm()
        watcher = loop.watcher if loop is not None else None
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        if unmarker is not None and unmarker.stdin is not None:
            unmarker.stdin.close()  # done: the mark goes now rather than at the exit
        for path in (alive, loop.reset_file if loop is not None else None):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except _Terminated:
        return 0  # the signal landed while run() was already unwinding


if __name__ == "__main__":
    raise SystemExit(main())
