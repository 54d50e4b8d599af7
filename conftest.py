"""Root conftest: makes the local-cluster fixtures available to tests/ and e2e/ alike."""

pytest_plugins = [
    "tests.cluster",
    "tests.controller",
    "tests.manifests",
    "tests.gang",
    "tests.kueue",
]
