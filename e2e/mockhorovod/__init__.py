"""A mock of Horovod's elastic driver (``horovodrun`` in elastic mode) and of its ranks.

The end-to-end suite runs it in the launcher to judge, from the launcher's side, what real
Elastic Horovod would have seen while the controller scaled the workers: which hosts were
added, which were removed gracefully, and which failed and got blacklisted. It is a test
instrument, not a trainer: it reads the same files Horovod reads (``discover_hosts.sh``,
``kubexec.sh``) the way Horovod reads them, and reports every decision as one JSON line.

``python3 -m e2e.mockhorovod`` runs the driver; ``python3 -m e2e.mockhorovod.rank`` is the
rank it starts on every slot. See README.md next to this file for the event lines.
"""

from typing import Final

# The first line a rank prints. A rank whose remote shell exits non-zero before this line
# arrived never ran at all (exec refused, pod missing, broken agent): that is an
# ``exec_failed``, not a training failure.
RANK_STARTED_MARKER: Final = "mockhorovod-rank-started"

# Exit code of a process killed by SIGKILL, which is what a worker's rank reports when its
# pod is deleted under it ("command terminated with exit code 137").
KILLED_EXIT_CODE: Final = 137

# Exit code of a rank made to crash (an uncaught exception in training code exits 1), and
# the file that makes it: created where the rank runs, e.g. by `kubectl exec <worker> --
# touch <file>`, which on KWOK runs on this machine and in a real pod inside it.
CRASH_EXIT_CODE: Final = 1
CRASH_FILE: Final = "/tmp/mockhorovod-crash-{rank_id}"

# Annotation key prefix (plus the rank id) a rank under KWOK's kill emulation keeps on its
# pod while it runs; hack/kwok/stages.yaml keeps a deleted pod with one Terminating.
RANK_ANNOTATION_PREFIX: Final = "kwok.mpijob-elastic.io/rank-"

# Exit code of a rank that learns at a commit that it has no assignment any more (its host
# left discovery, was blacklisted, or lost slots): Horovod's worker aborts with "... has
# been removed from elastic job" (SIGABRT, 134), and the driver ignores that exit only
# because the host has no assignment.
REMOVED_EXIT_CODE: Final = 134
REMOVED_MESSAGE: Final = "has been removed from elastic job"

# What the driver writes into a rank's local stop file when it unassigns the rank (the rank
# exits REMOVED_EXIT_CODE at its next commit); an empty stop file is the shutdown (exit 0).
REMOVED_MARK: Final = "removed"

# A rank with the training's commit hook (``--commit-marker``) keeps ``<alive file>.reset``
# where it runs while it waits for a commit after a reset: created before its start line
# (the reset it joins) and again after each marker. The driver removes it at its first
# commit after that reset ended, on its own machine or through the remote shell; the rank
# then calls the hooked ``state.commit()``, which prints the marker. Removing, not creating,
# so a notice that arrives after the rank has gone leaves nothing.
RESET_FILE_SUFFIX: Final = ".reset"
