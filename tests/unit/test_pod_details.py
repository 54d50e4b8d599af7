"""The pod details training-operator 1.9 has: a launcher that is a host, the launcher's
own ServiceAccount, the user's MPI environment kept. Rendering, parsing and the planner."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Create, DeletePod
from mpijob_elastic.core.inputs.ranks import RankSnapshot
from mpijob_elastic.core.objects import render, render_pods
from mpijob_elastic.core.objects.render import exec_names
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.parse import InvalidSpec, launcher_service_account, parse
from mpijob_elastic.machinery.job_memory import IN_USE_RECHECK_SECONDS
from tests.unit.simulation import Cluster, discovered, make_job

NONE = Settings(kubectl_delivery=KubectlDelivery.NONE)
ELASTIC = {names.ANN_MIN_REPLICAS: "2", names.ANN_MAX_REPLICAS: "5"}


def launcher_template(job: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    return template


def gpu_job(replicas: int = 2, **kw: Any) -> dict[str, Any]:
    job = make_job(replicas, **kw)
    launcher_template(job)["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return job


def env_of(container: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in container["env"]]


# -- a launcher that requests a GPU is a host ---------------------------------------------


@pytest.mark.parametrize(
    ("limits", "gpu"),
    [
        ({"nvidia.com/gpu": 1}, True),
        ({"amd.com/gpu": 1}, True),
        ({"gpu.intel.com/i915": 1}, True),
        ({"cpu": "1", "memory": "1Gi"}, False),
        ({}, False),
    ],
)
def test_a_gpu_is_any_limit_named_like_one_as_in_v1(limits: dict[str, Any], gpu: bool) -> None:
    template = {
        "spec": {"containers": [{"name": "a"}, {"name": "b", "resources": {"limits": limits}}]}
    }
    assert render.requests_gpu(template) is gpu


def test_init_containers_and_requests_do_not_make_a_gpu_launcher() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
        }
    }
    assert not render.requests_gpu(template)


def test_the_launcher_line_is_training_operators_byte_for_byte() -> None:
    spec = parse(gpu_job(2, slots=4), 30)
    workers = ["job-worker-0", "job-worker-1"]
    assert render.discover_hosts(spec, workers, launcher=True) == (
        "#!/bin/sh\necho job-launcher:4\n\necho job-worker-0:4\necho job-worker-1:4"
    )
    assert render.discover_hosts(spec, [], launcher=True) == "#!/bin/sh\necho job-launcher:4\n"
    # Without it, the v1 format as before.
    assert render.discover_hosts(spec, workers) == (
        "#!/bin/sh\necho job-worker-0:4\necho job-worker-1:4"
    )
    assert render.hostfile(spec, workers) == (
        "job-launcher slots=4\njob-worker-0 slots=4\njob-worker-1 slots=4\n"
    )


def test_the_script_prints_the_launcher_first_the_blank_line_prints_nothing() -> None:
    spec = parse(gpu_job(2), 30)
    script = render.discover_hosts(spec, ["job-worker-0"], launcher=True)
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["job-launcher:1", "job-worker-0:1"]


def run_delivery(tmp_path: Path, script: str, min_workers: int) -> bool:
    """Run the init container's script against ``script`` as the mounted discovery; True
    if it handed kubectl over within a few seconds."""
    etc, opt, bin_ = tmp_path / "etc", tmp_path / "opt", tmp_path / "bin"
    for d in (etc, opt, bin_):
        d.mkdir(exist_ok=True)
    (etc / names.DISCOVER_HOSTS).write_text(script)
    (bin_ / "kubectl").write_text("#!/bin/sh\n")
    (bin_ / "kubectl").chmod(0o755)
    command = render_pods.KUBECTL_DELIVERY_SCRIPT.replace("/etc/mpi", str(etc)).replace(
        "/opt/kube", str(opt)
    )
    env = {**os.environ, "MIN_WORKERS": str(min_workers), "PATH": f"{bin_}:/usr/bin:/bin"}
    try:
        subprocess.run(["/bin/sh", "-c", command], env=env, timeout=3, check=True)
    except subprocess.TimeoutExpired:
        return False
    return (opt / "kubectl").exists()


def test_kubectl_is_handed_over_once_min_workers_are_listed_not_counting_the_launcher(
    tmp_path: Path,
) -> None:
    spec = parse(gpu_job(2, name="a-worker-1"), 30)
    one = render.discover_hosts(spec, ["a-worker-1-worker-0"], launcher=True)
    assert not run_delivery(tmp_path, one, 2), "the launcher's line counted as a worker"
    two = render.discover_hosts(spec, ["a-worker-1-worker-0", "a-worker-1-worker-1"], True)
    assert run_delivery(tmp_path, two, 2)


def test_a_gpu_launcher_keeps_the_nodes_gpus_and_a_cpu_launcher_never_gets_them() -> None:
    gpu = render_pods.launcher_pod(parse(gpu_job(), 30), NONE, "h", 1)["spec"]["containers"][0]
    assert "NVIDIA_VISIBLE_DEVICES" not in dict(env_of(gpu))
    job = make_job(1)
    launcher_template(job)["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    ]
    cpu = render_pods.launcher_pod(parse(job, 30), NONE, "h", 1)["spec"]["containers"][0]
    assert [v for k, v in env_of(cpu) if k == "NVIDIA_VISIBLE_DEVICES"] == [""]


# -- the launcher's ServiceAccount ---------------------------------------------------------


def test_a_service_account_in_the_template_is_the_launchers_and_is_bound() -> None:
    job = make_job(1)
    launcher_template(job)["spec"]["serviceAccountName"] = "trainer"
    spec = parse(job, 30)
    assert spec.service_account == "trainer"
    assert render.service_account(spec)["metadata"]["name"] == "trainer"
    assert render.service_account(spec)["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    binding = render.role_binding(spec)
    assert binding["metadata"]["name"] == "job-launcher"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": "ns"}]
    assert binding["roleRef"]["name"] == "job-launcher"
    assert render.role(spec, [])["metadata"]["name"] == "job-launcher"
    assert render_pods.launcher_pod(spec, NONE, "h", 1)["spec"]["serviceAccountName"] == "trainer"


def test_without_one_the_launcher_runs_as_its_own() -> None:
    for value in (None, ""):
        job = make_job(1)
        if value is not None:
            launcher_template(job)["spec"]["serviceAccountName"] = value
        spec = parse(job, 30)
        assert spec.service_account == "job-launcher"
        assert launcher_service_account(job) == "job-launcher"
        assert render_pods.launcher_pod(spec, NONE, "h", 1)["spec"]["serviceAccountName"] == (
            "job-launcher"
        )


@pytest.mark.parametrize("bad", ["Trainer", "a_b", "-a", "a\n", "x" * 254, 7, ["a"]])
def test_a_bad_service_account_name_is_refused_naming_the_field(bad: Any) -> None:
    job = make_job(1)
    launcher_template(job)["spec"]["serviceAccountName"] = bad
    with pytest.raises(InvalidSpec) as err:
        parse(job, 30)
    assert str(err.value).startswith(
        "spec.mpiReplicaSpecs.Launcher.template.spec.serviceAccountName: "
        "must be a ServiceAccount name (DNS-1123 subdomain)"
    )


def test_the_caches_lookup_trusts_no_shape() -> None:
    assert launcher_service_account({"metadata": {"name": "j"}, "spec": []}) == "j-launcher"
    job = make_job(1)
    launcher_template(job)["spec"]["serviceAccountName"] = "a.b"
    assert launcher_service_account(job) == "a.b"
    assert parse(job, 30).service_account == "a.b"


# -- the user's MPI environment --------------------------------------------------------------


def test_the_users_mpi_variables_are_kept_and_ours_fill_the_gaps() -> None:
    job = make_job(1)
    launcher_template(job)["spec"]["containers"][0]["env"] = [
        {"name": "I_MPI_HYDRA_BOOTSTRAP", "value": "ssh"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "/data/hosts"},
        {
            "name": "OMPI_MCA_plm_rsh_agent",
            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
        },
        {"name": "MINE", "value": "1"},
    ]
    main = render_pods.launcher_pod(parse(job, 30), NONE, "h", 1)["spec"]["containers"][0]
    assert env_of(main) == [
        ("I_MPI_HYDRA_BOOTSTRAP", "ssh"),
        ("OMPI_MCA_orte_default_hostfile", "/data/hosts"),
        ("OMPI_MCA_plm_rsh_agent", {"configMapKeyRef": {"name": "c", "key": "k"}}),
        ("MINE", "1"),
        ("I_MPI_HYDRA_BOOTSTRAP_EXEC", "/etc/mpi/kubexec.sh"),
        ("MPIJOB_ELASTIC_NOTICE_FILE", "/etc/mpijob-elastic/notice"),
        ("NVIDIA_VISIBLE_DEVICES", ""),
        ("NVIDIA_DRIVER_CAPABILITIES", ""),
    ]


def test_mounts_and_env_go_to_the_main_container_not_the_first() -> None:
    job = make_job(1, mainContainer="main")
    for role in ("Launcher", "Worker"):
        job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"].insert(
            0, {"name": "sidecar", "image": "s"}
        )
    spec = parse(job, 30)
    for pod in (render_pods.launcher_pod(spec, NONE, "h", 1), render_pods.worker_pod(spec, 0)):
        sidecar, main = pod["spec"]["containers"]
        assert "volumeMounts" not in sidecar
        assert "env" not in sidecar
        assert names.CONFIG_MOUNT in {m["mountPath"] for m in main["volumeMounts"]}
    launcher = render_pods.launcher_pod(spec, NONE, "h", 1)["spec"]["containers"][1]
    assert ("OMPI_MCA_plm_rsh_agent", "/etc/mpi/kubexec.sh") in env_of(launcher)


# -- the planner -------------------------------------------------------------------------------


def test_a_gpu_launcher_is_granted_exec_on_itself_once_it_exists_then_listed_first() -> None:
    c = Cluster(gpu_job(2, annotations=dict(ELASTIC)))
    first = c.plan()
    role = next(a.obj for a in first.actions if isinstance(a, Create) and a.obj["kind"] == "Role")
    assert exec_names(role) == {"job-worker-0", "job-worker-1"}, "granted before it exists"
    c.converge()
    assert c.world.violations == []
    written = c.get("Role", "job-launcher")
    assert written is not None
    assert written["rules"][2]["resourceNames"] == [
        "job-launcher",
        "job-worker-0",
        "job-worker-1",
    ]
    config = c.get("ConfigMap", "job-config")
    assert config is not None
    assert config["data"][names.DISCOVER_HOSTS] == (
        "#!/bin/sh\necho job-launcher:1\n\necho job-worker-0:1\necho job-worker-1:1"
    )
    assert config["data"][names.HOSTFILE].startswith("job-launcher slots=1\n")
    # It counts as no worker: two listed, as many as min-replicas asks for.
    assert c.job["status"]["elastic"]["listed"] == 2


def test_a_scale_in_never_takes_the_launcher_and_it_stays_listed() -> None:
    c = Cluster(gpu_job(3, annotations=dict(ELASTIC)))
    c.converge()
    c.set_replicas(2)
    c.converge()
    assert [n for n, _, _ in c.deletions] == ["job-worker-2"]
    assert discovered(c.get("ConfigMap", "job-config")) == [
        "job-launcher",
        "job-worker-0",
        "job-worker-1",
    ]
    assert c.world.violations == []


def test_a_launcher_host_in_the_rank_reports_retires_nothing() -> None:
    c = Cluster(gpu_job(2, annotations=dict(ELASTIC)))
    c.converge()
    # The launcher's remote shell into itself ended while the workers' went on.
    c.reports = RankSnapshot(
        c.now, frozenset({"job-worker-0", "job-worker-1"}), lost=frozenset({"job-launcher"})
    )
    p = c.plan()
    assert p.of_type(DeletePod) == []
    assert p.of_type(Create) == []
    c.apply(p)
    config = c.get("ConfigMap", "job-config")
    assert config is not None
    assert names.ANN_RETIRED_WORKERS not in (config["metadata"].get("annotations") or {})
    assert discovered(config)[0] == "job-launcher"


def test_a_suspended_gpu_job_grants_nothing() -> None:
    c = Cluster(gpu_job(2))
    c.converge()
    c.job["spec"]["runPolicy"] = {"suspend": True}
    c.converge()
    assert c.get("Pod", "job-launcher") is None
    assert exec_names(c.get("Role", "job-launcher")) == set()


def test_a_named_service_account_is_created_owned_and_bound() -> None:
    job = make_job(1)
    launcher_template(job)["spec"]["serviceAccountName"] = "trainer"
    c = Cluster(job)
    c.converge()
    account = c.get("ServiceAccount", "trainer")
    assert account is not None
    assert account["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert c.get("ServiceAccount", "job-launcher") is None
    binding = c.get("RoleBinding", "job-launcher")
    assert binding is not None
    assert binding["subjects"][0]["name"] == "trainer"
    launcher = c.get("Pod", "job-launcher")
    assert launcher is not None
    assert launcher["spec"]["serviceAccountName"] == "trainer"


def test_someone_elses_service_account_is_used_as_it_is() -> None:
    job = make_job(1)
    launcher_template(job)["spec"]["serviceAccountName"] = "trainer"
    c = Cluster(job)
    theirs = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "trainer", "namespace": "ns", "labels": {"team": "a"}},
        "imagePullSecrets": [{"name": "registry"}],
    }
    c.world.create(theirs)
    before = c.get("ServiceAccount", "trainer")
    c.converge()
    assert c.get("ServiceAccount", "trainer") == before, "someone else's object was written"
    binding = c.get("RoleBinding", "job-launcher")
    assert binding is not None
    assert binding["subjects"][0]["name"] == "trainer"
    assert c.get("Pod", "job-launcher") is not None
    conditions = {x["type"]: x for x in c.job["status"]["conditions"]}
    assert conditions.get("WriteRefused", {}).get("status") != "True"
    # Settled: no create tried again until the memory of it ends.
    assert c.plan().actions == ()
    c.tick(IN_USE_RECHECK_SECONDS + 1)
    again = c.plan().of_type(Create)
    assert [a.obj["metadata"]["name"] for a in again] == ["trainer"]
    c.apply(c.plan())
    assert c.get("ServiceAccount", "trainer") == before
