"""Reading a job document: JSON or YAML bytes into a checked dict (UTF-8,
bounded depth and size once YAML aliases are expanded, no NUL bytes, finite
numbers), with the line of a syntax error. What the fields mean is
`broker.spec`'s; a SkyPilot task file's, `broker.taskyaml`'s."""
from __future__ import annotations

import itertools
import math
import re
from typing import Any

# A document's shape: how deep, and how large once YAML aliases are expanded
# (a small YAML can name one large string a thousand times). A stored spec is
# at most MAX_SPEC_BYTES too.
MAX_DEPTH = 16
MAX_SPEC_BYTES = 1 << 20


class SpecSyntaxError(ValueError):
    """A job document that is not valid JSON/YAML; `line` is 1-based."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        where = f"line {line}" + (f", column {column}" if column else "") + ": " if line else ""
        super().__init__(where + message)
        self.line, self.column, self.message = line, column, message


class SpecShapeError(SpecSyntaxError):
    """A document nested too deeply, too large once its YAML aliases are
    expanded, or with a NUL byte in a string; `field` says where, `detail`
    what (`message` says both)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


class DuplicateKeyError(SpecShapeError):
    """A YAML mapping with one key twice: `field`, its `first` line and `line`."""

    def __init__(self, exc: Any) -> None:
        super().__init__(exc.field, f"duplicate key, given at line {exc.first} and again at line {exc.line}: keep one")
        self.first, self.line = exc.first, exc.line


def load_document(data: bytes, fmt: str = "auto") -> dict[str, Any]:
    """Parse a job document (JSON, or a SkyPilot-style YAML) into a dict,
    several accelerators read as alternatives (as SkyPilot reads them).

    `fmt` is "json", "yaml" or "auto" (JSON if it starts with '{').
    """
    return _accelerator_alternatives(load_raw(data, fmt))


def load_raw(data: bytes, fmt: str = "auto") -> dict[str, Any]:
    """The document as written, checked for its shape only."""
    text = decode(data)
    if fmt == "auto":
        fmt = "json" if text.lstrip().startswith("{") else "yaml"
    if fmt == "json":
        doc = load_json(text)
    else:
        import yaml

        from spotbroker.broker.jobs import yamlkeys

        try:
            _refuse_deep_yaml(text)
            doc = yamlkeys.safe_load(text)
        except yamlkeys.DuplicateKey as exc:
            raise DuplicateKeyError(exc) from None
        except yaml.MarkedYAMLError as exc:
            mark, problem = exc.problem_mark, str(exc.problem or exc)
            if exc.context == "while scanning a simple key" and exc.context_mark is not None:
                # PyYAML marks the line after one that holds no `key:` (past the file's end, for its last)
                mark, problem = exc.context_mark, f"a line that is no `key: value` ({problem})"
            elif mark is not None and text[mark.index:mark.index + 1] == "\t":
                problem = f"a tab: YAML indents with spaces ({problem})"
            raise SpecSyntaxError(problem, mark.line + 1 if mark else None,
                                  mark.column + 1 if mark else None) from None
        except yaml.YAMLError as exc:
            raise SpecSyntaxError(str(exc)) from None
        except RecursionError:
            raise SpecShapeError("body", f"nested more than {MAX_DEPTH} levels") from None
        except SpecShapeError:
            raise
        except (ValueError, OverflowError) as exc:  # a number or date out of range
            raise SpecSyntaxError(_said(exc)) from None
    if not isinstance(doc, dict):
        raise SpecSyntaxError("the document must be a mapping of fields (name, run, resources, ...)")
    check_shape(doc)
    return doc


def decode(data: bytes) -> str:
    """A document's bytes as text: UTF-8, or SpecSyntaxError naming the first wrong byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecSyntaxError(f"not UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None


def load_json(text: str) -> Any:
    """A JSON document as written, refused (naming the field) where an object
    gives a key twice: every JSON body the API reads goes through here."""
    import json

    try:
        return json.loads(text, object_pairs_hook=_one_each)
    except _GivenTwice:
        raise SpecShapeError(_twice(text), "duplicate key, given twice: keep one") from None
    except json.JSONDecodeError as exc:
        raise SpecSyntaxError(exc.msg, exc.lineno, exc.colno) from None
    except RecursionError:
        raise SpecShapeError("body", f"nested more than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a number of more digits than Python converts
        raise SpecSyntaxError(_said(exc)) from None


def _said(exc: Exception) -> str:
    """Python's message, without its advice to Python's users (`use sys.set_int_max_str_digits()`)."""
    return str(exc).split("; use sys.")[0]


class _GivenTwice(Exception):
    pass


def _one_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when it gives a key twice (json keeps the last,
    silently: `envs` twice ran the job without the first's variables)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise _GivenTwice
    return obj


class _Marked(dict):
    """A JSON object that remembers the first key it was given twice."""

    twice: str | None = None

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> _Marked:
        obj = cls()
        for key, value in pairs:
            if key in obj and obj.twice is None:
                obj.twice = key
            obj[key] = value
        return obj


def _twice(text: str) -> str:
    """The dotted field of the first key given twice in a JSON document."""
    import json

    try:
        doc = json.loads(text, object_pairs_hook=_Marked.of)
    except (RecursionError, ValueError):  # (the first read stopped at the key, before these)
        return "body"
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Marked):
            if node.twice is not None:
                return _dotted(path + (node.twice,))
            stack.extend(reversed([(path + (k,), v) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(path + (i,), v) for i, v in enumerate(node)]))
    return "body"


_YAML_QUOTED_RE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"")
_BRACKET_RE = re.compile(r"[\[\]{}]")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_YAML_FLOW_DEPTH = 256


def _refuse_deep_yaml(text: str) -> None:
    """Refuse YAML whose flow collections (`[[[...`) open far more levels than
    MAX_DEPTH, before PyYAML reads it: its scanner holds every token of a
    deep flow collection before the first event (200,000 levels took 0.7 s
    and left the server 10 % larger). Brackets in quoted strings are not
    counted; past MAX_DEPTH but not this far, `check_shape` names the field."""
    if text.count("[") + text.count("{") <= _YAML_FLOW_DEPTH:
        return
    steps = map(_BRACKET_STEP.__getitem__, _BRACKET_RE.findall(_YAML_QUOTED_RE.sub("", text)))
    if max(itertools.accumulate(steps), default=0) > _YAML_FLOW_DEPTH:
        raise SpecShapeError("body", f"nested more than {MAX_DEPTH} levels")


def check_shape(doc: Any) -> None:
    """Walk the document as a JSON encoder would, each YAML alias expanded,
    and stop at the first string holding a NUL byte (no process can take it:
    the launch would fail), the first level past MAX_DEPTH, or once past
    MAX_SPEC_BYTES. Without recursion, and in time bounded by the size limit
    whatever the aliases multiply."""
    budget = MAX_SPEC_BYTES
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        if len(path) > MAX_DEPTH:
            raise SpecShapeError(_dotted(path[:MAX_DEPTH + 1]), f"nested more than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            budget -= 2
            for key, value in node.items():
                _no_nul(path + (key,), key)
                budget -= len(str(key)) + 4
                stack.append((path + (key,), value))
        elif isinstance(node, list):
            budget -= 2 + len(node)
            stack.extend((path + (i,), value) for i, value in enumerate(node))
        elif isinstance(node, str):
            _no_nul(path, node)
            budget -= len(node) + 2
        elif isinstance(node, float) and not math.isfinite(node):
            raise SpecShapeError(_dotted(path), "must be a finite number")
        else:
            budget -= 8
        if budget < 0:
            raise SpecShapeError("body", f"larger than {MAX_SPEC_BYTES} bytes as JSON (the form it is stored in, "
                                 "any YAML aliases expanded)")


def _no_nul(path: tuple[Any, ...], value: Any) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise SpecShapeError(_dotted(path), "contains a NUL byte")


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "body"


def _accelerator_alternatives(doc: dict[str, Any]) -> dict[str, Any]:
    """As SkyPilot reads them, `accelerators: {A10G: 1, L4: 1}` means "any
    of" and `accelerators: [A10G, L4]` means "in this order"."""
    res = doc.get("resources")
    if isinstance(res, dict):
        acc = res.get("accelerators")
        many = (isinstance(acc, dict) and len(acc) > 1) or isinstance(acc, list)
        if many and "any_of" not in res and "ordered" not in res:
            items = acc.items() if isinstance(acc, dict) else ((a, None) for a in acc)
            rest = {k: v for k, v in res.items() if k != "accelerators"}
            doc = {**doc, "resources": {**rest, "any_of" if isinstance(acc, dict) else "ordered": [
                {"accelerators": name if count is None else f"{name}:{count}"} for name, count in items]}}
    return doc


_UNION_MEMBER = re.compile(r"^([A-Z][A-Za-z]+|[a-z]+-[a-z]+|.*[\[(].*)$")  # UploadMount, constrained-str, dict[..]


def _union_member(loc: list, doc: Any) -> tuple[tuple, str, int] | None:
    """Where a pydantic error's location enters a union of the document:
    (the path to it, the member's name, the member's index in `loc`)."""
    node = doc
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and _UNION_MEMBER.match(part):
            return tuple(loc[:i]), part, i
        else:
            return None
    return None


_SHAPE = frozenset({"missing", "extra_forbidden"})  # the value has another member's keys


def meant_members(errors: list[dict[str, Any]], doc: Any) -> list[dict[str, Any]]:
    """A value that fits none of a union's members gets an error list from
    each. Where some member's errors are about the values given (a mode
    that is not one of the modes, a digest that is no digest), the members
    that only disagree on the value's shape (its keys, or its being a
    mapping at all) are left out: the user meant the member the keys fit."""
    def shape_only(err: dict[str, Any], at: int) -> bool:
        kind = str(err.get("type", ""))
        return kind in _SHAPE or (kind.endswith("_type") and len(err.get("loc", ())) == at + 1)

    members: dict[tuple, dict[str, bool]] = {}  # union's path -> member -> it has an error about a value
    found = []
    for err in errors:
        entry = _union_member(list(err.get("loc", ())), doc)
        found.append(entry)
        if entry is not None:
            site, member, at = entry
            valued = members.setdefault(site, {}).get(member, False)
            members[site][member] = valued or not shape_only(err, at)
    return [err for err, entry in zip(errors, found, strict=True)
            if entry is None or members[entry[0]][entry[1]] or not any(members[entry[0]].values())]


def path_in(loc: list, doc: Any) -> list:
    """A pydantic error's location as a path of the document it is about:
    the names pydantic gives a union's members (`UploadMount`,
    `constrained-str`, `dict[...]`) left out, since they are no field of it."""
    path, node = [], doc
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and _UNION_MEMBER.match(part):
            continue
        else:
            node = None
        path.append(part)
    return path


def field_errors(errors: list[dict[str, Any]], drop_prefix: tuple[str, ...] = (),
                 doc: Any = None) -> list[dict[str, Any]]:
    """Pydantic errors as [{"field": "resources.accelerators", "message": ...}]
    (one per field and message). With the document they are about, the
    names pydantic gives the members of a union (`UploadMount`,
    `constrained-str`, `dict[constrained-str,constrained-str]`) are left out
    of the path: they are no field of it; and a value of none of a union's
    types is one error ("Input should be a valid dictionary, or a valid
    string"), not one per member."""
    out: list[dict[str, Any]] = []
    wrong_type: dict[str, dict[str, Any]] = {}
    if doc is not None:
        errors = meant_members(errors, doc)
    for err in errors:
        loc = [p for p in err.get("loc", ()) if p not in drop_prefix]
        if doc is not None:
            loc = path_in(loc, doc)
        message = _INSTANCE_OF.sub("", str(err.get("msg", "invalid")).removeprefix("Value error, "))
        item = {"field": ".".join(str(p) for p in loc) or "body", "message": message}
        if str(err.get("type", "")).endswith("_type") and message.startswith(_SHOULD):
            if (same := wrong_type.get(item["field"])) is not None:
                if message.removeprefix(_SHOULD) not in same["message"]:
                    same["message"] += ", or " + message.removeprefix(_SHOULD)
                continue
            wrong_type[item["field"]] = item
        if item not in out:
            out.append(item)
    return out


_SHOULD = "Input should be "
_INSTANCE_OF = re.compile(r" or instance of \w+")  # a model's class name: none of the user's business
