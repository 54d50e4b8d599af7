"""The ConfigMap's files: each reader inverts its writer, the bytes are v1's, and the init
container's count of listed workers counts exactly the workers."""

from __future__ import annotations

import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from mpijob_elastic.core import formats, names

# DNS-1123 labels, as job names are; short enough for "<job>-worker-<index>".
jobs = st.from_regex(r"\A[a-z]([a-z0-9-]{0,20}[a-z0-9])?\Z")
slots = st.integers(min_value=1, max_value=64)
indexes = st.lists(st.integers(min_value=0, max_value=999), unique=True, max_size=12)


@given(jobs, indexes, slots, st.booleans())
def test_discover_hosts_reads_back_what_was_written(
    job: str, workers: list[int], n: int, launcher: bool
) -> None:
    hosts = [names.worker_name(job, i) for i in workers]
    first = names.launcher_name(job) if launcher else None
    text = formats.discover_hosts(hosts, n, first)
    assert (
        formats.discover_hosts_hosts(text)
        == ([names.launcher_name(job)] if launcher else []) + hosts
    )


@given(jobs, indexes, slots)
def test_hostfile_reads_back_what_was_written(job: str, workers: list[int], n: int) -> None:
    hosts = [names.launcher_name(job)] + [names.worker_name(job, i) for i in workers]
    assert formats.hostfile_hosts(formats.hostfile(hosts, n)) == hosts


def test_the_files_are_v1s_byte_for_byte() -> None:
    """Reference §3 and §5a: what users' images and Horovod read."""
    assert formats.hostfile(["j-worker-0", "j-worker-1"], 2) == (
        "j-worker-0 slots=2\nj-worker-1 slots=2\n"
    )
    assert formats.discover_hosts(["j-worker-0", "j-worker-1"], 2) == (
        "#!/bin/sh\necho j-worker-0:2\necho j-worker-1:2"
    )
    assert formats.discover_hosts(["j-worker-0"], 2, "j-launcher") == (
        "#!/bin/sh\necho j-launcher:2\n\necho j-worker-0:2"
    )
    assert formats.discover_hosts([], 2) == "#!/bin/sh\n"
    # v1's lines, with the reports to the ranks ConfigMap around its exec line.
    script = formats.kubexec("/opt/kube/kubectl", None, "j-ranks")
    assert script.startswith("#!/bin/sh\nset -x\nPOD_NAME=$1\nshift\n")
    assert '{ { /opt/kube/kubectl exec ${POD_NAME} -- /bin/sh -c "$*" 3>&- 4>&-;' in script
    assert "/opt/kube/kubectl j-ranks" in script
    assert script.endswith(formats.KUBEXEC_EXIT)
    assert 'kubectl exec ${POD_NAME} --container main -- /bin/sh -c "$*" 3>&-' in (
        formats.kubexec("kubectl", "main", "j-ranks")
    )


def test_a_file_from_another_writer_is_read_the_same() -> None:
    """Horovod ignores blank lines and reads each ``echo``; so do we, whatever else the
    file holds."""
    text = "#!/bin/sh\n\necho a:1\n# echo b:1\necho c:2:3\n  echo d:4  \n"
    assert formats.discover_hosts_hosts(text) == ["a", "c:2", "d"]
    assert formats.hostfile_hosts("\na slots=1\n  b slots=2 max_slots=2\n\n") == ["a", "b"]


@settings(max_examples=40, deadline=None)  # two processes per example
@given(jobs, indexes, slots, st.booleans())
def test_the_init_containers_grep_counts_the_workers_not_the_launcher(
    job: str, workers: list[int], n: int, launcher: bool
) -> None:
    """The same count the init container's shell runs, by the real grep, on the output of
    the real script."""
    hosts = [names.worker_name(job, i) for i in workers]
    script = formats.discover_hosts(hosts, n, names.launcher_name(job) if launcher else None)
    printed = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    counted = subprocess.run(
        ["grep", "-c", formats.WORKER_LINE_PATTERN],
        input=printed.stdout,
        capture_output=True,
        text=True,
    )
    assert int(counted.stdout) == len(hosts)


def test_the_init_containers_count_reads_the_mounted_file() -> None:
    assert formats.count_listed_workers("/etc/mpi/discover_hosts.sh") == (
        '/bin/sh /etc/mpi/discover_hosts.sh | grep -c "worker-[0-9]*:"'
    )
