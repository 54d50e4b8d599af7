"""Typed controller settings, filled from the command line (see cli.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mpijob_elastic.core.nodes import DEFAULT_LEAVING_TAINTS


class KubectlDelivery(StrEnum):
    """How the launcher gets the kubectl that ``kubexec.sh`` runs.

    INIT_CONTAINER is the v1 way: an init container copies kubectl from an image into an
    emptyDir at /opt/kube. NONE is for launcher images that ship kubectl on their PATH.
    """

    INIT_CONTAINER = "init-container"
    NONE = "none"


@dataclass(frozen=True)
class Settings:
    # Empty means every namespace but ``skipped_namespaces``.
    namespaces: tuple[str, ...] = ()
    # Where every namespace is served, these are not: no job in them is watched, so the
    # controller writes nothing there. A pod the controller made in one could run as any of
    # its ServiceAccounts, which in kube-system is the cluster (docs/rbac.md). The command
    # line adds the controller's own namespace (flags.py).
    skipped_namespaces: tuple[str, ...] = ("kube-system", "kube-public")
    # Manage only jobs whose spec.runPolicy.managedBy names this controller, so it can run
    # beside training-operator 1.9 (which skips such jobs).
    only_managed_by: bool = False
    kubectl_delivery: KubectlDelivery = KubectlDelivery.INIT_CONTAINER
    # Any image with /bin/sh and kubectl on PATH.
    kubectl_image: str = "docker.io/alpine/k8s:1.34.1"
    # Long enough for Horovod to see a shorter host list (the launcher's mounted file is
    # refreshed at once by the config-hash annotation, and Horovod polls discovery every
    # second) and for the ranks to reach their next commit and leave on their own.
    default_drain_seconds: float = 30.0
    # How long a new worker may take to run before it is given up (0: wait forever). Long
    # enough for a cluster autoscaler to bring up a GPU node and pull a large image.
    default_scale_out_timeout_seconds: float = 600.0
    # Node taints that mean the node is going away (nodes.py): elastic jobs move their
    # workers off such a node, and off a cordoned one, before it goes.
    leaving_node_taints: tuple[str, ...] = DEFAULT_LEAVING_TAINTS
    # Elastic by capacity (opportunistic.py): the PriorityClass opportunistic workers run
    # at unless the job names its own (config/default ships it), and the longest pause
    # between growth probes once capacity ran out (the pause doubles from 10 s up to it).
    opportunistic_priority_class: str = "mpijob-elastic-opportunistic"
    growth_backoff_max_seconds: float = 300.0
    # Reconciles of different jobs at once. Each waits on the API server most of its turn,
    # so it is round trips, not CPU, that these overlap: with 4, a mass rescale of 500 jobs
    # waited on the controller, not on the server (docs/benchmarks.md).
    reconcile_workers: int = 32
    # A job asking for more (Worker.replicas or either bound annotation) gets InvalidSpec, so
    # the work of planning one job and the objects it writes stay bounded: a job asking for
    # 200000 workers once took 57 s of CPU and delayed every other job.
    # What grows per worker is the launcher Role's resourceNames and the ConfigMap. With a
    # 63-character worker name a worker costs 67 bytes of Role JSON and 143 bytes of
    # ConfigMap data (hostfile "<name> slots=1\n", 72; discover_hosts.sh "echo <name>:1\n",
    # 71), 161 with a 10-digit slotsPerWorker: at 1000 workers that is 67 KB and 161 KB,
    # well under etcd's 1.5 MiB per object and the 1 MiB a ConfigMap's data may hold (the
    # first limit reached, near 6500 workers). Larger MPI jobs exist; raise it for them.
    max_workers_per_job: int = 1000
    # Kueue runs with its ElasticJobsViaWorkloadSlices feature gate: elastic jobs labelled
    # for a Kueue queue grow and shrink by workload slices (docs/scheduling.md, "Kueue").
    # It must match Kueue's gate: without the gate Kueue would count each slice on its own.
    kueue_workload_slices: bool = False
    # Kueue runs with manageJobsWithoutQueueName: a job without the queue label is Kueue's
    # too, queued in the namespace's LocalQueue "default" (Kueue's LocalQueueDefaulting);
    # where there is none Kueue never admits it, and it waits (docs/scheduling.md).
    kueue_manage_jobs_without_queue_name: bool = False
    # The controller's own (namespace, ServiceAccount), from the Deployment's downward API
    # env (cli.py): a job in that namespace whose pods would run as it gets InvalidSpec.
    # None: not known (run outside a cluster), nothing to protect.
    own_service_account: tuple[str, str] | None = None
    # The gang scheduler, as training-operator 1.9's --gang-scheduler-name: empty (or
    # "none") for none, "volcano" for Volcano's PodGroup, any other name for the
    # scheduler-plugins (coscheduling) PodGroup, that name being the pods' schedulerName
    # (podgroups.py).
    gang_scheduler_name: str = ""
