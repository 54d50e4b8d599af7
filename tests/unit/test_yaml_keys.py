"""Every YAML file we ship or test with has each mapping key once.

PyYAML keeps the last of two equal keys without a word, so a rule that lost its
`- expression:` line in a merge read as a valid policy in every Python test while
`kubectl apply` refused the file. Chart templates with Go templating are left to helm
(tests/integration/test_chart.py renders them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("config", "charts", "tests", "e2e")


class _StrictLoader(yaml.SafeLoader):
    pass


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _files() -> list[Path]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.y*ml")):
            if "{{" not in path.read_text():
                found.append(path)
    return found


def test_the_files_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert "config/admission/policy.yaml" in names
    assert "charts/mpijob-elastic/templates/admission-policy.yaml" in names


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_key_twice(path: Path) -> None:
    list(yaml.load_all(path.read_text(), Loader=_StrictLoader))


def test_a_key_twice_is_found() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'message'"):
        yaml.load("- message: a\n  message: b\n", Loader=_StrictLoader)
