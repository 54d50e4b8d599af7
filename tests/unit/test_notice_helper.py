"""contrib/mpijob_elastic_notice.py: the helper training scripts copy into their images.
It must work on its own (the standard library only) and read what the controller writes."""

from __future__ import annotations

import ast
import importlib.util
import io
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mpijob_elastic.core import formats, names
from mpijob_elastic.core.lifecycle.notices import format_notice
from mpijob_elastic.core.objects import render_pods

HELPER = Path(__file__).resolve().parents[2] / "contrib" / "mpijob_elastic_notice.py"
T = datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mpijob_elastic_notice", HELPER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_imports_only_the_standard_library() -> None:
    tree = ast.parse(HELPER.read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for a in node.names
    }
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


def test_its_names_are_the_controller_s() -> None:
    helper = load()
    assert helper.ENV == render_pods.NOTICE_ENV
    assert f"{names.NOTICE_MOUNT}/{names.NOTICE_FILE}" == helper.DEFAULT_PATH


def test_it_reads_what_the_controller_writes(tmp_path: Path) -> None:
    helper = load()
    path = tmp_path / "notice"
    # No file (an old pod), and an empty one (no notice).
    assert helper.read_notice(str(path)) is None
    path.write_text("")
    assert helper.read_notice(str(path)) is None
    assert helper.should_checkpoint(str(path)) is False
    assert helper.time_left(str(path)) is None
    path.write_text(format_notice("job-stopping", T, "below-min", "only 1 of 2 workers"))
    found = helper.read_notice(str(path))
    assert found == ("job-stopping", T, "below-min", "only 1 of 2 workers")
    assert helper.should_checkpoint(str(path)) is True
    assert helper.time_left(str(path), T - timedelta(seconds=42.5)) == 42.5
    assert helper.time_left(str(path), T + timedelta(seconds=1)) == 0.0
    path.write_text(format_notice("worker-leaving", T, "scale-in", "removed"))
    assert helper.should_checkpoint(str(path)) is False, "Horovod keeps the state"
    assert helper.time_left(str(path), T) == 0.0


def test_the_path_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper = load()
    path = tmp_path / "elsewhere"
    path.write_text(format_notice("job-stopping", T, "suspend", "runPolicy.suspend is true"))
    monkeypatch.setenv(helper.ENV, str(path))
    assert helper.should_checkpoint() is True


def test_a_thread_saves_once_per_job_stopping_notice(tmp_path: Path) -> None:
    helper = load()
    path = tmp_path / "notice"
    path.write_text(format_notice("worker-leaving", T, "scale-in", "removed"))
    saved: list[str] = []
    helper.on_job_stopping(lambda n: saved.append(n.cause), str(path), every=0.01)
    time.sleep(0.1)
    assert saved == []
    path.write_text(format_notice("job-stopping", T, "below-min", "only 1"))
    deadline = time.monotonic() + 5
    while not saved and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert saved == ["below-min"], "once, however often it is read"
    path.write_text("")
    time.sleep(0.1)
    path.write_text(format_notice("job-stopping", T, "below-min", "only 1"))
    deadline = time.monotonic() + 5
    while len(saved) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert saved == ["below-min", "below-min"], "posted again: a new notice"


def test_as_a_command_it_exits_0_only_when_the_job_stops(tmp_path: Path) -> None:
    path = tmp_path / "notice"
    env = {"MPIJOB_ELASTIC_NOTICE_FILE": str(path), "PATH": "/usr/bin:/bin"}
    path.write_text("")
    assert subprocess.run([sys.executable, str(HELPER)], env=env, check=False).returncode == 1
    path.write_text(format_notice("job-stopping", T, "suspend", "runPolicy.suspend is true"))
    done = subprocess.run(
        [sys.executable, str(HELPER)], env=env, check=False, capture_output=True, text=True
    )
    assert done.returncode == 0
    assert done.stdout.startswith("job-stopping suspend in 0s: runPolicy.suspend is true")


class FakeState:
    """What report_commits uses of a hvd.elastic.State: commit() and reset callbacks."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.commits = 0
        self.raise_next = False

    def register_reset_callbacks(self, callbacks: list[Any]) -> None:
        self.callbacks.extend(callbacks)

    def commit(self) -> None:
        self.commits += 1
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("HostsUpdatedInterrupt")

    def reset(self) -> None:
        for callback in self.callbacks:
            callback()


def test_report_commits_prints_the_controllers_marker_once_per_reset() -> None:
    helper = load()
    assert helper.COMMITTED_MARKER == formats.COMMITTED_MARKER
    out = io.StringIO()
    state = FakeState()
    helper.report_commits(state, out)
    state.commit()  # a new rank's first commit: the reset it joined has ended
    state.commit()
    assert out.getvalue() == f"{formats.COMMITTED_MARKER}\n"
    assert state.commits == 2
    state.reset()
    # A commit that raises (hosts updated: another reset follows) is no proof.
    state.raise_next = True
    with pytest.raises(RuntimeError):
        state.commit()
    assert out.getvalue().count(formats.COMMITTED_MARKER) == 1
    state.commit()
    state.commit()
    assert out.getvalue().count(formats.COMMITTED_MARKER) == 2
