"""What the running controller is: its version, the commit it was built from, its Python.

The version is the installed package's (pyproject.toml). The commit is known only where
the image build said it: the Dockerfile's ``COMMIT`` build argument (hack/images.sh passes
``git describe --always --dirty``) becomes ``MPIJOB_ELASTIC_COMMIT`` in the image; a
package installed otherwise has none, and says nothing of one rather than guess.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

COMMIT_ENV = "MPIJOB_ELASTIC_COMMIT"


def version() -> str:
    try:
        return package_version("mpijob-elastic")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def commit(env: Mapping[str, str]) -> str:
    return env.get(COMMIT_ENV, "").strip()


def describe(env: Mapping[str, str]) -> str:
    """The line ``mpijob-elastic --version`` prints."""
    known = commit(env)
    built = f"commit {known}, " if known else ""
    return f"mpijob-elastic {version()} ({built}Python {platform.python_version()})"
