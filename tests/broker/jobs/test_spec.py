"""The job spec: SkyPilot's shapes accepted, every mistake named by field."""
import pytest
from pydantic import ValidationError

from spotbroker.broker.jobs.spec import JobSpec, SpecSyntaxError, load_document


def fields(body: dict) -> list[str]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(body)
    return [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]


def test_minimal_job_is_a_cpu_job():
    spec = JobSpec.model_validate({"run": "echo hi"})
    assert spec.name == "job" and not spec.wants_gpu and spec.resources.use_spot


def test_alternatives_inherit_top_level_fields():
    spec = JobSpec.model_validate({"run": "x", "resources": {
        "use_spot": False, "any_of": [{"accelerators": "A100:8"}, {"accelerators": "H100:8", "use_spot": True}]}})
    alts = spec.resources.alternatives()
    assert [(a.accelerators, a.use_spot) for a in alts] == [("A100:8", False), ("H100:8", True)]


def test_accelerator_forms_normalise():
    def accelerators(value):
        return JobSpec.model_validate({"run": "x", "resources": {"accelerators": value}}).resources.accelerators

    assert accelerators("A100") == "A100:1"
    assert accelerators({"L4": 4}) == "L4:4"


@pytest.mark.parametrize("body, field", [
    ({"run": "x", "resourcez": {}}, "resourcez"),
    ({"run": "x", "resources": {"accelerators": "A100:x"}}, "resources.accelerators"),
    ({"run": "x", "resources": {"accelerators": "A100:-1"}}, "resources.accelerators"),
    ({"run": "x", "num_nodes": -1}, "num_nodes"),
    ({"run": "x", "num_nodes": "two"}, "num_nodes"),
    ({"run": 5}, "run"),
    ({}, "run"),
    ({"run": "x", "resources": {"infra": "ibm/us-south"}}, "resources.infra"),
    ({"run": "x", "resources": {"cpus": "eight"}}, "resources.cpus"),
    ({"run": "x", "resources": {"max_price_per_hour": 0}}, "resources.max_price_per_hour"),
    ({"run": "x", "deadline": "2026-01-01T00:00:00"}, "deadline"),
    ({"run": "x", "envs": {"1BAD": "v"}}, "envs"),
    ({"run": "x", "envs": {"MODE\n": "v"}}, "envs"),  # a final newline is no part of a name
    ({"run": "x", "resources": {"labels": {"project\n": "x"}}}, "resources.labels"),
    ({"run": "x", "resources": {"any_of": [{"accelerators": "A100:1", "colour": "red"}]}},
     "resources.any_of.0.colour"),
])
def test_mistakes_name_their_field(body, field):
    assert field in fields(body)


def test_yaml_syntax_error_gives_the_line():
    with pytest.raises(SpecSyntaxError) as info:
        load_document(b"name: x\nrun: echo\nresources:\n  accelerators: [A100\n", "yaml")
    assert info.value.line == 5 or info.value.line == 4


@pytest.mark.parametrize("text, line, says", [
    (b"name: x\nrun: |\n  echo\nenvs:\n  A: 1\n4\n", 6, "no `key: value`"),  # was line 7, past the end
    (b"name: x\nfoo bar\nrun: y\n", 2, "no `key: value`"),                        # was line 3
    (b"name: x\nenvs:\n\tA: 1\n", 3, "a tab: YAML indents with spaces"),
])
def test_a_yaml_mistake_is_told_at_its_own_line_and_in_words(text, line, says):
    """PyYAML marks the line after one that holds no `key:` (line 34 of a
    33-line file), and says of a tab only that it cannot start a token."""
    with pytest.raises(SpecSyntaxError) as info:
        load_document(text, "yaml")
    assert info.value.line == line and says in str(info.value), (info.value.line, str(info.value))


def test_non_utf8_is_a_clear_error():
    with pytest.raises(SpecSyntaxError, match="not UTF-8"):
        load_document(b'{"run": "\xff"}', "json")


def test_skypilot_accelerator_set_means_any_of():
    doc = load_document(b"run: python train.py\nresources:\n  accelerators: {A10G: 1, L4: 1}\n  infra: aws\n")
    spec = JobSpec.model_validate(doc)
    assert [(a.accelerators, a.infra) for a in spec.resources.alternatives()] == [("A10G:1", "aws"), ("L4:1", "aws")]


@pytest.mark.parametrize("mounts, says", [
    ({"~//tmp/x": "s3://b/x"}, "give the path itself"),        # the host's /tmp, joined to a home
    ({"//etc/cron.d/x": "s3://b/x"}, "give the path itself"),
    ({"~/b": {"name": "bkt"}, "~/b/sub/x": "s3://b/y"}, "lies inside '~/b'"),  # placed through a bucket's links
    ({f"/m{i}": "s3://b/a" for i in range(65)}, "at most 64"),
    # (the strip of surrounding whitespace came after the check: "~/ " was stored as the home itself,
    # which the spec then no longer read as valid, and the job stayed PENDING with a traceback a pass)
    ({"~/ ": {"name": "bkt"}}, "without surrounding whitespace"),
    ({"/ ": "s3://b/x"}, "without surrounding whitespace"),
    ({"~/x\n": "s3://b/x"}, "without surrounding whitespace"),
    ({"~/a": "s3://b/x", " ~/a": "s3://b/y"}, "without surrounding whitespace"),
])
def test_a_mount_path_outside_its_base_nested_or_one_too_many_is_refused(mounts, says):
    with pytest.raises(ValidationError, match=says):
        JobSpec.model_validate({"run": "x", "file_mounts": mounts})
