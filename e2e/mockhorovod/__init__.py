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
