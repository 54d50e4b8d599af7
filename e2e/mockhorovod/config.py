"""The driver's settings: horovodrun's options and the mock's own, with the values
horovodrun would refuse refused here too. Built from the command line by cli.py."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from e2e.mockhorovod.remote import render_rank_command

DEFAULT_DISCOVERY_SCRIPT = "/etc/mpi/discover_hosts.sh"
DEFAULT_RSH_AGENT = "/etc/mpi/kubexec.sh"
REPO_ROOT = Path(__file__).resolve().parents[2]

# Horovod 0.28's bounds for --blacklist-cooldown-range (runner/elastic/discovery.py).
COOLDOWN_LOWER_BOUND = 1
COOLDOWN_UPPER_BOUND = 3600

DEFAULT_RANK_COMMAND = "cd {repo} && exec {python} -m e2e.mockhorovod.rank {rank_args}"
# A file each rank creates where it runs and watches: the driver lets the rank go (Horovod's
# hosts-updated notice at the next commit) by removing it through the remote shell, because
# ending the remote shell (`kubectl exec`) does not end the command in a real container.
# Removing, not creating, so a notice that arrives after the rank has gone leaves nothing.
DEFAULT_RANK_ALIVE_FILE = "/tmp/mockhorovod-rank-{rank_id}"
RANK_COMMAND_FIELDS = (
    "host",
    "rank_id",
    "local_rank",
    "driver_pid",
    "stop_file",
    "python",
    "repo",
    "rank_args",
)

# Horovod's defaults for HOROVOD_GLOO_TIMEOUT_SECONDS and HOROVOD_START_TIMEOUT.
DEFAULT_GLOO_TIMEOUT = 30.0
DEFAULT_START_TIMEOUT = 30.0
# How long a rank takes from its start to hvd.init returned (import torch, CUDA, the data
# set): 10-60 s on a GPU node; short by default so the suite stays quick, but never 0, so a
# controller that takes a running remote shell for a joined rank is caught.
DEFAULT_RANK_START_SECONDS = 2.0
RANK_START_ENV = "MOCKHOROVOD_RANK_START_SECONDS"


class ConfigError(Exception):
    """Command-line values that horovodrun itself would refuse."""


@dataclass(frozen=True)
class DriverConfig:
    """Everything the driver needs; built from the command line by :func:`parse_args`."""

    np: int
    min_np: int
    max_np: int | None = None
    discovery_script: str = DEFAULT_DISCOVERY_SCRIPT
    slots_per_host: int | None = None
    elastic_timeout: float = 600.0
    cooldown_range: tuple[int, int] | None = None
    rsh_agent: str = DEFAULT_RSH_AGENT
    rank_command: str = DEFAULT_RANK_COMMAND
    discovery_interval: float = 1.0
    discovery_timeout: float = 30.0
    run_seconds: float = 0.0
    stop_file: str | None = None
    log_file: str | None = None
    work_dir: str | None = None
    stop_grace: float = 5.0
    commit_interval: float = 1.0
    rank_kubeconfig: str | None = None
    rank_namespace: str | None = None
    rank_kubectl: str | None = None
    rank_poll_interval: float | None = None
    rank_python: str = sys.executable
    rank_repo: str = str(REPO_ROOT)
    rank_alive_file: str = DEFAULT_RANK_ALIVE_FILE
    # Horovod's HOROVOD_GLOO_TIMEOUT_SECONDS: how long the ranks of a reset wait in the new
    # world's rendezvous for every newly started rank before they all abort.
    gloo_timeout: float = DEFAULT_GLOO_TIMEOUT
    # horovodrun's --start-timeout (HOROVOD_START_TIMEOUT): the deadline, from launch, by
    # which every discovered host must have answered the interface probe.
    start_timeout: float = DEFAULT_START_TIMEOUT
    # horovodrun's --network-interface: given, there is no probe and one host is enough.
    network_interface: str | None = None
    # The training's checkpoint and the notice that asks for it (checkpoint.py).
    checkpoint_file: str | None = None
    notice_file: str | None = None
    # Seconds from a rank's start to its joining (hvd.init returned), passed to each rank.
    rank_start_seconds: float = DEFAULT_RANK_START_SECONDS
    # The training uses the controller's commit hook (contrib/mpijob_elastic_notice.py):
    # each rank a reset started prints its marker at the first commit after the reset.
    commit_marker: bool = True
    command: tuple[str, ...] = ()

    def validate(self) -> None:
        """Refuses what horovodrun refuses, plus a rank template that cannot be filled."""
        if self.min_np < 1:
            raise ConfigError("--min-np must be at least 1")
        if self.np < self.min_np:
            raise ConfigError("-np must not be below --min-np")
        if self.max_np is not None and self.max_np < self.np:
            raise ConfigError("--max-np must not be below -np")
        if self.slots_per_host is not None and self.slots_per_host < 1:
            raise ConfigError("--slots-per-host must be at least 1")
        if self.cooldown_range is not None:
            lower, upper = self.cooldown_range
            if not COOLDOWN_LOWER_BOUND <= lower <= upper <= COOLDOWN_UPPER_BOUND:
                raise ConfigError(
                    "--blacklist-cooldown-range needs "
                    f"{COOLDOWN_LOWER_BOUND} <= MIN <= MAX <= {COOLDOWN_UPPER_BOUND}"
                )
        for name in (
            "discovery_interval",
            "discovery_timeout",
            "stop_grace",
            "commit_interval",
            "gloo_timeout",
            "start_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        if not self.rank_start_seconds >= 0:
            raise ConfigError("--rank-start-seconds must not be negative")
        try:
            self.rank_alive_file.format(rank_id="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"--rank-alive-file {self.rank_alive_file!r} cannot be filled: {exc!r}; "
                "its only field is {rank_id}"
            ) from None
        dummy = dict.fromkeys(RANK_COMMAND_FIELDS, "x")
        del dummy["rank_args"]
        try:
            render_rank_command(self.rank_command, dummy, [])
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"--rank-command {self.rank_command!r} cannot be filled: {exc!r}; "
                f"known fields: {', '.join(RANK_COMMAND_FIELDS)}"
            ) from None
