"""The mock training's checkpoint to disk, taken when the controller's notice says the job
is stopping (issue 22; docs/spot.md, "Notices to the training").

The mock's training progress is the job's commit count, which lives in the driver, so the
driver plays rank 0's notice thread: at every tick of the commit clock (also while a reset
waits below ``--min-np``, when nothing commits) it reads the notice file and, while a
``job-stopping`` notice is up, writes the step of the last commit to ``--checkpoint-file``
(atomically). A driver started with a checkpoint file that exists resumes from its step.
The notice file is the launcher's ``downwardAPI`` file (``$MPIJOB_ELASTIC_NOTICE_FILE``) in
a real pod; on KWOK the kubelet stand-in (``e2e.kubelet_volume``) writes it from the
launcher's annotation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NOTICE_ENV = "MPIJOB_ELASTIC_NOTICE_FILE"
JOB_STOPPING = "job-stopping"


def read_notice(path: Path) -> tuple[str, str, str] | None:
    """(kind, deadline, cause) of the notice in the file; None: none, or no file."""
    try:
        parts = path.read_text(encoding="utf-8").split(" ", 3)
    except OSError:
        return None
    return (parts[0], parts[1], parts[2]) if len(parts) >= 3 else None


@dataclass
class Checkpoint:
    path: Path
    notice: Path | None
    saved: int | None = None

    def load(self) -> int:
        """The step a resumed run starts from; 0 without a checkpoint."""
        try:
            return int(self.path.read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            return 0

    def tick(self, step: int) -> tuple[str, str] | None:
        """Saves ``step`` while a job-stopping notice is up (once per step); the notice's
        (cause, deadline) when it saved."""
        found = read_notice(self.notice) if self.notice is not None else None
        if found is None or found[0] != JOB_STOPPING or step == self.saved:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(f"{step}\n", encoding="utf-8")
        os.replace(tmp, self.path)
        self.saved = step
        return found[2], found[1]


def notice_path(given: str | None) -> Path | None:
    value = given or os.environ.get(NOTICE_ENV)
    return Path(value) if value else None
