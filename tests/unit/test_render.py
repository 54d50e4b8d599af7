"""Rendering: the v1 children, byte for byte where users' images depend on them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpijob_elastic.core import formats, names
from mpijob_elastic.core.objects import render, render_pods
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.spec.parse import parse
from tests.controller import wait_for
from tests.unit.simulation import make_job

INIT = Settings(kubectl_delivery=KubectlDelivery.INIT_CONTAINER, kubectl_image="kubectl:1")
NONE = Settings(kubectl_delivery=KubectlDelivery.NONE)


def kubelet_expand(text: str, env: dict[str, str] | None = None) -> str:
    """What a container's command reaches the process as, after the kubelet's expansion:
    ``$$`` is a literal ``$``, ``$(NAME)`` a defined variable's value (else left as it is),
    any other ``$`` itself (Kubernetes' third_party expansion rules)."""
    env = env or {}
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) != -1:
            ref = text[i : end + 1]
            out.append(env.get(ref[2:-1], ref))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def test_kubelet_expand_follows_the_kubelet() -> None:
    assert kubelet_expand("a $$ b $$$$ $(X) $(Y) $z $", {"X": "1"}) == "a $ b $$ 1 $(Y) $z $"


def test_rendered_scripts_reach_the_shell_as_written() -> None:
    worker = render_pods.worker_pod(spec_of(), 0)["spec"]["containers"][0]["command"]
    assert worker[:2] == ["/bin/sh", "-c"]
    assert kubelet_expand(worker[2]) == render_pods.WORKER_IDLE_SCRIPT
    (init,) = render_pods.launcher_pod(spec_of(), INIT, "abc", 2)["spec"]["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert kubelet_expand(init["command"][2], env) == render_pods.KUBECTL_DELIVERY_SCRIPT


def spec_of(**changes: object) -> JobSpec:
    job = make_job(2, slots=2)
    job["spec"].update(changes)
    return parse(job, 30)


def test_kubexec_is_the_v1_script_with_reports_around_its_exec_line() -> None:
    script = render.kubexec(spec_of(), INIT)
    assert script.startswith("#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n")
    assert '{ { /opt/kube/kubectl exec ${POD_NAME} -- /bin/sh -c "$*" 3>&- 4>&-;' in script
    assert "/opt/kube/kubectl job-ranks" in script
    assert (
        render.kubexec(spec_of(mainContainer="main"), NONE).count(
            '{ { kubectl exec ${POD_NAME} --container main -- /bin/sh -c "$*" 3>&-'
        )
        == 1
    )


# A kubectl for the script: `exec` runs the remote command here; `patch` records its
# arguments, or fails, or hangs, as FAKE_PATCH says.
FAKE_KUBECTL = """#!/bin/sh
if [ "$1" = patch ]; then
  case "$FAKE_PATCH" in fail) exit 1;; hang) sleep 8; exit 1;; esac
  echo "$*" >> "$FAKE_LOG"; exit 0
fi
shift 5
exec /bin/sh -c "$1"
"""


def run_kubexec(tmp_path: Path, patch: str, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    # Written once: a report of an earlier call may still be running it, and opening a
    # running program for writing fails (ETXTBSY).
    if not kubectl.exists():
        kubectl.write_text(FAKE_KUBECTL)
        kubectl.chmod(0o755)
    script = tmp_path / "kubexec.sh"
    script.write_text(render.kubexec(spec_of(), NONE))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_PATCH": patch,
        "FAKE_LOG": str(tmp_path / "patches"),
    }
    return subprocess.run(
        ["/bin/sh", str(script), *args], env=env, capture_output=True, text=True, timeout=20
    )


def reports(tmp_path: Path, count: int) -> list[str]:
    log = tmp_path / "patches"
    for _ in range(100):
        if log.exists() and len(lines := log.read_text().splitlines()) >= count:
            return lines
        time.sleep(0.05)
    return log.read_text().splitlines() if log.exists() else []


def test_kubexec_reports_each_remote_shells_start_and_exit_code(tmp_path: Path) -> None:
    done = run_kubexec(tmp_path, "ok", "job-worker-1", "echo", "out;", "exit", "3")
    # The remote command's output and status, as v1's script gives them.
    assert done.stdout == "out\n"
    assert done.returncode == 3
    # Its trace is v1's: the report lines are not traced.
    assert "patch" not in done.stderr
    assert "report" not in done.stderr
    patches = reports(tmp_path, 2)
    keys = sorted(k for p in patches for k in json.loads(p.split(" -p ")[1])["data"])
    assert len(keys) == 2
    start, end = keys
    assert re.fullmatch(r"job-worker-1_[0-9]+_[0-9]+", start)
    assert end == f"{start}_exit"
    values = {
        k: v
        for d in (json.loads(p.split(" -p ")[1])["data"] for p in patches)
        for k, v in d.items()
    }
    assert values == {start: "start", end: "3"}
    assert all(p.startswith("patch configmap job-ranks --type=merge") for p in patches)


def test_kubexec_reports_the_first_commit_marker_and_passes_the_output_untouched(
    tmp_path: Path,
) -> None:
    marker = formats.COMMITTED_MARKER
    # Lines before the marker go through the read loop, the rest through cat; a marker
    # inside a longer line counts, a second one is not reported again, and the last line
    # keeps its missing newline.
    out = f"a  b\\\\c\n\nx {marker} y\nafter\n{marker}\nlast"
    done = run_kubexec(tmp_path, "ok", "job-worker-2", f"printf '%s' {shlex.quote(out)}; exit 7")
    assert done.stdout == out
    assert done.returncode == 7
    # The watch is not traced.
    assert "read -r" not in done.stderr
    assert "_committed" not in done.stderr
    patches = reports(tmp_path, 3)
    values = {
        k: v
        for d in (json.loads(p.split(" -p ")[1])["data"] for p in patches)
        for k, v in d.items()
    }
    assert len(values) == 3
    start = next(k for k, v in values.items() if v == "start")
    assert values[f"{start}_exit"] == "7"
    assert values[f"{start}_committed"].isdigit()


def test_kubexec_without_the_marker_reports_no_commit(tmp_path: Path) -> None:
    done = run_kubexec(tmp_path, "ok", "job-worker-0", "echo", "training")
    assert (done.stdout, done.returncode) == ("training\n", 0)
    patches = reports(tmp_path, 2)
    time.sleep(0.5)
    assert len((tmp_path / "patches").read_text().splitlines()) == len(patches) == 2
    assert not any("_committed" in p for p in patches)


def test_kubexec_reports_only_the_start_of_horovods_interface_probe(tmp_path: Path) -> None:
    """Its start says the driver's first ranks come next; it is no rank, so neither its
    end nor any marker in its output is reported."""
    marker = formats.COMMITTED_MARKER
    probe = f"python -m horovod.runner.task_fn 0 2 abc def || echo '{marker}'; exit 3"
    done = run_kubexec(tmp_path, "ok", "job-worker-0", probe)
    assert done.returncode == 3
    assert done.stdout == f"{marker}\n"
    (patch,) = reports(tmp_path, 1)
    time.sleep(1)
    assert len((tmp_path / "patches").read_text().splitlines()) == 1
    ((key, value),) = json.loads(patch.split(" -p ")[1])["data"].items()
    assert re.fullmatch(r"job-worker-0_[0-9]+_[0-9]+", key)
    assert value == "probe"


def test_kubexec_runs_the_remote_shell_whatever_its_reports_meet(tmp_path: Path) -> None:
    for patch in ("fail", "hang"):
        started = time.monotonic()
        done = run_kubexec(tmp_path, patch, "job-worker-0", "echo", "fine")
        assert (done.stdout, done.returncode) == ("fine\n", 0)
        # Neither a refused nor a hanging report holds the shell up.
        assert time.monotonic() - started < 3, patch


def test_hostfile_and_discovery_formats() -> None:
    spec = spec_of()
    assert render.hostfile(spec, ["job-worker-0", "job-worker-3"]) == (
        "job-worker-0 slots=2\njob-worker-3 slots=2\n"
    )
    assert render.discover_hosts(spec, ["job-worker-0"]) == "#!/bin/sh\necho job-worker-0:2"
    assert render.discover_hosts(spec, []) == "#!/bin/sh\n"


def test_gpu_launcher_gets_a_hostfile_line_and_keeps_its_gpus() -> None:
    job = make_job(1)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    spec = parse(job, 30)
    assert render.hostfile(spec, ["job-worker-0"]) == "job-launcher slots=1\njob-worker-0 slots=1\n"
    env = render_pods.launcher_pod(spec, NONE, "h", 1)["spec"]["containers"][0]["env"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in env}


def test_role_never_has_an_empty_exec_rule() -> None:
    spec = spec_of()
    assert [r["resources"] for r in render.role(spec, [])["rules"]] == [["pods"]]
    exec_rule = render.role(spec, ["job-worker-0"])["rules"][1]
    assert exec_rule == {
        "apiGroups": [""],
        "resources": ["pods/exec"],
        "verbs": ["create"],
        "resourceNames": ["job-worker-0"],
    }


def test_children_are_owned_and_labelled() -> None:
    spec = spec_of()
    for obj in (
        render.service_account(spec),
        render.role(spec, []),
        render.role_binding(spec),
        render.config_map(spec, {}),
        render_pods.worker_pod(spec, 1),
        render_pods.launcher_pod(spec, NONE, "h", 1),
    ):
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["ownerReferences"] == [render.owner_reference(spec)]
        assert meta["labels"][names.LABEL_GROUP] == "kubeflow.org"
        assert meta["labels"][names.LABEL_JOB] == "job"
    assert render_pods.worker_pod(spec, 1)["metadata"]["labels"][names.LABEL_INDEX] == "1"
    assert names.LABEL_ROLE not in render.config_map(spec, {})["metadata"]["labels"]


def test_labels_are_mpi_operator_v1s_and_training_operator_19s_byte_for_byte() -> None:
    spec = spec_of()
    v1 = {"group-name": "kubeflow.org", "mpi-job-name": "job"}
    to_pod = {
        "training.kubeflow.org/job-name": "job",
        "training.kubeflow.org/operator-name": "mpijob-controller",
    }
    assert render_pods.launcher_pod(spec, NONE, "h", 1)["metadata"]["labels"] == {
        **v1,
        "mpi-job-role": "launcher",
        **to_pod,
        "training.kubeflow.org/replica-type": "launcher",
        "training.kubeflow.org/job-role": "master",
    }
    assert render_pods.worker_pod(spec, 3)["metadata"]["labels"] == {
        **v1,
        "mpi-job-role": "worker",
        **to_pod,
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "3",
    }
    for obj in (render.service_account(spec), render.role(spec, []), render.role_binding(spec)):
        assert obj["metadata"]["labels"] == {**v1, "mpi-job-role": "launcher", "app": "job"}
    assert render.config_map(spec, {})["metadata"]["labels"] == {**v1, "app": "job"}
    budget = render.disruption_budget(spec, 1)
    assert budget["metadata"]["labels"] == {**v1, "mpi-job-role": "worker", "app": "job"}
    # The budget selects by the v1 labels, and only the workers labelled as holding ranks.
    assert budget["spec"]["selector"] == {
        "matchLabels": {
            **v1,
            "mpi-job-role": "worker",
            "mpijob-elastic.io/holds-ranks": "true",
        }
    }


def test_a_template_label_cannot_take_the_place_of_ours() -> None:
    job = make_job(2, slots=2)
    template = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    template["metadata"] = {"labels": {"training.kubeflow.org/job-name": "x", "team": "a"}}
    labels = render_pods.worker_pod(parse(job, 30), 0)["metadata"]["labels"]
    assert labels["training.kubeflow.org/job-name"] == "job"
    assert labels["team"] == "a"


def test_worker_pod_mounts_kubexec_and_idles_in_the_default_command() -> None:
    pod = render_pods.worker_pod(spec_of(), 0)
    container = pod["spec"]["containers"][0]
    assert container["command"] == render_pods.WORKER_COMMAND
    assert "args" not in container
    assert container["volumeMounts"] == [
        {"name": "mpi-job-config", "mountPath": "/etc/mpi"},
        {"name": "mpijob-elastic-notice", "mountPath": "/etc/mpijob-elastic"},
    ]
    volume, _ = pod["spec"]["volumes"]
    assert volume["configMap"]["items"] == [
        {"key": "kubexec.sh", "path": "kubexec.sh", "mode": 0o555}
    ]


def test_worker_with_its_own_command_keeps_it() -> None:
    job = make_job(1)
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["command"], worker["args"] = ["/usr/sbin/sshd"], ["-D"]
    container = render_pods.worker_pod(parse(job, 30), 0)["spec"]["containers"][0]
    assert (container["command"], container["args"]) == (["/usr/sbin/sshd"], ["-D"])


# The default command is run for real: as PID 1 of a fresh PID namespace with its own
# /proc, which is what a container is to it, with "ranks" entered into that namespace by
# nsenter the way `kubectl exec` enters a container. Debian's /bin/sh is dash; busybox's
# ash is what minimal images have, and is checked where it is installed.
SHELLS = [["/bin/sh"], *([["busybox", "sh"]] if shutil.which("busybox") else [])]


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


class Worker:
    """The default worker command as a container's PID 1, and ranks exec'd beside it."""

    def __init__(self, shell: list[str], with_proc: bool = True) -> None:
        # The command as the kubelet hands it to the container, not the constant.
        script = [*shell, "-c", kubelet_expand(render_pods.WORKER_COMMAND[2])]
        if with_proc:
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", *script]
        else:
            # An empty /proc in a private mount namespace: the script cannot see processes.
            mount_empty = 'mount -t tmpfs none /proc && exec "$@"'
            cmd = ["unshare", "--pid", "--fork", "--mount", "/bin/sh", "-c", mount_empty, "-"]
            cmd += script
        self.unshare = subprocess.Popen(cmd)
        self.ranks: list[subprocess.Popen[bytes]] = []
        self.init = wait_for(lambda: _children(self.unshare.pid), 30, "the worker's PID 1")[0]
        # Its idle `sleep` running means the TERM trap is set.
        wait_for(
            lambda: any(_comm(c) == "sleep" for c in _children(self.init)), 30, "the idle sleep"
        )

    def start_rank(self) -> subprocess.Popen[bytes]:
        """A rank that runs until a line arrives on its stdin, entered like kubectl exec."""
        enter = ["nsenter", "--target", str(self.init), "--pid", "--mount", "--"]
        rank = subprocess.Popen([*enter, "/bin/sh", "-c", "read line"], stdin=subprocess.PIPE)
        self.ranks.append(rank)
        wait_for(lambda: _children(rank.pid), 30, "the rank inside the namespace")
        return rank

    def terminate(self) -> float:
        os.kill(self.init, signal.SIGTERM)
        return time.monotonic()

    def close(self) -> None:
        # PID 1's death ends everything in its namespace.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)
        self.unshare.wait(30)
        for rank in self.ranks:
            rank.wait(30)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_default_command_waits_for_running_ranks_then_exits_0(
    shell: list[str], workers: list[Worker]
) -> None:
    worker = Worker(shell)
    workers.append(worker)
    rank = worker.start_rank()
    worker.terminate()
    # Neither it nor the rank goes while the rank runs: the kubelet's SIGKILL is the bound.
    with pytest.raises(subprocess.TimeoutExpired):
        worker.unshare.wait(timeout=3)
    assert rank.poll() is None
    assert rank.stdin is not None
    rank.stdin.write(b"done\n")
    rank.stdin.close()
    assert rank.wait(30) == 0  # it left on its own, not by a signal
    assert worker.unshare.wait(30) == 0


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
def test_default_command_without_ranks_exits_0_at_once(
    shell: list[str], workers: list[Worker]
) -> None:
    worker = Worker(shell)
    workers.append(worker)
    sent = worker.terminate()
    assert worker.unshare.wait(30) == 0
    # A drained worker's pod goes away without waiting out its grace period.
    assert time.monotonic() - sent < 5


def test_default_command_without_proc_waits_like_sleep(workers: list[Worker]) -> None:
    worker = Worker(["/bin/sh"], with_proc=False)
    workers.append(worker)
    worker.terminate()
    # It cannot tell whether ranks run, so it leaves the end to the grace period's SIGKILL.
    with pytest.raises(subprocess.TimeoutExpired):
        worker.unshare.wait(timeout=3)


def test_launcher_pod_mount_modes_env_and_init_container() -> None:
    pod = render_pods.launcher_pod(spec_of(), INIT, "abc", 2)
    spec = pod["spec"]
    assert pod["metadata"]["annotations"][names.ANN_CONFIG_HASH] == "abc"
    assert spec["serviceAccountName"] == "job-launcher"
    config = next(v for v in spec["volumes"] if v["name"] == "mpi-job-config")
    assert {i["key"]: i["mode"] for i in config["configMap"]["items"]} == {
        "kubexec.sh": 0o555,
        "hostfile": 0o444,
        "discover_hosts.sh": 0o555,
    }
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["OMPI_MCA_plm_rsh_agent"] == "/etc/mpi/kubexec.sh"
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["I_MPI_HYDRA_BOOTSTRAP"] == "rsh"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ""
    (init,) = spec["initContainers"]
    assert init["image"] == "kubectl:1"
    assert init["securityContext"] == render_pods.KUBECTL_DELIVERY_SECURITY_CONTEXT
    assert set(init["resources"]["limits"]) == {"cpu", "memory"}
    assert {"name": "MIN_WORKERS", "value": "2"} in init["env"]
    assert "/opt/kube" in {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert "initContainers" not in render_pods.launcher_pod(spec_of(), NONE, "abc", 2)["spec"]


def test_exit_code_policy_maps_to_never() -> None:
    job = make_job(1)
    job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "ExitCode"
    assert render_pods.worker_pod(parse(job, 30), 0)["spec"]["restartPolicy"] == "Never"


def test_config_hash_changes_with_the_files_a_running_launcher_reads_again() -> None:
    data = {names.HOSTFILE: "a\n", names.KUBEXEC: "k", names.DISCOVER_HOSTS: "echo a\n"}
    assert render.config_hash(data) == render.config_hash(dict(data))
    for key in (names.KUBEXEC, names.DISCOVER_HOSTS):
        assert render.config_hash(data) != render.config_hash({**data, key: "changed"})
    # Read once, at start: a scale-out's hostfile change costs no launcher patch.
    assert render.config_hash(data) == render.config_hash({**data, names.HOSTFILE: "a\nb\n"})
