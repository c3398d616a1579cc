"""A task file that gives one key twice (`run: a` then `run: b`) was taken
as the last one without a word: it is refused, naming the key and both
lines, by the API (a 422) and by `spotbroker submit` (the file and line).
A JSON job document is refused so too, naming the key."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spotbroker.broker.jobs.specdoc import DuplicateKeyError, SpecShapeError, load_raw

YAML = {"Content-Type": "application/yaml"}


@pytest.mark.parametrize("text, field, first, line", [
    ("name: t\nrun: a\nrun: b\n", "run", 2, 3),
    ("run: x\nresources:\n  use_spot: true\n  use_spot: false\n", "resources.use_spot", 3, 4),
    ("run: x\nresources:\n  any_of:\n    - {infra: aws, infra: gcp}\n", "resources.any_of.0.infra", 4, 4),
    ("run: x\nenvs:\n  A: 1\n  B: 2\n  A: 3\n", "envs.A", 3, 5),
])
def test_a_key_given_twice_is_named_with_both_lines(text, field, first, line):
    with pytest.raises(DuplicateKeyError) as caught:
        load_raw(text.encode(), "yaml")
    exc = caught.value
    assert (exc.field, exc.first, exc.line) == (field, first, line)
    assert f"line {first}" in exc.detail and f"line {line}" in exc.detail and "duplicate key" in exc.detail


def test_what_yaml_allows_is_still_read():
    """A merge key may be overridden, the same key in two mappings is two
    keys, and an alias is checked once (not once per use)."""
    text = "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\nlist: [*b, *b]\nrun: x\n"
    assert load_raw(text.encode(), "yaml") == {"base": {"x": 1, "y": 2}, "other": {"x": 3, "y": 2},
                                               "list": [{"x": 1, "y": 2}] * 2, "run": "x"}


def test_the_api_answers_422_naming_the_key_and_both_lines(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", content=b"name: t\nrun: echo a\nrun: echo b\n", headers={**h, **YAML})
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "run" and err["line"] == 3
    assert "line 2" in err["message"] and "line 3" in err["message"]
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []  # nothing stored


@pytest.mark.parametrize("text, field", [
    ('{"name": "t", "run": "a", "run": "b"}', "run"),
    ('{"run": "x", "envs": {"A": "1", "B": "2", "A": "3"}}', "envs.A"),
    ('{"run": "x", "resources": {"any_of": [{"infra": "aws"}, {"infra": "aws", "infra": "gcp"}]}}',
     "resources.any_of.1.infra"),
])
def test_a_json_document_giving_a_key_twice_is_refused_naming_it(text, field):
    with pytest.raises(SpecShapeError) as caught:
        load_raw(text.encode(), "json")
    assert caught.value.field == field and "duplicate key" in caught.value.detail
    assert load_raw(b'{"run": "x", "envs": {"A": "1"}, "resources": {"envs": 1}}', "json")  # same key, two objects


def test_the_api_answers_422_for_a_json_key_given_twice(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", content=b'{"run": "echo a", "envs": {"A": "1", "A": "2"}}',
                 headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "envs.A" and "duplicate key" in r.json()["errors"][0]["message"]
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []  # nothing stored


def test_the_cli_names_the_file_and_line(tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("name: t\nrun: echo a\nresources: {use_spot: true}\nrun: echo b\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(HOME=str(tmp_path), SPOTBROKER_TOKEN="sbt_x", SPOTBROKER_URL="http://127.0.0.1:9")
    # refused before any request: no broker is needed
    r = subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "submit", str(task)], env=env, cwd="/",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{task}:4: run: duplicate key, given at line 2 and again at line 4" in r.stderr, r.stderr
