"""What several money tests build: committed checkpoints in S3 (moto), the
storage class an object landed in, a Prometheus scrape read back, and a
ledger seeded for the metrics."""
from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.broker.money import budgets
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Checkpoint, Job
from support.s3fixtures import s3_client
from support.world import T0

H = timedelta(hours=1)
PART = b"w" * 4096


def checkpoint(factory, s3_uri, job_id, attempt_id, step, committed_at, keep=False) -> tuple[int, str]:
    """A committed checkpoint in S3 (a part and its manifest) and its row."""
    uri = f"{s3_uri}/ml/{job_id}/{attempt_id}/{protocol.step_dir(step)}"
    store = Storage(uri)
    store.put("part-00000.bin", PART)
    store.put(protocol.MANIFEST, b'{"format": "x", "objects": {"part-00000.bin": {"size": 4096}}}')
    with transaction(factory) as s:
        row = Checkpoint(job_id=job_id, attempt_id=attempt_id, step=step, uri=uri, bytes=len(PART), keep=keep,
                         reason="periodic", committed_at=committed_at)
        s.add(row)
        s.flush()
        return row.id, uri


def storage_class(endpoint, uri, key) -> str:
    bucket, _, path = uri.removeprefix("s3://").partition("/")
    head = s3_client(endpoint).head_object(Bucket=bucket, Key=f"{path}/{key}")
    return head.get("StorageClass") or "STANDARD"


def settings() -> MoneySettings:
    return MoneySettings(_env_file=None)


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample, by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def seed(factory, world, clock) -> None:
    ml, cv = world.team("ml"), world.team("cv")
    running = world.job(ml, "big")
    world.attempt(running, start=T0 - 2 * H, price=3.0, nodes=2)
    with transaction(factory) as s:
        budgets.put(s, ml, budgets.BudgetIn(amount=100, period="month"), clock)
    recovering = world.job(cv, "small", state="RECOVERING")
    lost = world.attempt(recovering, start=T0 - 3 * H, end=T0 - 2 * H, price=1.0, cloud="gcp",
                         end_reason="preempted")
    waiting = world.job(cv, "later", state="PENDING")
    with transaction(factory) as s:
        s.get(Job, recovering).recoveries = 1
        s.get(Job, waiting).reason = "waiting for spot: spot capacity is scarce in every zone"
        for step, seconds, reason in ((1, 3.0, "flush"), (2, 40.0, "flush"), (3, 100.0, "periodic")):
            s.add(Checkpoint(job_id=recovering, attempt_id=lost, step=step, uri=f"file:///c/{step}", bytes=1,
                             seconds=seconds, reason=reason, keep=False, committed_at=T0 - 2 * H))
    Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
