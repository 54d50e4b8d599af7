"""Parse and validate an MPIJob into the typed spec the planner works from (model.py).

Every error names the field the user has to fix, in the API server's ``field.path: message``
style, because these messages end up in a condition and an Event that users read with
``kubectl describe``. Anything that later reaches a shell script (``kubexec.sh``) or a
child's name is checked here, so no spec value can inject shell or break a name limit.

The CRD keeps pod templates unpruned, so a template can hold any JSON at all. ``parse``
checks the shape of every part of it that render.py reads or extends, so that whatever
``parse`` accepts renders without raising, and it raises nothing but ``InvalidSpec``:
a reconcile that raised would retry for ever without telling the user anything. Each
single field is read by its reader in fields.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.shapes import FieldError, as_int, mapping, pod_template, show
from mpijob_elastic.core.spec import fields
from mpijob_elastic.core.spec.model import DEFAULT_CHECKPOINT_SECONDS, Bounds, JobSpec, ReplicaSpec

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")


class InvalidSpec(Exception):
    """The job cannot be acted on until the user fixes these fields."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = tuple(errors)


def managed_by(job: Mapping[str, Any]) -> str | None:
    # Called before parse, on jobs parse may reject, so it must not trust any shape.
    spec = job.get("spec") if isinstance(job, Mapping) else None
    run_policy = spec.get("runPolicy") if isinstance(spec, Mapping) else None
    value = run_policy.get("managedBy") if isinstance(run_policy, Mapping) else None
    return value if isinstance(value, str) and value else None


def launcher_service_account(job: Mapping[str, Any]) -> str:
    """``JobSpec.service_account`` of a job ``parse`` may reject (for the caches' lookup)."""
    meta = job.get("metadata") if isinstance(job, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    value: Any = job
    for key in ("spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "serviceAccountName"):
        value = value.get(key) if isinstance(value, Mapping) else None
    if isinstance(value, str) and value:
        return value
    return names.launcher_name(str(name))


def _protected_account_errors(
    name: str | None,
    launcher: ReplicaSpec | None,
    worker: ReplicaSpec | None,
    launcher_account: str | None,
    protected: str,
) -> list[FieldError]:
    """A pod running as the controller's ServiceAccount would hold the controller's token:
    exec into every pod it serves, pods with any ServiceAccount. Whoever may create MPIJobs
    in the controller's namespace must not get that, so the fields naming it are refused
    (``serviceAccount`` is the deprecated alias the API server still honours)."""
    errors = []
    for role, replica in (("Launcher", launcher), ("Worker", worker)):
        spec = (replica.template.get("spec") or {}) if replica is not None else {}
        for field in ("serviceAccountName", "serviceAccount"):
            if spec.get(field) == protected:
                errors.append(
                    FieldError(
                        f"spec.mpiReplicaSpecs.{role}.template.spec.{field}",
                        f"names the controller's own ServiceAccount {protected!r}, which no "
                        "job's pod may run as",
                    )
                )
    if launcher_account is None and name is not None and names.launcher_name(name) == protected:
        # The launcher's default ServiceAccount, <job>-launcher, would be the controller's.
        errors.append(
            FieldError(
                "metadata.name",
                f"the launcher's default ServiceAccount {protected!r} is the controller's own; "
                "rename the job or set " + fields.SERVICE_ACCOUNT_FIELD,
            )
        )
    return errors


def _replica_spec(
    specs: Mapping[str, Any], role: str, maximum: int | None, errors: list[FieldError]
) -> ReplicaSpec | None:
    """The role's spec, or None if anything in it was reported."""
    path = f"spec.mpiReplicaSpecs.{role}"
    raw = specs.get(role)
    if not isinstance(raw, Mapping):
        errors.append(FieldError(path, "Required value"))
        return None
    before = len(errors)
    replicas_raw = raw.get("replicas", 1)
    replicas = as_int(replicas_raw)
    if replicas is None:
        errors.append(
            FieldError(f"{path}.replicas", f"must be an integer, got {show(replicas_raw)}")
        )
    elif maximum is not None and replicas > maximum:
        errors.append(
            FieldError(
                f"{path}.replicas",
                f"must be at most {maximum} (the controller's --max-workers-per-job), "
                f"got {show(replicas)}",
            )
        )
    elif not fields.INT32_MIN <= replicas <= fields.INT32_MAX:
        errors.append(
            FieldError(f"{path}.replicas", f"must be a 32-bit integer, got {show(replicas)}")
        )
    restart = fields.choice(
        raw.get("restartPolicy"), f"{path}.restartPolicy", RESTART_POLICIES, "Never", errors
    )
    template = pod_template(raw.get("template"), f"{path}.template", errors)
    if len(errors) > before or replicas is None or template is None:
        return None
    return ReplicaSpec(replicas=replicas, restart_policy=restart, template=template)


def parse(
    job: Mapping[str, Any],
    default_drain_seconds: float,
    *,
    max_workers: int = Settings.max_workers_per_job,
    default_scale_out_timeout: float = Settings.default_scale_out_timeout_seconds,
    protected_service_account: tuple[str, str] | None = None,
) -> JobSpec:
    """Return the job's typed spec, or raise InvalidSpec listing every field to fix.

    Worker replicas outside the job's bounds are *not* an error here: the planner keeps such
    a job running at its current size, which needs the rest of the spec. Asking for more
    than ``max_workers`` is, because it is the controller's limit, not the job's.
    ``protected_service_account`` is the controller's own (namespace, name): no pod of a job
    may run as it (docs/rbac.md).
    """
    if not isinstance(job, Mapping):
        raise InvalidSpec([FieldError("MPIJob", f"must be an object, got {show(job)}")])
    errors: list[FieldError] = []
    meta = mapping(job.get("metadata"), "metadata", errors, required=True)
    raw_spec = mapping(job.get("spec"), "spec", errors, required=True)
    spec = raw_spec or {}
    name, namespace, uid, annotations = fields.metadata(meta, errors)
    slots = fields.slots(spec, errors)
    run_policy = fields.run_policy(spec, errors)
    launcher, worker = _replica_specs(spec, raw_spec is not None, max_workers, errors)
    bounds = _bounds(annotations, max_workers, errors)
    drain = fields.seconds(annotations, names.ANN_DRAIN_SECONDS, default_drain_seconds, errors)
    scale_out_timeout = fields.seconds(
        annotations, names.ANN_SCALE_OUT_TIMEOUT, default_scale_out_timeout, errors
    )
    remove = fields.remove_workers(annotations, name, errors)
    below_min_timeout = _below_min_timeout(annotations, bounds, errors)
    checkpoint = fields.seconds(
        annotations, names.ANN_CHECKPOINT_SECONDS, DEFAULT_CHECKPOINT_SECONDS, errors
    )
    grows, priority_class = fields.opportunistic(annotations, bounds, errors)
    fields.check_name(name, worker, bounds, errors)
    main = fields.main_container(spec, worker, errors)
    account = fields.launcher_account(launcher, errors)
    gloo_timeout = fields.gloo_timeout(launcher, errors)
    if protected_service_account is not None and namespace == protected_service_account[0]:
        errors += _protected_account_errors(
            name, launcher, worker, account, protected_service_account[1]
        )
    if errors or launcher is None or worker is None or slots is None or name is None:
        raise InvalidSpec(errors)
    return JobSpec(
        namespace=namespace or "",
        name=name,
        uid=uid or "",
        slots_per_worker=slots,
        main_container=main,
        clean_pod_policy=run_policy.clean,
        launcher=launcher,
        worker=worker,
        bounds=bounds,
        drain_seconds=drain,
        scale_out_timeout=scale_out_timeout,
        remove=remove,
        below_min_timeout=below_min_timeout,
        checkpoint_seconds=checkpoint,
        opportunistic=grows,
        opportunistic_priority_class=priority_class,
        suspend=run_policy.suspend,
        active_deadline_seconds=run_policy.deadline,
        ttl_seconds_after_finished=run_policy.ttl,
        backoff_limit=run_policy.backoff_limit,
        scheduling_policy=run_policy.scheduling,
        launcher_service_account=account,
        gloo_timeout_seconds=gloo_timeout,
    )


def _replica_specs(
    spec: Mapping[str, Any], has_spec: bool, max_workers: int, errors: list[FieldError]
) -> tuple[ReplicaSpec | None, ReplicaSpec | None]:
    """The Launcher's and the Worker's replica specs."""
    # An unusable spec is reported once, not once more for every field missing from it.
    if not has_spec:
        return None, None
    specs = mapping(spec.get("mpiReplicaSpecs"), "spec.mpiReplicaSpecs", errors, required=True)
    if specs is None:
        return None, None
    launcher = _replica_spec(specs, "Launcher", None, errors)
    worker = _replica_spec(specs, "Worker", max_workers, errors)
    if launcher is not None and launcher.replicas != 1:
        errors.append(
            FieldError(
                "spec.mpiReplicaSpecs.Launcher.replicas",
                f"must be 1, got {show(launcher.replicas)}",
            )
        )
    return launcher, worker


def _bounds(annotations: Mapping[str, Any], max_workers: int, errors: list[FieldError]) -> Bounds:
    bounds = Bounds(
        fields.annotation_int(annotations, names.ANN_MIN_REPLICAS, 0, max_workers, errors),
        fields.annotation_int(annotations, names.ANN_MAX_REPLICAS, 1, max_workers, errors),
    )
    if bounds.min is not None and bounds.max is not None and bounds.min > bounds.max:
        errors.append(
            FieldError(
                f"metadata.annotations[{names.ANN_MIN_REPLICAS}]",
                f"({bounds.min}) must not be above "
                f"metadata.annotations[{names.ANN_MAX_REPLICAS}] ({bounds.max})",
            )
        )
    return bounds


def _below_min_timeout(
    annotations: Mapping[str, Any], bounds: Bounds, errors: list[FieldError]
) -> float:
    below_min_timeout = fields.seconds(annotations, names.ANN_BELOW_MIN_TIMEOUT, 0.0, errors)
    if below_min_timeout > 0 and not bounds.min:
        # Silently never suspending would leave the user believing the job is protected.
        errors.append(
            FieldError(
                f"metadata.annotations[{names.ANN_BELOW_MIN_TIMEOUT}]",
                f"needs {names.ANN_MIN_REPLICAS} of at least 1: only an elastic job has a "
                "minimum to fall below",
            )
        )
    return below_min_timeout
