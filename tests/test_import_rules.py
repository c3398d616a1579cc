"""The import rule of docs/architecture.md, checked on every module:

- `agent` imports neither `broker` nor `api` (it is what a GPU node installs,
  without the broker's dependencies);
- `broker` never imports `api`, except the `serve` command, the one entry
  point that starts the server;
- inside `broker`, no room (a folder or a top-level module) imports a room
  on a higher floor (`FLOORS`, bottom first, as docs/architecture.md draws
  them), at module level or inside a function.
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
# broker/'s rooms, bottom floor first: a room may import its own floor and
# those below. A new room is given a floor here before it can be imported.
FLOORS = [
    ("clock", "ticker", "settings"),
    ("store",),
    ("auth", "replicas"),
    ("jobs",),
    ("pricing",),
    ("checkpoints",),
    ("money",),
    ("energy",),
    ("placement",),
    ("teampolicy",),
    ("recovery",),
    ("launch",),
    ("usecases",),
    ("metrics",),
    ("reconciler",),
    ("background",),
    ("cli", "sim"),
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


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


def room(module: str) -> str | None:
    """The broker room a dotted module name lies in (`spotbroker.broker.jobs.spec` -> `jobs`)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["spotbroker", "broker"] else None


def test_no_broker_room_imports_a_higher_floor():
    broken, unplaced = {}, set()
    for path in sorted((REPO / "broker").rglob("*.py")):
        rel = path.relative_to(REPO)
        if len(rel.parts) == 2 and rel.name == "__init__.py":
            continue
        own = rel.parts[1].removesuffix(".py")
        for module, _function, line in imports(ast.parse(path.read_text(), str(rel))):
            other = room(module)
            if other is None or other == own:
                continue
            if own not in FLOOR or other not in FLOOR:
                unplaced.add(own if own not in FLOOR else other)
            elif FLOOR[other] > FLOOR[own]:
                broken.setdefault((str(rel), line), f"{rel}:{line} ({own}, floor {FLOOR[own]}) imports {module} "
                                                    f"({other}, floor {FLOOR[other]})")
    assert not unplaced, f"rooms without a floor in FLOORS: {sorted(unplaced)}"
    assert not broken, "\n".join(broken.values())


def test_every_room_has_a_floor():
    rooms = {p.name.removesuffix(".py") for p in (REPO / "broker").iterdir()
             if p.name != "__init__.py" and not p.name.startswith((".", "__"))
             and (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert rooms <= set(FLOOR), f"rooms without a floor in FLOORS: {sorted(rooms - set(FLOOR))}"
