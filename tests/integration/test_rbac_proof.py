"""Every verb the shipped ClusterRoles grant is needed (but reading Events, which only
names preemptors: the controller runs without it, below): the controller runs as a
ServiceAccount bound to the roles minus that one verb, and a scenario that needs it fails
(the job's condition, or the controller's log, quotes the API server's 403), while the
controller reports the missing permission at start-up and is not ready.

The controller is the real command, a process acting with a token of its own
ServiceAccount, watching only the test's namespace (so its role is granted there by a
RoleBinding, as in config/namespaced). ``test_with_every_verb_every_scenario_succeeds``
runs the same scenarios with the whole role, so a failure below is the missing verb's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.app.preflight import METRICS_AUTH, REQUIRED, SCHEDULER_EVENTS, Permission
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster
from tests.controller import free_port, metrics_reader, scraper_tls, stop_process, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.manifests import CONFIG, load_documents

pytestmark = pytest.mark.usefixtures("crd")

ACCOUNT = "proof"
RBAC = "rbac.authorization.k8s.io"


def shipped_rules() -> list[dict[str, Any]]:
    """The rules of both shipped ClusterRoles, one (group, resource, verb) per rule."""
    rules = []
    for path in (CONFIG / "rbac" / "role.yaml", CONFIG / "rbac" / "nodes.yaml"):
        for doc in load_documents(path):
            if doc["kind"] != "ClusterRole":
                continue
            for rule in doc["rules"]:
                rules += [
                    {"apiGroups": [g], "resources": [r], "verbs": [v]}
                    for g in rule["apiGroups"]
                    for r in rule["resources"]
                    for v in rule["verbs"]
                ]
    return rules


def matches(rule: dict[str, Any], p: Permission) -> bool:
    resource = p.resource + (f"/{p.subresource}" if p.subresource else "")
    return rule == {"apiGroups": [p.group], "resources": [resource], "verbs": [p.verb]}


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    def logs(self) -> str:
        return self.log_path.read_text()

    def readyz(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError:
            return 0, ""

    def stop(self) -> None:
        stop_process(self.proc)


RunAs = Callable[..., Controller]


@pytest.fixture
def run_as(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[RunAs]:
    """Start the controller as a ServiceAccount holding the shipped rules, minus one."""
    started: list[Controller] = []
    role = f"proof-{namespace}"

    def run(
        without: Permission | None, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> Controller:
        rules = [r for r in shipped_rules() if without is None or not matches(r, without)]
        assert without is None or len(rules) == len(shipped_rules()) - 1, without
        nodes = [r for r in rules if r["resources"] == ["nodes"]]
        ref = {"apiGroup": RBAC, "kind": "ClusterRole"}
        subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}
        objects = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}},
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [r for r in rules if r not in nodes],
            },
            # As config/namespaced grants it: in the served namespace only.
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "RoleBinding",
                "metadata": {"name": ACCOUNT},
                "roleRef": {**ref, "name": role},
                "subjects": [subject],
            },
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": f"{role}-nodes"},
                "rules": nodes,
            },
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{role}-nodes"},
                "roleRef": {**ref, "name": f"{role}-nodes"},
                "subjects": [subject],
            },
        ]
        cluster.apply({"apiVersion": "v1", "kind": "List", "items": objects}, namespace)
        kubeconfig = cluster.service_account_kubeconfig(
            namespace, ACCOUNT, tmp_path / "proof.kubeconfig"
        )
        port = free_port()
        log_path = tmp_path / "controller.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "mpijob_elastic.app.cli", "run",
                    "--kubeconfig", kubeconfig, "--namespaces", namespace,
                    "--kubectl-delivery", "none", "--log-format", "json",
                    "--health-port", str(port), *args,
                ],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            )  # fmt: skip
        controller = Controller(proc, log_path, port)
        started.append(controller)
        return controller

    yield run
    for controller in started:
        controller.stop()
        print(f"--- controller log ---\n{controller.logs()[-20000:]}")
    cluster.kubectl("delete", "clusterrole,clusterrolebinding", f"{role}-nodes", check=False)
    cluster.kubectl("delete", "clusterrole", role, check=False)


# -- scenarios: each ends early once ``done`` says the refusal was seen ---------------------

Done = Callable[[], bool]


def step(done: Done, reached: Callable[[], Any], what: str, timeout: float = 40) -> bool:
    """Wait until the step is reached or the refusal seen; True: go on."""
    wait_for(lambda: done() or reached(), timeout, what)
    return not done()


def start(job: Job, done: Done, drain: str = "2") -> bool:
    job.create(elastic_job(job.name, 1, drain))
    return step(done, lambda: job.hosts() and job.pods(names.ROLE_LAUNCHER), "a started job")


def scale(job: Job, done: Done, drain: str = "2") -> bool:
    if not start(job, done, drain):
        return False
    job.set_workers(2)
    if not step(done, lambda: len(job.hosts()) == 2 and len(job.exec_names()) == 2, "2 hosts"):
        return False
    job.set_workers(1)
    return step(done, lambda: len(job.workers()) == 1, "the surplus worker drained and deleted")


def drain_read(job: Job, done: Done) -> bool:
    """A scale-in whose drain outlasts its floor, its victim named by no report of the
    launcher (none runs kubexec.sh here): the launcher is read by exec (ranks.py)."""
    return scale(job, done, drain="8")


def edit(job: Job, done: Done) -> bool:
    """Someone edits the launcher's ServiceAccount and RoleBinding: both are restored."""
    if not start(job, done):
        return False
    launcher = names.launcher_name(job.name)
    job.cluster.kubectl(
        "label", "-n", job.ns, "serviceaccount", launcher, "app=edited", "--overwrite"
    )
    patch = json.dumps({"subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": job.ns}]})
    job.cluster.kubectl("patch", "-n", job.ns, "rolebinding", launcher, "--type=merge", "-p", patch)

    def restored() -> bool:
        sa = job.cluster.raw("GET", f"/api/v1/namespaces/{job.ns}/serviceaccounts/{launcher}")
        rb = job.cluster.raw("GET", f"/apis/{RBAC}/v1/namespaces/{job.ns}/rolebindings/{launcher}")
        return bool(
            sa and rb and sa["metadata"]["labels"]["app"] == job.name
            and rb["subjects"][0]["name"] == launcher
        )  # fmt: skip

    return step(done, restored, "the ServiceAccount and RoleBinding restored")


def budget(job: Job) -> dict[str, Any] | None:
    path = f"/apis/policy/v1/namespaces/{job.ns}/poddisruptionbudgets"
    return job.cluster.raw("GET", f"{path}/{names.disruption_budget_name(job.name)}")


def bounds(job: Job, done: Done) -> bool:
    """A new min-replicas: the PodDisruptionBudget follows it, then suspending drops it."""
    if not start(job, done):
        return False
    job.patch(
        {
            "metadata": {"annotations": {names.ANN_MIN_REPLICAS: "2"}},
            "spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2}}},
        }
    )

    def follows() -> bool:
        pdb = budget(job)
        return bool(pdb and pdb["spec"].get("minAvailable") == 2)

    if not step(done, follows, "the budget at 2"):
        return False
    job.patch({"spec": {"runPolicy": {"suspend": True}}})
    return step(done, lambda: budget(job) is None, "the budget dropped")


def take_over(job: Job, done: Done) -> bool:
    """Children the job controls that lack our labels (training-operator made them, or
    someone removed ours) get them merged back by patch (docs/handover.md)."""
    if not start(job, done):
        return False
    launcher = names.launcher_name(job.name)
    children = [
        ("configmap", names.config_map_name(job.name)),
        ("serviceaccount", launcher),
        ("role", launcher),
        ("rolebinding", launcher),
    ]
    for kind, name in children:
        job.cluster.kubectl(
            "label", kind, name, "-n", job.ns, f"{names.LABEL_JOB}-", f"{names.LABEL_GROUP}-"
        )

    def relabelled() -> bool:
        return all(
            names.LABEL_JOB in (cluster_labels(job, kind, name) or {}) for kind, name in children
        )

    return step(done, relabelled, "our labels merged back")


def cluster_labels(job: Job, kind: str, name: str) -> dict[str, str] | None:
    out = job.cluster.kubectl(
        "get", kind, name, "-n", job.ns, "-o", "jsonpath={.metadata.labels}", check=False
    )
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout else None


def finish(job: Job, done: Done) -> bool:
    """runPolicy.ttlSecondsAfterFinished: 0 deletes the job once its launcher succeeds."""
    manifest = elastic_job(job.name, 1)
    manifest["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 0}
    job.create(manifest)
    if not step(done, lambda: job.pods(names.ROLE_LAUNCHER), "the launcher"):
        return False
    annotation = "kwok.mpijob-elastic.io/exit-code=0"
    launcher = names.launcher_name(job.name)
    job.cluster.kubectl("annotate", "pod", launcher, "-n", job.ns, annotation)
    path = f"{job.path}/{job.name}"
    return step(done, lambda: job.cluster.raw("GET", path) is None, "the job deleted")


def nothing(job: Job, done: Done) -> bool:
    """The caches alone: a controller that cannot list or watch a kind never syncs."""
    return True


Scenario = Callable[[Job, Done], bool]


def forbidden(p: Permission) -> str:
    resource = p.resource + (f"/{p.subresource}" if p.subresource else "")
    return f'cannot {p.verb} resource \\"{resource}\\"'


def escalation(resource: str) -> str:
    # The API server's refusal of a Role holding a rule we do not hold ourselves.
    return f'Resources:[\\"{resource}\\"]'


# What needs each verb, and the words of its refusal. Refusals of a job's writes are in its
# conditions (and the log); the rest only in the log: a status that cannot be written,
# a lost Event, a cache that cannot list or watch, a launcher that cannot be read.
def proof(p: Permission) -> tuple[Scenario, str] | None:
    key = (p.resource + (f"/{p.subresource}" if p.subresource else ""), p.verb)
    if p.verb in ("list", "watch"):
        return nothing, forbidden(p)
    return {
        ("mpijobs", "delete"): (finish, forbidden(p)),
        ("mpijobs/status", "patch"): (start, forbidden(p)),
        # Only clusters running the OwnerReferencesPermissionEnforcement admission plugin
        # refuse children without it; the test cluster runs the default plugins.
        ("mpijobs/finalizers", "update"): None,
        # The launcher's Role grants pods get (kubectl exec reads the pod first), and
        # RBAC lets us grant only what we hold.
        ("pods", "get"): (start, escalation("pods") + ', Verbs:[\\"get\\"]'),
        ("pods", "create"): (start, forbidden(p)),
        ("pods", "delete"): (scale, forbidden(p)),
        ("pods", "patch"): (scale, forbidden(p)),
        ("pods/exec", "get"): (drain_read, forbidden(p)),
        ("pods/exec", "create"): (start, escalation("pods/exec")),
        # The launcher's Role grants get on its job's ranks ConfigMap (kubectl patch
        # reads the object first), and RBAC lets us grant only what we hold.
        ("configmaps", "get"): (
            start,
            escalation("configmaps") + ', ResourceNames:[\\"proof-ranks',
        ),
        ("configmaps", "create"): (start, forbidden(p)),
        ("configmaps", "update"): (scale, forbidden(p)),
        # The launcher's Role grants patch on that ConfigMap too (its reports).
        ("configmaps", "patch"): (
            start,
            escalation("configmaps") + ', ResourceNames:[\\"proof-ranks',
        ),
        ("serviceaccounts", "create"): (start, forbidden(p)),
        ("serviceaccounts", "update"): (edit, forbidden(p)),
        ("serviceaccounts", "patch"): (take_over, forbidden(p)),
        ("roles", "create"): (start, forbidden(p)),
        ("roles", "update"): (scale, forbidden(p)),
        ("roles", "patch"): (take_over, forbidden(p)),
        ("rolebindings", "create"): (start, forbidden(p)),
        ("rolebindings", "update"): (edit, forbidden(p)),
        ("rolebindings", "patch"): (take_over, forbidden(p)),
        ("poddisruptionbudgets", "create"): (start, forbidden(p)),
        ("poddisruptionbudgets", "update"): (bounds, forbidden(p)),
        ("poddisruptionbudgets", "delete"): (bounds, forbidden(p)),
        ("events", "create"): (start, forbidden(p)),
    }[key]


def describe(p: Permission) -> str:
    return p.describe("").removesuffix(" in all namespaces").replace(" ", "-")


@pytest.mark.parametrize("permission", REQUIRED, ids=describe)
def test_without_the_verb_a_scenario_fails_and_the_controller_says_so(
    cluster: Cluster, namespace: str, run_as: RunAs, permission: Permission
) -> None:
    controller = run_as(permission)
    missing = permission.describe(namespace)
    wait_for(
        lambda: (r := controller.readyz())[0] == 503 and missing in r[1],
        60,
        f"/readyz naming {missing}",
    )
    _, body = controller.readyz()
    assert f"missing 1 permission(s): {missing}." in body, body
    assert '"start-up check failed"' in controller.logs()
    found = proof(permission)
    if found is None:
        return
    scenario, refusal = found
    job = Job(cluster, namespace, "proof")

    def refused() -> bool:
        return refusal in controller.logs()

    # Some refusals stop the scenario, others (a lost Event, a status never written, a
    # probe that fails) let it go on: either way the refusal must come.
    scenario(job, refused)
    wait_for(refused, 40, f"the controller to meet {refusal}")
    if refusal != forbidden(permission) or permission.verb in ("list", "watch"):
        return
    if (permission.resource, permission.subresource) in (("mpijobs", "status"), ("events", "")):
        return  # nothing can reach the job without these
    if (permission.resource, permission.subresource) == ("pods", "exec"):
        return  # a probe that fails only lets drains run to their deadline
    # The job itself says what was refused, quoting the server.
    wait_for(
        lambda: any(
            c.get("reason") == "Forbidden" and refusal.replace("\\", "") in c.get("message", "")
            for c in job.get().get("status", {}).get("conditions", [])
        ),
        30,
        "a condition quoting the refusal",
    )


def test_with_every_verb_every_scenario_succeeds(
    cluster: Cluster, namespace: str, run_as: RunAs
) -> None:
    """The control: the same scenarios, the whole role, nothing refused, ready."""
    controller = run_as(None)
    wait_for(lambda: controller.readyz()[0] == 200, 60, "/readyz ok")
    for n, scenario in enumerate((scale, edit, bounds, take_over, finish)):
        job = Job(cluster, namespace, f"control-{n}")
        assert scenario(job, lambda: False), scenario.__name__
    assert "forbidden" not in controller.logs().lower()
    assert NO_PREEMPTORS not in controller.logs()
    assert controller.readyz()[0] == 200


NO_PREEMPTORS = "may not read the scheduler's Preempted Events"


@pytest.mark.parametrize("permission", SCHEDULER_EVENTS, ids=describe)
def test_without_reading_events_the_controller_runs_and_says_so(
    cluster: Cluster, namespace: str, run_as: RunAs, permission: Permission
) -> None:
    """The scheduler's Preempted Events only name preemptors (app/preemptions.py): without
    them the controller is ready and works, and its log says what it leaves out (the
    Preempted Events of its jobs say so too: tests/unit/test_preemptors.py)."""
    controller = run_as(permission)
    wait_for(lambda: controller.readyz()[0] == 200, 60, "/readyz ok")
    assert NO_PREEMPTORS in controller.logs()
    assert start(Job(cluster, namespace, "proof"), lambda: False)
    assert "forbidden" not in controller.logs().lower()


def scrape(port: int, token: str) -> int:
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=scraper_tls()) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_serving_metrics_needs_the_reviews_of_config_rbac_metrics_auth(
    cluster: Cluster, namespace: str, run_as: RunAs
) -> None:
    """With --metrics-port, the shipped roles above are not enough: the start-up check
    names both reviews, and a scrape is refused (500, never the metrics) until the
    metrics-auth ClusterRole is bound; then the controller turns ready on its own and
    the scrape is served."""
    token = metrics_reader(cluster, namespace, "scraper")
    binding = f"{namespace}-{ACCOUNT}-metrics-auth"
    try:
        port = free_port()
        controller = run_as(None, args=("--metrics-port", str(port)))
        missing = [p.describe("") for p in METRICS_AUTH]
        wait_for(
            lambda: (r := controller.readyz())[0] == 503 and all(m in r[1] for m in missing),
            60,
            f"/readyz naming {missing}",
        )
        assert f"missing {len(missing)} permission(s): " in controller.readyz()[1]
        assert scrape(port, token) == 500
        assert "metrics scrape not reviewed" in controller.logs()
        cluster.kubectl("apply", "-f", str(CONFIG / "rbac" / "metrics_auth.yaml"))
        cluster.kubectl(
            "create", "clusterrolebinding", binding, "--clusterrole=mpijob-elastic-metrics-auth",
            f"--serviceaccount={namespace}:{ACCOUNT}",
        )  # fmt: skip
        # The check runs again every 30 s.
        wait_for(lambda: controller.readyz()[0] == 200, 60, "/readyz ok once bound")
        assert scrape(port, token) == 200
    finally:
        cluster.kubectl("delete", "clusterrolebinding", binding, check=False)
        cluster.kubectl("delete", "clusterrolebinding", f"{namespace}-scraper", check=False)


@pytest.fixture
def elsewhere(cluster: Cluster, namespace: str) -> Iterator[str]:
    other = f"{namespace}-else"
    cluster.kubectl("create", "namespace", other)
    yield other
    cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_namespaced_controller_ignores_other_namespaces(
    cluster: Cluster, namespace: str, elsewhere: str, run_as: RunAs
) -> None:
    """config/namespaced: rights in the listed namespaces only, and jobs elsewhere left
    alone (not tried and refused: not seen at all)."""
    controller = run_as(None)
    wait_for(lambda: controller.readyz()[0] == 200, 60, "/readyz ok")
    ignored = Job(cluster, elsewhere, "ignored")
    ignored.create(elastic_job(ignored.name, 1))
    served = Job(cluster, namespace, "served")
    assert start(served, lambda: False)
    # The served job started after the other was created: a window, not a wait.
    assert ignored.pods() == {}
    assert ignored.pods(names.ROLE_LAUNCHER) == {}
    assert ignored.config() == {}
    assert "status" not in ignored.get() or not ignored.get()["status"]
    assert "forbidden" not in controller.logs().lower()


def test_a_taken_config_map_name_is_reported_with_its_holder(
    cluster: Cluster, namespace: str, run_as: RunAs
) -> None:
    """With the shipped role, which has no get on ConfigMaps, the conflict report still
    names who holds the name: the holder is read as a list narrowed to the name."""
    holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "holder"}}
    cluster.apply(holder, namespace)
    holder_uid = json.loads(
        cluster.kubectl("get", "configmap", "holder", "-n", namespace, "-o", "json").stdout
    )["metadata"]["uid"]
    job = Job(cluster, namespace, "taken")
    owned = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{job.name}-config",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "holder",
                    "uid": holder_uid,
                    "controller": True,
                }
            ],
        },
    }
    cluster.apply(owned, namespace)
    controller = run_as(None)
    wait_for(lambda: controller.readyz()[0] == 200, 60, "/readyz ok")
    job.create(elastic_job(job.name, 1))
    want = (
        f"ConfigMap {job.name}-config already exists and is not this job's (owner ConfigMap/holder)"
    )
    wait_for(
        lambda: any(
            want in c.get("message", "") for c in job.get().get("status", {}).get("conditions", [])
        ),
        40,
        want,
    )
    assert "could not be read" not in controller.logs()


def test_a_job_naming_the_controllers_service_account_is_refused(
    cluster: Cluster, namespace: str, run_as: RunAs
) -> None:
    """The controller knows its ServiceAccount from the Deployment's env; a job in its
    namespace whose worker template names it gets InvalidSpec naming the field, no pod."""
    controller = run_as(None, {"POD_NAMESPACE": namespace, "POD_SERVICE_ACCOUNT": ACCOUNT})
    wait_for(lambda: controller.readyz()[0] == 200, 60, "/readyz ok")
    job = Job(cluster, namespace, "sneaky")
    manifest = elastic_job(job.name, 1)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAccountName"] = (
        ACCOUNT
    )
    job.create(manifest)
    field = "spec.mpiReplicaSpecs.Worker.template.spec.serviceAccountName"
    cond = wait_for(lambda: job.condition("InvalidSpec"), 30, "InvalidSpec")
    assert cond["status"] == "True"
    assert field in cond["message"], cond
    assert f"controller's own ServiceAccount '{ACCOUNT}'" in cond["message"], cond
    # A job elsewhere in the namespace runs as usual, so the refusal is this job's alone.
    other = Job(cluster, namespace, "honest")
    assert start(other, lambda: False)
    assert job.pods() == {}
    assert job.pods(names.ROLE_LAUNCHER) == {}


def test_the_launcher_may_write_its_ranks_configmap_and_nothing_else(
    cluster: Cluster, namespace: str, run_as: RunAs, tmp_path: Path
) -> None:
    """The reports' grant (docs/rbac.md): get and patch on `<job>-ranks`, by name; the
    launcher still cannot read or write any other ConfigMap, its job's own config
    included, nor list them."""
    run_as(None)
    job = Job(cluster, namespace, "reports")
    assert start(job, lambda: False)
    launcher = names.launcher_name(job.name)
    kubeconfig = cluster.service_account_kubeconfig(namespace, launcher, tmp_path / "l.conf")

    def as_launcher(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [cluster.kubectl_path, "--kubeconfig", kubeconfig, "-n", namespace, *args],
            capture_output=True,
            text=True,
            check=False,
        )

    report = json.dumps({"data": {f"{job.name}-worker-0_1_2": "start"}})
    ranks = names.ranks_name(job.name)
    wait_for(
        lambda: (
            as_launcher("patch", "configmap", ranks, "--type=merge", "-p", report).returncode == 0
        ),
        20,
        "the launcher's report accepted",
    )
    for args in (
        ("patch", "configmap", names.config_map_name(job.name), "--type=merge", "-p", report),
        ("get", "configmap", names.config_map_name(job.name)),
        ("get", "configmaps"),
        ("delete", "configmap", ranks),
        ("replace", "--raw", f"/api/v1/namespaces/{namespace}/configmaps/{ranks}", "-f", "-"),
    ):
        refused = as_launcher(*args)
        assert refused.returncode != 0, args
        assert "forbidden" in refused.stderr.lower(), (args, refused.stderr)
