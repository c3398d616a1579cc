"""A SkyPilot task file in: read with SkyPilot's own schema, so that its
messages ("Instead of 'acceleratorz', did you mean 'accelerators'?") reach
the user, then turned into a job spec.

The keys spotbroker adds (`estimated_hours`, `deadline`, `max_restarts`,
`early_stop`, `preflight`, `checkpoint`, `carbon_price_per_tonne`,
`resources.max_price_per_hour`) and the uploads that stand for local
directories are taken out first and checked by `JobSpec`; everything else
goes through `sky.Task.from_yaml_config`. What SkyPilot accepts but the
broker cannot honour (`service`, `resources.job_recovery`...) is refused
naming the field and what to do instead (`broker.jobs.unhonoured`); a value
left to the launch (`envs: {KEY: }`) names the flag that gives it; an
alternative on a cloud the broker does not place on is dropped with a
warning (`broker.jobs.alternatives`). A bucket by `name:` is kept: the
broker gives it a home in the team's storage (broker/jobs/mounts.py). SkyPilot's
meaning is kept: a file without `use_spot` asks for on-demand.

Parsing needs no credentials and no network (see
`broker.launch.skypilot.catalogs`). `import sky` takes seconds: never at
start-up, but in the background just after it (`preload`), so that the
first task file does not wait for it (a request that comes first waits on
Python's import lock for the import under way, never imports twice).
"""
from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import ValidationError

from spotbroker.broker.jobs import alternatives, overrides, resfields, unhonoured
from spotbroker.broker.jobs.specdoc import _accelerator_alternatives, field_errors, load_raw, meant_members
from spotbroker.broker.jobs.unhonoured import HONOURED, HONOURED_RESOURCES, OURS  # noqa: F401

_ALTERNATIVES = ("any_of", "ordered")
_MOUNT_KEYS = frozenset({"source", "name", "mode", "store", "persistent"})


class TaskFileError(ValueError):
    """The file is not a task the broker can run: [{"field", "message", "line"?}]."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        errors = capped(errors)
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))
        self.errors = errors


def parse(data: bytes) -> dict[str, Any]:
    """The job spec document a task file means (validate it with `JobSpec`).
    Raises SpecSyntaxError/SpecShapeError for what is not a YAML mapping,
    TaskFileError for a task SkyPilot refuses or the broker cannot run."""
    return parse_warned(data)[0]


def parse_warned(data: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`parse`, and the warnings about what was dropped ([{"field", "message",
    "line"?}]: an alternative on a cloud the broker does not place on)."""
    doc = load_raw(data, "yaml")
    warnings: list[dict[str, Any]] = []
    try:
        out = to_spec(doc, warnings)
    except TaskFileError as exc:
        _add_lines(data, exc.errors)
        raise
    return out, _add_lines(data, warnings)


def _add_lines(data: bytes, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not items:
        return items
    lines = Lines(data.decode("utf-8"))
    for item in items:
        if "line" not in item and (line := lines.of(item["field"])):
            item["line"] = line
    return items


def to_spec(doc: dict[str, Any], warnings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A task document (as loaded from YAML) -> a job spec document; what is
    dropped with a warning is added to `warnings`."""
    doc = overrides.fill_in_variables(copy.deepcopy(doc))  # its mounts' paths and names, as SkyPilot reads them
    precheck(doc)
    for key in [k for k in unhonoured.IGNORED if k in doc]:  # (its contents unread: nothing of it is used)
        doc.pop(key)
        if warnings is not None:
            warnings.append({"field": key, "message": unhonoured.IGNORED[key]})
    ours = {k: doc.pop(k) for k in OURS if k in doc}
    res, prices = _take_prices(doc.get("resources"))
    if res is not None:
        doc["resources"] = res
    workdir = doc.pop("workdir", None)
    if isinstance(workdir, dict) and "upload" not in workdir:  # SkyPilot's git form: {url, ref}
        raise TaskFileError([{"field": "workdir", "message": (
            "a git repository as the workdir ({url, ref}) is not supported: check it out and give its "
            "directory (`workdir: ./repo`, uploaded by `spotbroker submit`), or clone it in setup "
            "(`git clone --branch REF URL .`)")}])
    uploads = _take_uploads(doc)
    task = _skypilot(doc, ours)
    _refuse_unhonoured(doc)
    if doc.get("run") is None:  # SkyPilot's run is optional: a task of setup only readies a cluster
        raise TaskFileError([{"field": "run", "message": (
            "spotbroker runs a job to its end and then frees its nodes: give the command in `run` (a task of "
            "setup only, which SkyPilot takes to ready a cluster for `sky exec`, leaves nothing to run)")}])
    out: dict[str, Any] = {**ours}
    for key in ("name", "run", "setup", "num_nodes"):
        if doc.get(key) is not None:
            out[key] = doc[key]
    if task.envs:
        out["envs"] = dict(task.envs)
    if task.secrets:
        out["secrets"] = {k: v.get_secret_value() for k, v in task.secrets.items()}
    if workdir is not None:
        out["workdir"] = workdir
    mounts = _mounts(doc.get("file_mounts") or {}, task)
    if mounts or uploads:
        out["file_mounts"] = {**mounts, **uploads}
    resources, dropped, errors = alternatives.drop_other_clouds(_resources(res or {}, prices))
    if errors:
        raise TaskFileError(errors)
    if warnings is not None:
        warnings.extend(dropped)
    out["resources"] = resources
    return out


def precheck(doc: dict[str, Any]) -> None:
    """What the broker refuses of a task file before SkyPilot's schema reads
    it (TaskFileError); `spotbroker submit` runs it too, before it packs and
    uploads the workdir (a file refused for an unset `--env` was uploaded
    first)."""
    if "labels" in doc:  # before SkyPilot's "unsupported field": say where they go
        raise TaskFileError([{"field": "labels", "message": resfields.MISPLACED_LABELS}])
    _refuse_early(doc)
    _refuse_unset(doc)


def _refuse_early(doc: dict[str, Any]) -> None:
    """What the broker refuses anyway, refused before SkyPilot reads the
    file: the fields it cannot honour that it names (SkyPilot's schema
    answered a typo inside `service` as a top-level field), counts over the
    spec's bounds (1 MB of labels took SkyPilot's schema 7 s on a loaded
    machine, a task-file slot held all along), and `infra: local`, which
    SkyPilot's schema answers with its regex."""
    from spotbroker.broker.jobs.execlimits import MAX_ENV_BYTES
    from spotbroker.broker.jobs.spec import MAX_FILE_MOUNTS, remote_path_error

    errors = []
    res = doc.get("resources")
    levels = [("resources", res)] if isinstance(res, dict) else []
    levels += [(f"resources.{k}.{i}", alt) for _, level in levels[:1] for k in _ALTERNATIVES
               if isinstance(level.get(k), list) for i, alt in enumerate(level[k]) if isinstance(alt, dict)]
    errors += [{"field": key, "message": unhonoured.why(key, False)} for key in doc if unhonoured.named(key, False)]
    for where, level in levels:
        errors += [{"field": f"{where}.{key}", "message": unhonoured.why(key, True)} for key in level
                   if unhonoured.named(key, True)]
        if str(level.get("infra", "")).strip().lower() == "local":
            errors.append({"field": f"{where}.infra", "message": "`local` (the broker's own host) is for a JSON "
                           "spec; a task file names a cloud (aws, gcp, azure) or k8s, or leaves infra out"})
        labels = level.get("labels")
        if isinstance(labels, dict) and len(labels) > resfields.MAX_LABELS:
            errors.append({"field": f"{where}.labels", "message": f"at most {resfields.MAX_LABELS} labels"})
    mounts = doc.get("file_mounts")
    if isinstance(mounts, dict) and len(mounts) > MAX_FILE_MOUNTS:
        errors.append({"field": "file_mounts", "message": f"{len(mounts)} mounts: at most {MAX_FILE_MOUNTS} "
                       "(mount a directory that holds them)"})
    elif isinstance(mounts, dict):  # before the CLI uploads what they name, each at its own line
        errors += [{"field": f"file_mounts.{remote}", "message": f"{remote!r}: {error}"}
                   for remote in mounts if (error := remote_path_error(remote))]
    for name in ("envs", "secrets"):  # each at least `N=` and a NUL in the job's environment
        values = doc.get(name)
        if isinstance(values, dict | list) and len(values) * 3 > MAX_ENV_BYTES:
            errors.append({"field": name, "message": f"{len(values)} variables: envs and secrets together take "
                           f"at most {MAX_ENV_BYTES} bytes as the job's environment"})
    if errors:
        raise TaskFileError(errors)


def _refuse_unset(doc: dict[str, Any]) -> None:
    """`envs: {HF_TOKEN: }` and `secrets: {HF_TOKEN: }` (or `secrets:
    [HF_TOKEN]`) leave the value to the launch: `spotbroker submit --env` /
    `--secret` fill it in; one still unset is refused naming its flag. A
    list or a mapping as a value is refused too."""
    errors = []
    envs, secrets = doc.get("envs"), doc.get("secrets")
    if isinstance(envs, dict):
        errors += [{"field": f"envs.{k}", "message": f"give its value: `spotbroker submit --env {k}=VALUE FILE`, "
                    f"or `--env {k}` to pass your shell's ${k} (an empty value is {k}: \"\")"}
                   for k, v in envs.items() if v is None]
    unset = [k for k, v in secrets.items() if v is None] if isinstance(secrets, dict) else \
        [str(k) for k in secrets] if isinstance(secrets, list) else []
    errors += [{"field": f"secrets.{k}" if isinstance(secrets, dict) else "secrets", "message": (
        f"give its value at submission: `spotbroker submit --secret {k} FILE` passes your shell's ${k} "
        f"(or --secret {k}=VALUE); spotbroker has no managed secrets")} for k in unset]
    for name, values in (("envs", envs), ("secrets", secrets)):
        if isinstance(values, dict):  # SkyPilot would take a list's or a mapping's repr as the value
            errors += [{"field": f"{name}.{k}", "message": "give a string or a number, not a list or a mapping"}
                       for k, v in values.items() if isinstance(v, dict | list)]
    if errors:
        raise TaskFileError(errors)


def _take_prices(res: Any) -> tuple[Any, dict[str, Any]]:
    """Take `max_price_per_hour` out of the resources and each alternative."""
    if not isinstance(res, dict):
        return res, {}
    res, prices = dict(res), {}
    if (price := _take_price(res, "resources")) is not None:
        prices[""] = price
    for key in _ALTERNATIVES:
        if isinstance(res.get(key), list):
            if wrong := [i for i, alt in enumerate(res[key]) if not isinstance(alt, dict)]:
                raise TaskFileError([{"field": f"resources.{key}.{i}", "message": "each alternative is a mapping "
                                      "of resources ({accelerators: A100:1, infra: aws})"} for i in wrong])
            res[key] = [dict(alt) for alt in res[key]]
            for i, alt in enumerate(res[key]):
                if (price := _take_price(alt, f"resources.{key}.{i}")) is not None:
                    prices[f"{key}.{i}"] = price
    return res, prices


def _take_price(level: dict[str, Any], where: str) -> Any:
    """The price bound of one level: the broker's `max_price_per_hour` or
    SkyPilot's `max_hourly_cost` (the same bound: per node, against the spot
    price when on spot), taken out of it."""
    if "max_price_per_hour" in level and "max_hourly_cost" in level:
        raise TaskFileError([{"field": f"{where}.max_hourly_cost", "message": "give max_hourly_cost or "
                              "max_price_per_hour (the same bound), not both"}])
    for key in ("max_price_per_hour", "max_hourly_cost"):
        if key in level:
            return level.pop(key)
    return None


def _take_uploads(doc: dict[str, Any]) -> dict[str, Any]:
    """File mounts that are uploads ({upload: SHA256}); a host path is refused
    here, before SkyPilot would look at the broker's own disk."""
    mounts = doc.get("file_mounts")
    if not isinstance(mounts, dict):
        return {}
    uploads, errors = {}, []
    for remote, source in list(mounts.items()):
        if isinstance(source, dict) and "upload" in source:
            uploads[remote] = mounts.pop(remote)
            continue
        where = source.get("source") if isinstance(source, dict) else source
        if isinstance(where, str) and "://" not in where:
            errors.append({"field": f"file_mounts.{remote}", "message": (
                f"{where!r} would be a path on the broker's host: upload the directory (`spotbroker submit FILE` "
                "does it for you) or give a storage URI under your team's prefix")})
    if errors:
        raise TaskFileError(errors)
    return uploads


def preload() -> None:
    """What the first task file needs, loaded ahead of it (SPOTBROKER_PRELOAD_SKYPILOT).
    A failure here is the first task file's to report, in its own words."""
    import importlib
    import logging

    try:
        importlib.import_module("sky")
        from spotbroker.broker.launch.skypilot import catalogs

        catalogs.ensure()
    except Exception as exc:  # e.g. a catalog directory not writable: said again, to the user, on first use
        logging.getLogger("spotbroker").warning("preloading SkyPilot for task files failed: %s", exc)


def _skypilot(doc: dict[str, Any], ours: dict[str, Any]):
    """SkyPilot's Task for the document, or its message as a TaskFileError."""
    import sky

    from spotbroker.broker.launch.skypilot import catalogs

    catalogs.ensure()
    try:
        return sky.Task.from_yaml_config(copy.deepcopy(doc))
    except Exception as exc:  # SkyPilot raises ValueError and its own kinds alike: all are the file's fault
        message = str(exc).strip() or type(exc).__name__
        field = _field_of(message, doc)
        if field == "body" and (named := _ours_named(doc, ours)):  # ("'int' object has no attribute 'strip'")
            raise TaskFileError(named) from None
        raise TaskFileError([{"field": field, "message": _with_ours(message, field, doc, ours)}]) from None


def _ours_named(doc: dict[str, Any], ours: dict[str, Any]) -> list[dict[str, Any]]:
    """The broker's own errors about the document, each naming its field."""
    from spotbroker.broker.jobs.spec import JobSpec

    try:
        JobSpec.model_validate(_accelerator_alternatives({**doc, **ours}))
    except ValidationError as exc:
        return field_errors([err for err in meant_members(exc.errors(), doc)
                             if err["type"] != "extra_forbidden" and err["loc"]], doc=doc)
    return []


_PATH_RE = re.compile(r"Check problematic field\(s\): \$\.?(\S*)")
_VALUE_RE = re.compile(r"Invalid (port|disk_tier|network_tier|label)\b")
_KEY_RE = re.compile(r"(?:Instead of|unsupported field) '([^']+)'")
_ACCELERATOR_RE = re.compile(r"^(Accelerator count|If specifying a GPU manufacturer)")
_NAMED_RE = re.compile(r"\b([a-z]+_[a-z_]+)\b")  # a field's name as SkyPilot writes it (snake case)
_QUOTED_KEY_RE = re.compile(r"""The "(\w+)" field\b.*?(?:Found: '([^']*)')?$""", re.S)  # a value of the wrong form


def _field_of(message: str, doc: dict[str, Any]) -> str:
    """The field a SkyPilot message is about, as a dotted path of the file."""
    section = "resources" if "resources YAML" in message[:60] else ""
    if message.startswith("Invalid storage YAML") and (m := _PATH_RE.search(message)):  # a bucket mount's field
        value = re.match(r"Invalid storage YAML: '([^']*)'", message)
        if found := _find_key(doc, m[1].split(".")[0], value[1] if value else None):
            return found
    if m := _PATH_RE.search(message):
        path = re.sub(r"\[(\d+)\]", r".\1", m[1]).strip(".")
        return ".".join(p for p in (section, path) if p) or "body"
    if m := _KEY_RE.search(message):
        return _find_key(doc, m[1]) or m[1]
    if m := _QUOTED_KEY_RE.search(message):
        return _find_key(doc, m[1], m[2]) or f"resources.{m[1]}"
    if m := re.search(r"Environment variable '([^']+)'", message):
        return f"envs.{m[1]}"
    if m := _VALUE_RE.match(message):  # a resource field's value: "Invalid port 70000..."
        key = {"port": "ports", "label": "labels"}.get(m[1], m[1])
        return _find_key(doc, key) or f"resources.{key}"
    if _ACCELERATOR_RE.search(message):  # "Accelerator count must be a positive number", "GPU manufacturer"
        got = re.search(r"Got: '([^']+)': (\S+?)\.?$", message)
        return _find_key(doc, "accelerators", f"{got[1]}:{got[2]}" if got else None) or "resources.accelerators"
    for word in _NAMED_RE.findall(message):  # "num_nodes should be ...", '"disk_size" must be ...'
        if (found := _find_key(doc, word)) is not None:
            return found
    return section or "body"


def _find_key(doc: dict[str, Any], key: str, value: str | None = None) -> str | None:
    """Where `key` is: the top, the resources, an alternative, a file mount
    (with `value`, where it has that value, if any place does)."""
    places: list[tuple[str, Any]] = [("", doc)]
    res = doc.get("resources")
    if isinstance(res, dict):
        places.append(("resources", res))
        for alt_key in _ALTERNATIVES:
            alts = res.get(alt_key)
            if isinstance(alts, list):
                places += [(f"resources.{alt_key}.{i}", alt) for i, alt in enumerate(alts)]
    if isinstance(doc.get("file_mounts"), dict):
        places += [(f"file_mounts.{r}", m) for r, m in doc["file_mounts"].items()]
    found = [f"{prefix}.{key}" if prefix else key for prefix, node in places
             if isinstance(node, dict) and key in node and (value is None or str(node[key]) == value)]
    if not found and value is not None:
        return _find_key(doc, key)
    return found[0] if found else None


def _with_ours(message: str, field: str, doc: dict[str, Any], ours: dict[str, Any]) -> str:
    """SkyPilot's message, and the broker's own about the same field (a bound
    SkyPilot does not know, such as at most 1024 accelerators)."""
    from spotbroker.broker.jobs.spec import JobSpec

    try:
        JobSpec.model_validate(_accelerator_alternatives({**doc, **ours}))
    except ValidationError as exc:
        for err in exc.errors():
            ours_field = ".".join(str(p) for p in err["loc"])
            if ours_field and (field.startswith(ours_field) or ours_field.startswith(field)) \
                    and err["type"] != "extra_forbidden":
                return f"{message} ({str(err['msg']).removeprefix('Value error, ')})"
    return message


def _refuse_unhonoured(doc: dict[str, Any]) -> None:
    """What SkyPilot accepts and the broker would otherwise drop: refused."""
    errors = [(key, unhonoured.why(key, False)) for key in doc if key not in HONOURED]
    res = doc.get("resources") or {}
    levels = [("resources", res)] + [(f"resources.{k}.{i}", alt) for k in _ALTERNATIVES
                                      for i, alt in enumerate(res.get(k) or [])]
    for prefix, level in levels:
        errors += [(f"{prefix}.{key}", unhonoured.why(key, True)) for key in level if key not in HONOURED_RESOURCES]
    for remote, source in (doc.get("file_mounts") or {}).items():
        if isinstance(source, dict):
            errors += [(f"file_mounts.{remote}.{key}", "spotbroker mounts a bucket of your team's ({name: NAME}) "
                        "or a storage URI ({source: URI, mode: MOUNT|COPY})") for key in source
                       if key not in _MOUNT_KEYS]
            if "source" not in source and "name" not in source:
                errors.append((f"file_mounts.{remote}", "give its name (a bucket of your team's) or its source "
                               "(a storage URI)"))
    if errors:
        raise TaskFileError([{"field": f, "message": m} for f, m in errors])


def _mounts(mounts: dict[str, Any], task) -> dict[str, Any]:
    """The file mounts as SkyPilot read them (its `${ENV}` substitution done)."""
    out: dict[str, Any] = {}
    for remote, source in mounts.items():
        if isinstance(source, str):
            out[remote] = (task.file_mounts or {}).get(remote, source)
        else:
            storage = task.storage_mounts.get(remote)
            out[remote] = {key: source[key] for key in ("name", "store", "persistent") if key in source}
            if "name" in source and storage is not None and storage.name:  # `${ENV}` filled in
                out[remote]["name"] = storage.name
            if "source" in source:
                out[remote]["source"] = storage.source if storage is not None else source["source"]
            out[remote]["mode"] = str(source.get("mode", "MOUNT")).upper()
    return out


def _resources(res: dict[str, Any], prices: dict[str, Any]) -> dict[str, Any]:
    """SkyPilot's resources in the job spec's shape: `infra` for cloud/region/
    zone, sizes in GB, several accelerators as alternatives, and `use_spot`
    said (SkyPilot's default: on-demand)."""
    out = _level(res, prices.get(""))
    for key in _ALTERNATIVES:
        if isinstance(out.get(key), list):
            out[key] = [_level(alt, prices.get(f"{key}.{i}")) if isinstance(alt, dict) else alt
                        for i, alt in enumerate(out[key])]
    out.setdefault("use_spot", False)
    return _accelerator_alternatives({"resources": out})["resources"]


def _level(level: dict[str, Any], price: Any) -> dict[str, Any]:
    from sky.utils import infra_utils, resources_utils

    out = {k: v for k, v in level.items() if k not in ("cloud", "region", "zone")}
    if any(level.get(k) is not None for k in ("cloud", "region", "zone")):
        out["infra"] = infra_utils.InfraInfo(level.get("cloud"), level.get("region"), level.get("zone")).to_str()
    if isinstance(out.get("memory"), str) and not re.fullmatch(r"\d+(\.\d+)?\+?", out["memory"]):
        out["memory"] = resources_utils.parse_memory_resource(out["memory"], "memory", ret_type=float,
                                                              allow_plus=True)
    if isinstance(out.get("disk_size"), str):
        out["disk_size"] = int(resources_utils.parse_memory_resource(out["disk_size"], "disk_size"))
    if price is not None:
        out["max_price_per_hour"] = price
    return out


def line_of(text: str, field: str) -> int | None:
    """The 1-based line of a dotted field in a YAML text, if it is there."""
    return Lines(text).of(field)


class Lines:
    """Where fields are in one YAML text: composed once, each mapping indexed
    when first walked (a file with thousands of errors was composed, and its
    keys scanned, once per error: 1,000 unset secrets took 19 s)."""

    def __init__(self, text: str) -> None:
        import yaml

        from spotbroker.broker.jobs.yamlkeys import LOADER

        try:  # libyaml's loader: PyYAML's own took 4.6 s for a 1 MB file of 80,000 keys
            self._root = yaml.compose(text, Loader=LOADER)
        except yaml.YAMLError:
            self._root = None
        self._keys: dict[int, dict[Any, tuple[Any, Any]]] = {}

    def of(self, field: str) -> int | None:
        import yaml

        node, line = self._root, None
        parts = field.split(".") if field and field != "body" else []
        for i, part in enumerate(parts):
            if isinstance(node, yaml.MappingNode):
                keys = self._keys.get(id(node))
                if keys is None:
                    keys = self._keys[id(node)] = {}
                    for k, v in node.value:
                        keys.setdefault(getattr(k, "value", None), (k, v))
                match = keys.get(part)
                if match is None and part in ("any_of", "ordered") and "accelerators" in keys:
                    # the sets read from `accelerators: {A100: 1, H100: 1}` (or a list): the Nth is its Nth entry
                    many, n = keys["accelerators"][1], parts[i + 1] if i + 1 < len(parts) else ""
                    line = keys["accelerators"][0].start_mark.line + 1
                    if isinstance(many, yaml.MappingNode | yaml.SequenceNode) and n.isdigit() \
                            and int(n) < len(many.value):
                        entry = many.value[int(n)]
                        line = (entry[0] if isinstance(entry, tuple) else entry).start_mark.line + 1
                    break
                if match is None:
                    break
                line, node = match[0].start_mark.line + 1, match[1]
            elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
                node = node.value[int(part)]
                line = node.start_mark.line + 1
            else:
                break
        return line


MAX_ERRORS = 20  # told at once; past them, how many more (a 422 is read by a person)


def capped(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(errors) <= MAX_ERRORS:
        return errors
    more = len(errors) - MAX_ERRORS
    return errors[:MAX_ERRORS] + [{"field": "body", "message": f"and {more} more error{'s' if more > 1 else ''}"}]
