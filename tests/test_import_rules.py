"""The import rule of docs/architecture.md, checked on every module:

- `agent` imports neither `broker` nor `api` (it is what a GPU node installs,
  without the broker's dependencies);
- `broker` never imports `api`, except the `serve` command, the one entry
  point that starts the server.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# (package, packages it must not import, (file, function) pairs allowed to)
RULES = [
    ("agent", ("spotbroker.broker", "spotbroker.api"), set()),
    ("broker", ("spotbroker.api",), {("broker/cli/server.py", "serve")}),
]


def imports(tree: ast.AST):
    """(module imported, enclosing function name or None, line) for every import."""
    def walk(node: ast.AST, function: str | None):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(child, child.name)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, function, child.lineno
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                yield child.module, function, child.lineno
                for alias in child.names:  # `from spotbroker import api`
                    yield f"{child.module}.{alias.name}", function, child.lineno
            yield from walk(child, function)

    yield from walk(tree, None)


@pytest.mark.parametrize(("package", "forbidden", "allowed"), RULES, ids=[r[0] for r in RULES])
def test_no_module_crosses_the_import_rule(package, forbidden, allowed):
    broken = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for module, function, line in imports(ast.parse(path.read_text(), rel)):
            if module.startswith(forbidden) and (rel, function) not in allowed:
                broken.append(f"{rel}:{line} imports {module}")
    assert not broken, "\n".join(broken)


def test_the_rule_catches_a_crossing():
    tree = ast.parse("def f():\n    from spotbroker.api.app import create_app\nimport spotbroker.broker.store.db\n")
    assert list(imports(tree)) == [("spotbroker.api.app", "f", 2), ("spotbroker.api.app.create_app", "f", 2),
                                   ("spotbroker.broker.store.db", None, 3)]
