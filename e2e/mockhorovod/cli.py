"""horovodrun's command line, as the launcher's command gives it, into a DriverConfig."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from e2e.mockhorovod.config import (
    DEFAULT_DISCOVERY_SCRIPT,
    DEFAULT_GLOO_TIMEOUT,
    DEFAULT_RANK_ALIVE_FILE,
    DEFAULT_RANK_COMMAND,
    DEFAULT_RANK_START_SECONDS,
    DEFAULT_RSH_AGENT,
    DEFAULT_START_TIMEOUT,
    RANK_COMMAND_FIELDS,
    RANK_START_ENV,
    REPO_ROOT,
    ConfigError,
    DriverConfig,
)


def _env_seconds(name: str, default: float) -> float:
    """A timeout from Horovod's environment variable, as horovodrun reads it."""
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovodrun",
        description=(
            "Mock of Horovod's elastic driver for the mpijob-elastic end-to-end suite: runs "
            "the host discovery script, starts a mock rank per slot through the remote "
            "shell, and writes every membership change as one JSON line."
        ),
    )
    hv = parser.add_argument_group("horovodrun options")
    hv.add_argument("-np", "--num-proc", dest="np", type=int, help="slots to wait for at start")
    hv.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int)
    hv.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int)
    hv.add_argument("--host-discovery-script", default=DEFAULT_DISCOVERY_SCRIPT)
    hv.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int)
    hv.add_argument("--elastic-timeout", type=float, default=600.0)
    hv.add_argument(
        "--blacklist-cooldown-range",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="seconds; without it a failed host is blacklisted for the rest of the job",
    )
    hv.add_argument(
        "--start-timeout",
        type=float,
        default=_env_seconds("HOROVOD_START_TIMEOUT", DEFAULT_START_TIMEOUT),
        help="seconds from launch by which every host must answer the interface probe",
    )
    hv.add_argument(
        "--network-interface",
        "--network-interfaces",
        dest="network_interface",
        help="given, horovodrun skips the interface probe and may start on one host",
    )
    mk = parser.add_argument_group("mock options")
    mk.add_argument(
        "--gloo-timeout-seconds",
        type=float,
        default=_env_seconds("HOROVOD_GLOO_TIMEOUT_SECONDS", DEFAULT_GLOO_TIMEOUT),
        help="how long a reset's ranks wait for every new rank (HOROVOD_GLOO_TIMEOUT_SECONDS)",
    )
    mk.add_argument(
        "--rank-start-seconds",
        type=float,
        default=_env_seconds(RANK_START_ENV, DEFAULT_RANK_START_SECONDS),
        help="how long each rank takes from its start to joining (import torch, hvd.init), "
        f"passed to ranks (default ${RANK_START_ENV}, else {DEFAULT_RANK_START_SECONDS:g})",
    )
    mk.add_argument(
        "--commit-marker",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the training uses the controller's commit hook: each new rank prints its "
        "marker at the first commit after its reset (--no-commit-marker: a training without)",
    )
    mk.add_argument("--rsh-agent", default=DEFAULT_RSH_AGENT)
    mk.add_argument(
        "--rank-command",
        default=DEFAULT_RANK_COMMAND,
        help=(
            "template of the command run on each slot (str.format fields, shell-quoted: "
            + ", ".join("{" + f + "}" for f in RANK_COMMAND_FIELDS)
            + "); literal braces are doubled"
        ),
    )
    mk.add_argument("--rank-python", default=sys.executable, help="fills {python}")
    mk.add_argument("--rank-repo", default=str(REPO_ROOT), help="fills {repo}")
    mk.add_argument(
        "--rank-alive-file",
        default=DEFAULT_RANK_ALIVE_FILE,
        help="file ({rank_id} filled) a rank keeps where it runs; removing it lets it go",
    )
    mk.add_argument("--rank-kubeconfig", help="passed to ranks: enables their pod watch")
    mk.add_argument("--rank-namespace", help="passed to ranks")
    mk.add_argument("--rank-kubectl", help="passed to ranks")
    mk.add_argument("--rank-poll-interval", type=float, help="passed to ranks")
    mk.add_argument("--discovery-interval", type=float, default=1.0)
    mk.add_argument("--discovery-timeout", type=float, default=30.0)
    mk.add_argument("--run-seconds", type=float, default=0.0, help="0 runs until stopped")
    mk.add_argument("--stop-file", help="the job finishes when this file exists")
    mk.add_argument("--log-file", help="also append the event lines here")
    mk.add_argument(
        "--checkpoint-file",
        help="the training's step: resumed from if it exists, saved on a job-stopping notice",
    )
    mk.add_argument(
        "--notice-file", help="the controller's notice (default: $MPIJOB_ELASTIC_NOTICE_FILE)"
    )
    mk.add_argument("--work-dir", help="where per-rank stop files live (default: a temp dir)")
    mk.add_argument("--stop-grace", type=float, default=5.0, help="SIGTERM to SIGKILL, seconds")
    mk.add_argument(
        "--commit-interval",
        type=float,
        default=1.0,
        help="seconds between the job's commits (passed to ranks), where host updates, "
        "failures and successes take effect",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the training command (recorded, not run)"
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> DriverConfig:
    """Builds and validates a config; raises ConfigError for values horovodrun refuses."""
    ns = build_parser().parse_args(argv)
    if ns.np is None and ns.min_np is None:
        raise ConfigError("give -np or --min-np")
    np_ = ns.np if ns.np is not None else ns.min_np
    min_np = ns.min_np if ns.min_np is not None else np_
    cooldown: tuple[int, int] | None = None
    if ns.blacklist_cooldown_range:
        lower, upper = ns.blacklist_cooldown_range
        cooldown = (lower, upper)
    command = list(ns.command)
    if command[:1] == ["--"]:
        command = command[1:]
    config = DriverConfig(
        np=np_,
        min_np=min_np,
        max_np=ns.max_np,
        discovery_script=ns.host_discovery_script,
        slots_per_host=ns.slots_per_host,
        elastic_timeout=ns.elastic_timeout,
        cooldown_range=cooldown,
        rsh_agent=ns.rsh_agent,
        rank_command=ns.rank_command,
        discovery_interval=ns.discovery_interval,
        discovery_timeout=ns.discovery_timeout,
        run_seconds=ns.run_seconds,
        stop_file=ns.stop_file,
        log_file=ns.log_file,
        work_dir=ns.work_dir,
        stop_grace=ns.stop_grace,
        commit_interval=ns.commit_interval,
        rank_kubeconfig=ns.rank_kubeconfig,
        rank_namespace=ns.rank_namespace,
        rank_kubectl=ns.rank_kubectl,
        rank_poll_interval=ns.rank_poll_interval,
        rank_python=ns.rank_python,
        rank_repo=ns.rank_repo,
        rank_alive_file=ns.rank_alive_file,
        gloo_timeout=ns.gloo_timeout_seconds,
        start_timeout=ns.start_timeout,
        network_interface=ns.network_interface,
        checkpoint_file=ns.checkpoint_file,
        notice_file=ns.notice_file,
        rank_start_seconds=ns.rank_start_seconds,
        commit_marker=ns.commit_marker,
        command=tuple(command),
    )
    config.validate()
    return config
