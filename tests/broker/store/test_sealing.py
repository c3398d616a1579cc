"""Secrets sealed at rest (broker/store/sealing.py): what a sealed value
names, that it opens only where it belongs and only untouched, and key
rotation with `spotbroker db reseal`."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from spotbroker.broker import auth
from spotbroker.broker.cli import cli
from spotbroker.broker.jobs import sealed
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.money import budgets
from spotbroker.broker.settings import Settings, get_settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.sealing import PREFIX, Keyring, SealError, keyring
from spotbroker.broker.usecases import jobs

OLD, NEW = "old-key-" + "o" * 32, "new-key-" + "n" * 32


def test_a_sealed_value_names_its_key_and_opens_only_in_its_own_context():
    ring = Keyring.from_material([b"k" * 32])
    value = ring.seal("hf-s3cr3t", "job secret|team 1|HF_TOKEN")
    assert value.startswith(f"{PREFIX}{ring.current}:") and "hf-s3cr3t" not in value
    assert ring.open(value, "job secret|team 1|HF_TOKEN") == "hf-s3cr3t"
    assert ring.seal("hf-s3cr3t", "c") != ring.seal("hf-s3cr3t", "c")  # a fresh nonce each time
    with pytest.raises(SealError, match="does not open"):
        ring.open(value, "job secret|team 2|HF_TOKEN")  # copied into another team's row
    flipped = value[:-3] + ("A" if value[-3] != "A" else "B") + value[-2:]
    with pytest.raises(SealError, match="does not open"):
        ring.open(flipped, "job secret|team 1|HF_TOKEN")
    with pytest.raises(SealError, match="not a sealed value"):
        ring.open("hf-s3cr3t", "job secret|team 1|HF_TOKEN")
    other = Keyring.from_material([b"x" * 32])
    with pytest.raises(SealError, match=f"sealed with key {ring.current}, which this broker does not have") as err:
        other.open(value, "job secret|team 1|HF_TOKEN")
    assert "hf-s3cr3t" not in str(err.value)


def test_the_keyring_seals_with_the_first_key_and_opens_with_every_one(tmp_path):
    only_signing = keyring(Settings(data_dir=tmp_path, secret_key="signing", _env_file=None))
    both = keyring(Settings(data_dir=tmp_path, secret_key="signing", encryption_keys=f"{NEW}, {OLD}",
                            _env_file=None))
    assert both.current == Keyring.from_material([NEW.encode()]).current != only_signing.current
    assert both.open(only_signing.seal("v", "c"), "c") == "v"  # the signing key's stays readable
    with pytest.raises(SealError):  # sealed with the first key, not the second
        Keyring.from_material([OLD.encode()]).open(both.seal("v", "c"), "c")


def test_a_short_encryption_key_is_refused_without_echoing_it():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="at least 32 random characters") as err:
        Settings(encryption_keys=f"{NEW},tooshort-secret", _env_file=None)
    assert "tooshort-secret" not in str(err.value)


@pytest.fixture
def cli_env(monkeypatch, db_url, data_dir):
    monkeypatch.setenv("SPOTBROKER_DATABASE_URL", db_url)
    monkeypatch.setenv("SPOTBROKER_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SPOTBROKER_SECRET_KEY", "signing-key-of-the-reseal-test")
    monkeypatch.delenv("SPOTBROKER_ENCRYPTION_KEYS", raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def reseal(monkeypatch, keys: str) -> tuple[int, str]:
    monkeypatch.setenv("SPOTBROKER_ENCRYPTION_KEYS", keys)
    get_settings.cache_clear()
    result = CliRunner().invoke(cli, ["db", "reseal"])
    return result.exit_code, result.output


def test_reseal_brings_every_secret_under_the_new_key_and_the_old_key_can_go(cli_env, factory):
    old = keyring(get_settings())  # the signing key's: what sealed everything until a key is configured
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec(run="true", secrets={"HF_TOKEN": "hf-value", "B": "b"}),
                             keyring=old).id
        jobs.submit(s, team.id, JobSpec(run="true"))  # nothing to reseal
        budgets.put(s, team.id, budgets.BudgetIn.model_validate({"amount": 5, "targets": [
            {"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/T/B/secret-part"}]}), keyring=old)
        team_id = team.id

    code, out = reseal(cli_env, f"{NEW},{OLD}")
    assert code == 0 and "1 jobs, 1 budgets" in out, out
    new_only = Keyring.from_material([NEW.encode()])
    assert new_only.current in out
    with factory() as s:
        job, budget = s.get(Job, job_id), budgets.get(s, team_id)
        assert sealed.values(job.spec, team_id, new_only) == {"HF_TOKEN": "hf-value", "B": "b"}
        (target,) = budgets.targets(budget)
        assert target.open(new_only).url == "https://hooks.example.com/T/B/secret-part"
        assert job.version == 2  # a broker stepping the job meanwhile retries instead of overwriting
    code, out = reseal(cli_env, f"{NEW},{OLD}")
    assert code == 0 and "0 jobs, 0 budgets" in out, out


def test_reseal_reports_what_does_not_open_and_leaves_it(cli_env, factory):
    stranger = Keyring.from_material([b"a key this broker never had" * 2])
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec(run="true", secrets={"T": "v"}), keyring=stranger).id
    with factory() as s:
        before = s.get(Job, job_id).spec
    code, out = reseal(cli_env, NEW)
    assert code == 1 and f"job {job_id}: secret T: sealed with key {stranger.current}" in out, out
    with factory() as s:
        assert s.get(Job, job_id).spec == before


def test_no_secret_value_is_in_the_jobs_table(factory, engine):
    ring = Keyring.from_material([b"k" * 32])
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "ml")
        jobs.submit(s, team.id, JobSpec(run="true", secrets={"HF_TOKEN": "hf-clear-value"}), keyring=ring)
    with engine.connect() as conn:
        raw = conn.execute(text("SELECT spec FROM jobs")).scalar()
    assert "hf-clear-value" not in str(raw) and "HF_TOKEN" in str(raw)
    with pytest.raises(ValueError, match="keyring"):
        with transaction(factory) as s:
            jobs.submit(s, team.id, JobSpec(run="true", secrets={"A": "b"}))
