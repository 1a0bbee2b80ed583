"""Places in a JSON document by path, for the fuzz tests that edit a valid policy or review at each."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Path = tuple[str | int, ...]


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every field and item of ``value``, parents first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value
