"""Rendering: the v1 children, byte for byte where users' images depend on them."""

from __future__ import annotations

from mpijob_elastic import names, render
from mpijob_elastic.settings import KubectlDelivery, Settings
from mpijob_elastic.spec import JobSpec, parse
from tests.unit.simulation import make_job

INIT = Settings(kubectl_delivery=KubectlDelivery.INIT_CONTAINER, kubectl_image="kubectl:1")
NONE = Settings(kubectl_delivery=KubectlDelivery.NONE)


def spec_of(**changes: object) -> JobSpec:
    job = make_job(2, slots=2)
    job["spec"].update(changes)
    return parse(job, 30)


def test_kubexec_is_the_v1_script() -> None:
    assert render.kubexec(spec_of(), INIT) == (
        "#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n"
        '/opt/kube/kubectl exec ${POD_NAME} -- /bin/sh -c "$*"'
    )
    assert render.kubexec(spec_of(mainContainer="main"), NONE).endswith(
        'kubectl exec ${POD_NAME} --container main -- /bin/sh -c "$*"'
    )


def test_hostfile_and_discovery_formats() -> None:
    spec = spec_of()
    assert render.hostfile(spec, 2) == "job-worker-0 slots=2\njob-worker-1 slots=2\n"
    assert render.discover_hosts(spec, ["job-worker-0"]) == "#!/bin/sh\necho job-worker-0:2"
    assert render.discover_hosts(spec, []) == "#!/bin/sh\n"


def test_gpu_launcher_gets_a_hostfile_line_and_keeps_its_gpus() -> None:
    job = make_job(1)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    spec = parse(job, 30)
    assert render.hostfile(spec, 1) == "job-launcher slots=1\njob-worker-0 slots=1\n"
    env = render.launcher_pod(spec, NONE, "h", 1)["spec"]["containers"][0]["env"]
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
        render.worker_pod(spec, 1),
        render.launcher_pod(spec, NONE, "h", 1),
    ):
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["ownerReferences"] == [render.owner_reference(spec)]
        assert meta["labels"][names.LABEL_GROUP] == "kubeflow.org"
        assert meta["labels"][names.LABEL_JOB] == "job"
    assert render.worker_pod(spec, 1)["metadata"]["labels"][names.LABEL_INDEX] == "1"
    assert names.LABEL_ROLE not in render.config_map(spec, {})["metadata"]["labels"]


def test_worker_pod_mounts_kubexec_and_sleeps() -> None:
    pod = render.worker_pod(spec_of(), 0)
    container = pod["spec"]["containers"][0]
    assert (container["command"], container["args"]) == (["sleep"], ["365d"])
    assert container["volumeMounts"] == [{"name": "mpi-job-config", "mountPath": "/etc/mpi"}]
    (volume,) = pod["spec"]["volumes"]
    assert volume["configMap"]["items"] == [
        {"key": "kubexec.sh", "path": "kubexec.sh", "mode": 0o555}
    ]


def test_launcher_pod_mount_modes_env_and_init_container() -> None:
    pod = render.launcher_pod(spec_of(), INIT, "abc", 2)
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
    assert {"name": "MIN_WORKERS", "value": "2"} in init["env"]
    assert "/opt/kube" in {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert "initContainers" not in render.launcher_pod(spec_of(), NONE, "abc", 2)["spec"]


def test_exit_code_policy_maps_to_never() -> None:
    job = make_job(1)
    job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "ExitCode"
    assert render.worker_pod(parse(job, 30), 0)["spec"]["restartPolicy"] == "Never"


def test_config_hash_changes_with_the_data_only() -> None:
    assert render.config_hash({"a": "1"}) == render.config_hash({"a": "1"})
    assert render.config_hash({"a": "1"}) != render.config_hash({"a": "2"})
