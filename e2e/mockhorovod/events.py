"""Names of the driver's event lines, and helpers to read them back.

The driver writes one JSON object per line (``{"ts": ..., "event": ..., ...}``) so that a
test can assert on what happened without scraping prose. These names are the contract
between the driver and the end-to-end suite; README.md describes every field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

DRIVER_STARTED: Final = "driver_started"
DISCOVERY: Final = "discovery"
DISCOVERY_FAILED: Final = "discovery_failed"
WAITING_FOR_SLOTS: Final = "waiting_for_slots"
JOB_STARTED: Final = "job_started"
HOST_ADDED: Final = "host_added"
RANK_STARTED: Final = "rank_started"
RANK_RUNNING: Final = "rank_running"
HOST_REMOVED: Final = "host_removed"
RESET: Final = "reset"
RANK_UNASSIGNED: Final = "rank_unassigned"
RANK_STOPPED: Final = "rank_stopped"
RANK_EXITED: Final = "rank_exited"
RANK_FAILED: Final = "rank_failed"
EXEC_FAILED: Final = "exec_failed"
HOST_BLACKLISTED: Final = "host_blacklisted"
HOST_UNBLACKLISTED: Final = "host_unblacklisted"
BELOW_MIN_NP: Final = "below_min_np"
MIN_NP_RESTORED: Final = "min_np_restored"
ELASTIC_TIMEOUT: Final = "elastic_timeout"
STOP_REQUESTED: Final = "stop_requested"
DRIVER_EXIT: Final = "driver_exit"
WAITING_FOR_HOSTS: Final = "waiting_for_hosts"
PROBE_STARTED: Final = "probe_started"
PROBE_DONE: Final = "probe_done"
START_FAILED: Final = "start_failed"
HOSTS_UPDATE_LOST: Final = "hosts_update_lost"
RESET_WAITING: Final = "reset_waiting"
RESET_COMPLETED: Final = "reset_completed"
RESET_FAILED: Final = "reset_failed"
GLOO_TIMEOUT: Final = "gloo_timeout"
JOB_FAILED: Final = "job_failed"
# The training's checkpoint (checkpoint.py): loaded at the start, saved on a notice.
CHECKPOINT_LOADED: Final = "checkpoint_loaded"
CHECKPOINT_SAVED: Final = "checkpoint_saved"
# The training's commit hook (contrib/mpijob_elastic_notice.py, --commit-marker): the driver
# tells the ranks of an ended reset that a commit returned; a rank printed the marker.
COMMIT_MARKER_REQUESTED: Final = "commit_marker_requested"
COMMIT_MARKER_PRINTED: Final = "commit_marker_printed"

ALL_EVENTS: Final = frozenset(
    {
        DRIVER_STARTED,
        DISCOVERY,
        DISCOVERY_FAILED,
        WAITING_FOR_SLOTS,
        JOB_STARTED,
        HOST_ADDED,
        RANK_STARTED,
        RANK_RUNNING,
        HOST_REMOVED,
        RESET,
        RANK_UNASSIGNED,
        RANK_STOPPED,
        RANK_EXITED,
        RANK_FAILED,
        EXEC_FAILED,
        HOST_BLACKLISTED,
        HOST_UNBLACKLISTED,
        BELOW_MIN_NP,
        MIN_NP_RESTORED,
        ELASTIC_TIMEOUT,
        STOP_REQUESTED,
        DRIVER_EXIT,
        WAITING_FOR_HOSTS,
        PROBE_STARTED,
        PROBE_DONE,
        START_FAILED,
        HOSTS_UPDATE_LOST,
        RESET_WAITING,
        RESET_COMPLETED,
        RESET_FAILED,
        GLOO_TIMEOUT,
        JOB_FAILED,
        CHECKPOINT_LOADED,
        CHECKPOINT_SAVED,
        COMMIT_MARKER_REQUESTED,
        COMMIT_MARKER_PRINTED,
    }
)

# Events that mean real Horovod would have rolled the job back to its last commit: a
# correct graceful scale-down must produce none of them.
FAILURE_EVENTS: Final = frozenset({RANK_FAILED, EXEC_FAILED, HOST_BLACKLISTED})
# Events after which real Horovod ends the whole job (horovodrun exits 1), or trains on a
# host set discover_hosts.sh no longer lists: a controller must cause none of them.
FATAL_EVENTS: Final = frozenset(
    {START_FAILED, RESET_FAILED, GLOO_TIMEOUT, JOB_FAILED, ELASTIC_TIMEOUT, HOSTS_UPDATE_LOST}
)


def parse_events(text: str) -> list[dict[str, Any]]:
    """Parses driver output into event records, skipping lines that are not events.

    The launcher's log also carries kubectl's and the shell's own lines (``set -x`` in
    kubexec.sh), so anything that is not a JSON object with an ``event`` key is ignored
    rather than treated as an error.
    """
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            records.append(record)
    return records


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Reads an event log written with ``--log-file`` (a missing file has no events yet)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return parse_events(text)


def of_kind(records: list[dict[str, Any]], *events: str) -> list[dict[str, Any]]:
    """The records whose event is one of ``events``, in log order."""
    wanted = set(events)
    return [r for r in records if r["event"] in wanted]
