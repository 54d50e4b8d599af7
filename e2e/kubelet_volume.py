"""A stand-in for the kubelet's ConfigMap volume of the launcher pod, for KWOK clusters.

On a real node the kubelet writes the ConfigMap's keys into the launcher's ``/etc/mpi``
when it syncs the pod: at once when the pod object changes (the controller's config-hash
annotation is such a change), otherwise on its periodic sync, up to about a minute later.
KWOK has no kubelet volumes, so this process does the same for a local directory the mock
driver reads, with its own credentials (the launcher's Role may not read ConfigMaps). It
copies what the kubelet would copy, when the kubelet would copy it, so the end-to-end
timings include the propagation a user gets.

It also logs, one JSON line each, what it observes for the timeline: ConfigMap changes,
file syncs (and what triggered them), and worker pods starting, being deleted, and (after
any grace period) leaving the API.

    python -m e2e.kubelet_volume --kubeconfig K --namespace NS --job NAME [--dir DIR]

With ``--notice-file`` it also writes the launcher's notice annotation there, as the
kubelet writes its ``downwardAPI`` file (docs/formats.md, "The notice"): empty when there
is none, rewritten when the pod object changes.

Without ``--dir`` it only observes: on a cluster with real kubelets (kind) the files are
theirs to write, and this process just records the timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config

from mpijob_elastic.core import names
from mpijob_elastic.core.objects.render import config_hash
from mpijob_elastic.machinery.informer import DELETED, Informer

# The kubelet's periodic pod sync: a ConfigMap change reaches a pod that nobody touches
# within about this long (plus its cache delay).
PERIODIC_SYNC_SECONDS = 60.0
MODES = {names.KUBEXEC: 0o555, names.HOSTFILE: 0o444, names.DISCOVER_HOSTS: 0o555}


class Volume:
    def __init__(
        self,
        job: str,
        directory: Path | None,
        log_file: Path | None,
        notice_file: Path | None = None,
    ) -> None:
        self.job = job
        self.notice_file = notice_file
        self.notice: str | None = None
        self.dir = directory
        self.log_file = log_file
        self.config: dict[str, str] | None = None
        self.synced_hash: str | None = None
        self.launcher_version: str | None = None
        self.running: set[str] = set()
        self.wake = asyncio.Event()

    def log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ts": time.time(), "event": event, **fields})
        print(line, flush=True)
        if self.log_file:
            with self.log_file.open("a") as f:
                f.write(line + "\n")

    def on_config(self, type_: str, cm: dict[str, Any]) -> None:
        if cm["metadata"]["name"] != names.config_map_name(self.job) or type_ == DELETED:
            return
        data = dict(cm.get("data") or {})
        if data != self.config:
            self.config = data
            self.log("configmap_updated", hash=config_hash(data))
            if self.synced_hash is None:
                # The kubelet fills the volume when it starts the pod; the pod may have
                # been seen before the ConfigMap, so the first content is written now.
                self.wake.set()

    def on_pod(self, type_: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if name == names.launcher_name(self.job):
            if type_ != DELETED and pod["metadata"]["resourceVersion"] != self.launcher_version:
                # Any update of the pod object makes the kubelet sync it now.
                self.launcher_version = pod["metadata"]["resourceVersion"]
                self.wake.set()
                self.write_notice(pod)
            return
        if type_ == DELETED:
            # The end of a terminating pod, which a grace period can put well after the
            # deletion: only then can a pod of the same name replace it.
            self.log("pod_removed", pod=name, uid=pod["metadata"].get("uid"))
        phase = (pod.get("status") or {}).get("phase")
        gone = type_ == DELETED or pod["metadata"].get("deletionTimestamp")
        if gone and name in self.running:
            self.running.discard(name)
            self.log("pod_deleted", pod=name)
        elif not gone and phase == "Running" and name not in self.running:
            self.running.add(name)
            self.log("pod_running", pod=name)

    def write_notice(self, pod: dict[str, Any]) -> None:
        if self.notice_file is None:
            return
        text = (pod["metadata"].get("annotations") or {}).get(names.ANN_NOTICE) or ""
        if text == self.notice:
            return
        tmp = self.notice_file.with_name(f".{self.notice_file.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.notice_file)
        self.notice = text
        self.log("notice_synced", notice=text)

    def sync(self, trigger: str) -> None:
        if self.dir is None or self.config is None or self.launcher_version is None:
            return  # observing only, or no pod to mount it in yet
        digest = config_hash(self.config)
        if digest == self.synced_hash:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for key, mode in MODES.items():
            # Atomic per file, as the kubelet's atomic writer swaps the whole directory:
            # the driver must never run a half-written script.
            tmp = self.dir / f".{key}.tmp"
            tmp.write_text(self.config.get(key, ""))
            tmp.chmod(mode)
            os.replace(tmp, self.dir / key)
        self.synced_hash = digest
        self.log("files_synced", hash=digest, trigger=trigger)

    async def run(self, stop: asyncio.Event) -> None:
        last_periodic = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            if self.wake.is_set():
                self.wake.clear()
                self.sync("pod-start" if self.synced_hash is None else "pod-update")
            if time.monotonic() - last_periodic >= PERIODIC_SYNC_SECONDS:
                last_periodic = time.monotonic()
                self.sync("periodic")


async def main_async(args: argparse.Namespace) -> None:
    api = await kube_config.new_client_from_config(config_file=args.kubeconfig)
    volume = Volume(
        args.job,
        Path(args.dir) if args.dir else None,
        Path(args.log_file) if args.log_file else None,
        Path(args.notice_file) if args.notice_file else None,
    )
    selector = f"{names.LABEL_JOB}={args.job}"
    informers = [
        Informer(
            api,
            "/api/v1",
            "configmaps",
            volume.on_config,
            namespace=args.namespace,
            label_selector=selector,
        ),
        Informer(
            api, "/api/v1", "pods", volume.on_pod, namespace=args.namespace, label_selector=selector
        ),
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    for informer in informers:
        informer.start()
    try:
        await volume.run(stop)
    finally:
        for informer in informers:
            await informer.stop()
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--dir", help="the local /etc/mpi; without it, only observe")
    parser.add_argument("--log-file")
    parser.add_argument("--notice-file", help="the launcher's notice file; without it, none")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
