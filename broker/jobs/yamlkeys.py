"""YAML read with each mapping's keys checked for duplicates. PyYAML keeps
the last of two equal keys without a word, so `run: a` then `run: b` ran
`b`: a task file with a key given twice is refused, naming the key and both
lines."""
from __future__ import annotations

from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"
_NULL = "tag:yaml.org,2002:null"
# libyaml's parser where PyYAML was built with it (its wheels are): a 1 MB
# task file composes in a third of the pure-Python parser's time, the same
# nodes and constructors, so the same documents and errors with their lines.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML was built with it


class DuplicateKey(ValueError):
    """`field` (dotted) is given at `first` and again at `line` (1-based)."""

    def __init__(self, field: str, first: int, line: int) -> None:
        super().__init__(f"{field}: duplicate key, given at line {first} and again at line {line}: keep one")
        self.field, self.first, self.line = field, first, line


class SeveralDocuments(yaml.MarkedYAMLError):
    """A file of more than one task: a pipeline or a job group."""


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, refusing a mapping that holds one key twice
    (DuplicateKey). Merge keys (`<<: *base`) may be overridden, as YAML means.
    Empty documents (a `---` before or after the task) are passed over, as
    SkyPilot passes them; a second task is refused (SeveralDocuments)."""
    loader = LOADER(text)
    try:
        nodes = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None and not (isinstance(node, yaml.ScalarNode) and node.tag == _NULL):
                nodes.append(node)
        if not nodes:
            return None
        if len(nodes) > 1:
            raise SeveralDocuments(problem=(
                f"the file holds {len(nodes)} YAML documents (a pipeline or a job group, which `sky jobs launch` "
                "runs): spotbroker runs one task per file; submit each task from a file of its own"),
                problem_mark=nodes[1].start_mark)
        check_keys(nodes[0])
        return loader.construct_document(nodes[0])
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
