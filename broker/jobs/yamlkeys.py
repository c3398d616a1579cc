"""YAML read with each mapping's keys checked for duplicates. PyYAML keeps
the last of two equal keys without a word, so `run: a` then `run: b` ran
`b`: a task file with a key given twice is refused, naming the key and both
lines."""
from __future__ import annotations

from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"
# libyaml's parser where PyYAML was built with it (its wheels are): a 1 MB
# task file composes in a third of the pure-Python parser's time, the same
# nodes and constructors, so the same documents and errors with their lines.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKey(ValueError):
    """`field` (dotted) is given at `first` and again at `line` (1-based)."""

    def __init__(self, field: str, first: int, line: int) -> None:
        super().__init__(f"{field}: duplicate key, given at line {first} and again at line {line}: keep one")
        self.field, self.first, self.line = field, first, line


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, refusing a mapping that holds one key twice
    (DuplicateKey). Merge keys (`<<: *base`) may be overridden, as YAML means."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_keys(root: yaml.Node) -> None:
    """Walk the composed document (each node once, however many aliases
    name it) for a mapping with a key given twice."""
    seen: set[int] = set()
    stack: list[tuple[str, yaml.Node]] = [("", root)]
    while stack:
        path, node = stack.pop()
        if id(node) in seen or not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((_join(path, str(i)), item) for i, item in enumerate(node.value))
            continue
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if key.tag == _MERGE:
                continue
            if isinstance(key, yaml.ScalarNode):
                ident = (key.tag, key.value)
                line = key.start_mark.line + 1
                if ident in first:
                    raise DuplicateKey(_join(path, key.value), first[ident], line)
                first[ident] = line
            stack.append((_join(path, str(getattr(key, "value", "?"))), value))


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part
