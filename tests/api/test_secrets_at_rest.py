"""Jobs' secrets and budgets' notification targets are sealed in the
database (broker/store/sealing.py): no table holds a value in clear, the job
still gets its secrets and the admin still sees a target's hint; a value
that does not open holds the job saying why, and never answers 500."""
from __future__ import annotations

import time
from datetime import UTC, datetime

from conftest import ADMIN_TOKEN
from sqlalchemy import select, text, update
from support.helpers import wait_state

from spotbroker.broker.store.db import Base, make_engine
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.sealing import Keyring, keyring

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRETS = {"HF_TOKEN": "hf-clear-value-1", "WANDB_API_KEY": "wb-clear-value-2"}
HOOK = "https://hooks.example.com/services/T0/B0/clear-value-3"
SMTP = "smtps://ops:clear-value-4@smtp.example.com:465"


def every_row(db_url: str) -> str:
    """Every row of every table, as text."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return "\n".join(str(tuple(row)) for table in Base.metadata.sorted_tables
                             for row in conn.execute(select(table)))
    finally:
        engine.dispose()


def test_no_table_holds_a_secret_in_clear_and_both_are_still_used(api, team_headers, settings, job_scratch):
    h = team_headers("ml")
    out = job_scratch / "seen"
    r = api.post("/v1/jobs", json={"run": f'printf %s "$HF_TOKEN $WANDB_API_KEY" > {out}', "secrets": SECRETS},
                 headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"]
    wait_state(api, h, r.json()["id"], {"SUCCEEDED"}, timeout=60)
    assert out.read_text() == "hf-clear-value-1 wb-clear-value-2"  # the job's process got them

    budget = {"amount": 5, "targets": [{"name": "ops", "kind": "webhook", "url": HOOK},
                                       {"name": "mail", "kind": "email", "smtp_url": SMTP, "to": ["a@example.com"]}]}
    assert api.put("/v1/teams/ml/budget", json=budget, headers=ADMIN).status_code == 200
    hints = {t["name"]: t["hint"] for t in api.get("/v1/teams/ml/budget", headers=ADMIN).json()["targets"]}
    assert hints == {"ops": "hooks.example.com …ue-3", "mail": "smtp.example.com to a@example.com"}

    rows = every_row(settings.database_url)
    assert "HF_TOKEN" in rows and "hooks" not in rows and "smtp.example.com" not in rows
    for value in [*SECRETS.values(), "clear-value-3", "clear-value-4"]:
        assert value not in rows
    assert f"sbenc:v1:{keyring(settings).current}:" in rows  # each value names the key that sealed it


def corrupt_secret(settings, job_id: int, value: str) -> None:
    engine = make_engine(settings.database_url)
    with engine.begin() as conn:
        spec = conn.execute(select(Job.spec).where(Job.id == job_id)).scalar()
        conn.execute(update(Job).where(Job.id == job_id).values(  # and due now
            spec={**spec, "secrets": {"HF_TOKEN": value}}, next_check_at=datetime.now(UTC)))
    engine.dispose()


def test_a_secret_that_does_not_open_holds_the_job_saying_why_until_it_does(agent_endpoint, settings, factory):
    from spotbroker.broker.launch.local import LocalLauncher
    from spotbroker.broker.reconciler import Reconciler

    api = agent_endpoint  # no reconciler: the test steps its own
    token = api.post("/v1/teams", json={"name": "ml"}, headers=ADMIN).json()["token"]
    h = {"Authorization": f"Bearer {token}"}
    settings.placement_interval = 0.05
    reconciler = Reconciler(factory, {"local": LocalLauncher.from_settings(settings)}, settings)
    stranger = Keyring.from_material([b"another broker's key" * 2])
    for corrupt, why in ((lambda good: good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB"),
                          "does not open: altered, or copied from elsewhere"),
                         (lambda good: stranger.seal("hf-v", "job secret|team 1|HF_TOKEN"),
                          f"sealed with key {stranger.current}, which this broker does not have")):
        job_id = api.post("/v1/jobs", json={"run": "true", "secrets": {"HF_TOKEN": "hf-v"}}, headers=h).json()["id"]
        with factory() as s:
            good = s.get(Job, job_id).spec["secrets"]["HF_TOKEN"]
        corrupt_secret(settings, job_id, corrupt(good))
        reconciler.pass_once()
        r = api.get(f"/v1/jobs/{job_id}", headers=h)
        assert r.status_code == 200 and r.json()["state"] == "HELD", r.text
        assert "secret HF_TOKEN" in r.json()["reason"] and why in r.json()["reason"], r.json()["reason"]
        assert r.json()["attempts"] == []  # never launched without them

    corrupt_secret(settings, job_id, good)  # the operator gave the broker its key back
    time.sleep(0.1)
    for _ in range(3):
        reconciler.pass_once()
    assert api.get(f"/v1/jobs/{job_id}", headers=h).json()["state"] in ("LAUNCHING", "RUNNING", "SUCCEEDED")


def test_a_target_that_does_not_open_shows_as_unreadable_to_the_admin(api, team_headers, settings):
    team_headers("ml")
    body = {"amount": 5, "targets": [{"name": "ops", "kind": "webhook", "url": HOOK}]}
    assert api.put("/v1/teams/ml/budget", json=body, headers=ADMIN).status_code == 200
    engine = make_engine(settings.database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE budgets SET targets = :t"),
                     {"t": '[{"name": "ops", "kind": "webhook", "sealed": "sbenc:v1:0123456789ab:AAAA"}]'})
    engine.dispose()
    r = api.get("/v1/teams/ml/budget", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["targets"] == [{"name": "ops", "kind": "webhook", "hint": (
        "unreadable: sealed with key 0123456789ab, which this broker does not have "
        "(SPOTBROKER_ENCRYPTION_KEYS must list the key that sealed it)")}]
