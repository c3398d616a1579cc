"""What money tests build on: a team, jobs and attempts written straight to
the database, and a clock the test moves."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Checkpoint, Job, JobLabel, Offer, PriceOffer, Team
from spotbroker.broker.store.sealing import Keyring

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
# What seals the budgets' notification targets these tests set, and opens them to send.
KEYRING = Keyring.from_material([b"the money tests' key"])


class FakeClock:
    """Time that moves only when the test says so."""

    def __init__(self, now: datetime = T0) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t

    def advance(self, **delta: float) -> datetime:
        self.t += timedelta(**delta)
        return self.t


class World:
    """Writes the rows a money test needs."""

    def __init__(self, factory) -> None:
        self.factory = factory

    def team(self, name: str = "ml") -> int:
        with transaction(self.factory) as s:
            team = Team(name=name, created_at=T0)
            s.add(team)
            s.flush()
            return team.id

    def job(self, team_id: int, name: str = "train", state: str = "RUNNING",
            labels: dict[str, str] | None = None) -> int:
        """A job; its `labels` stored as a submission stores them (in its spec and job_labels)."""
        spec = {"name": name, "run": "true", **({"resources": {"labels": labels}} if labels else {})}
        with transaction(self.factory) as s:
            job = Job(team_id=team_id, name=name, state=state, spec=spec, restarts=0,
                      recoveries=0, created_at=T0, updated_at=T0)
            s.add(job)
            s.flush()
            s.add_all([JobLabel(job_id=job.id, key=k, team_id=team_id, value=v) for k, v in (labels or {}).items()])
            return job.id

    def attempt(self, job_id: int, *, start: datetime = T0, end: datetime | None = None, price: float = 1.0,
                nodes: int = 1, spot: bool = True, cloud: str = "aws", region: str = "us-east-1",
                zone_id: str | None = "use1-az1", instance_type: str = "p4d.24xlarge",
                accelerator: str | None = "A100", end_reason: str | None = None) -> int:
        state = "RUNNING" if end is None else ("PREEMPTED" if end_reason in ("preempted", "vanished")
                                               else "SUCCEEDED")
        with transaction(self.factory) as s:
            a = Attempt(job_id=job_id, state=state, launcher="local", cloud=cloud, region=region, zone=None,
                        zone_id=zone_id, instance_type=instance_type, accelerator=accelerator,
                        accelerator_count=8 if accelerator else 0, use_spot=spot, num_nodes=nodes,
                        price_per_hour=price, created_at=start, updated_at=start, started_at=start, ended_at=end,
                        end_reason=end_reason or (None if end is None else "succeeded"))
            s.add(a)
            s.flush()
            return a.id

    def end(self, attempt_id: int, at: datetime, end_reason: str = "succeeded") -> None:
        with transaction(self.factory) as s:
            a = s.get(Attempt, attempt_id)
            a.ended_at, a.end_reason = at, end_reason
            a.state = "PREEMPTED" if end_reason in ("preempted", "vanished") else "SUCCEEDED"

    def spot_change(self, at: datetime, price: float, *, zone_id: str = "use1-az1",
                    instance_type: str = "p4d.24xlarge") -> None:
        with transaction(self.factory) as s:
            s.add(Offer(cloud="aws", region="us-east-1", zone=None, zone_id=zone_id, instance_type=instance_type,
                        accelerator="A100", accelerator_count=8, spot_price=price, ondemand_price=32.77,
                        observed_at=at, source="aws"))

    def ondemand(self, price: float, *, zone_id: str = "use1-az1", instance_type: str = "p4d.24xlarge") -> None:
        with transaction(self.factory) as s:
            s.add(PriceOffer(cloud="aws", region="us-east-1", place=zone_id, zone=None, zone_id=zone_id,
                             instance_type=instance_type, accelerator="A100", accelerator_count=8,
                             spot_price=1.0, ondemand_price=price, observed_at=T0, checked_at=T0, source="aws",
                             listed=True))

    def checkpoint(self, job_id: int, attempt_id: int, at: datetime, step: int = 1) -> None:
        with transaction(self.factory) as s:
            s.add(Checkpoint(job_id=job_id, attempt_id=attempt_id, step=step, uri=f"file:///c/{step}", bytes=1,
                             keep=False, committed_at=at))
