"""Tables. States are stored as strings (see states.py for their machines)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from spotbroker.broker.store.db import Base

# BIGINT on PostgreSQL, INTEGER (the rowid alias) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]


class TeamBucket(Base):
    """A storage prefix outside the broker's checkpoint root that the admin
    lets a team's jobs mount (`PUT /v1/teams/{team}/storage`); its nodes'
    credentials reach it, for reading only when `read_only`."""

    __tablename__ = "team_buckets"
    __table_args__ = (UniqueConstraint("team_id", "uri", name="uq_team_buckets_team_id_uri"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    uri: Mapped[str] = mapped_column(String(1024))  # a prefix, ending with '/'
    read_only: Mapped[bool] = mapped_column(Boolean)


class TeamPolicy(Base):
    """A team's defaults and limits, set by the admin (`PUT
    /v1/teams/{team}/policy`): the document broker/teampolicy/policy.py reads."""

    __tablename__ = "team_policies"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime]


class ApiToken(Base):
    """A team's API token. Only the SHA-256 digest of the token is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(64), default="default")
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class Offer(Base):
    """One price sample of a machine shape in a place; history is kept, the
    newest sample per key is the offer."""

    __tablename__ = "offers"
    __table_args__ = (
        Index("ix_offers_key", "cloud", "instance_type", "region", "zone_id", "observed_at"),
        Index("ix_offers_accelerator", "accelerator"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))      # the cloud's zone name when known
    zone_id: Mapped[str | None] = mapped_column(String(64))   # e.g. AWS use1-az1
    instance_type: Mapped[str] = mapped_column(String(64))
    accelerator: Mapped[str | None] = mapped_column(String(32))
    accelerator_count: Mapped[float] = mapped_column(Float, default=0)
    vcpus: Mapped[float | None] = mapped_column(Float)
    memory_gib: Mapped[float | None] = mapped_column(Float)
    spot_price: Mapped[float | None] = mapped_column(Float)
    ondemand_price: Mapped[float | None] = mapped_column(Float)
    observed_at: Mapped[datetime]
    source: Mapped[str] = mapped_column(String(32))


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_id_idempotency_key"),
        Index("ix_jobs_team_id_id", "team_id", "id"),
        Index("ix_jobs_due", "state", "next_check_at"),
        Index("ix_jobs_team_id_state", "team_id", "state"),  # a team's unfinished jobs, counted at each submission
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # A client's retry of the same submission returns the job it created.
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    # The sha256 of the request that made it (with a key): a retry is told by what it sends (0032).
    idempotency_digest: Mapped[str | None] = mapped_column(String(64))
    restarts: Mapped[int] = mapped_column(Integer, default=0)      # non-zero exits recovered
    recoveries: Mapped[int] = mapped_column(Integer, default=0)    # preemptions recovered
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    # Reconciler bookkeeping: when to look next, and who is looking now.
    next_check_at: Mapped[datetime | None]
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer, default=1)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.id", lazy="selectin"
    )

    __mapper_args__ = {"version_id_col": version}


class JobLabel(Base):
    """One of a job's labels (`resources.labels`, SkyPilot's key; see
    `spec.labels_of`), a row each, written with the job: costs group by a
    label through a join on this key instead of reading every job's spec."""

    __tablename__ = "job_labels"
    # A team's label names (the dashboard's choice) and its jobs carrying one value.
    __table_args__ = (Index("ix_job_labels_team_id_key_value", "team_id", "key", "value"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    value: Mapped[str] = mapped_column(String(256))


class Attempt(Base):
    """One launch of a job on one offer."""

    __tablename__ = "attempts"
    # placement replays the runs that ended recently (or not yet) into each place's history
    __table_args__ = (Index("ix_attempts_ended_at", "ended_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)  # in words, for people
    # Why it ended (or, while its job is PREEMPTING, why it is ending): an
    # EndReason (states.py), which code reads instead of `reason`.
    end_reason: Mapped[str | None] = mapped_column(String(16))
    launcher: Mapped[str] = mapped_column(String(16))
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str | None] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))
    zone_id: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str | None] = mapped_column(String(64))
    accelerator: Mapped[str | None] = mapped_column(String(32))
    accelerator_count: Mapped[float] = mapped_column(Float, default=0)
    use_spot: Mapped[bool] = mapped_column(Boolean)
    num_nodes: Mapped[int] = mapped_column(Integer, default=1)
    # Stored at launch: later catalog changes never rewrite what was paid.
    price_per_hour: Mapped[float] = mapped_column(Float)
    # A pre-flight: the job's trial run before any GPU is rented (broker/recovery/preflight.py).
    preflight: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # What a node of it draws at the wall (kW, PUE included) and its grid's
    # intensity, fixed at launch like the price (broker/energy/footprint.py);
    # `energy_basis` says whether the power is rated or the agent measured it.
    power_kw: Mapped[float | None] = mapped_column(Float)
    grid_g_per_kwh: Mapped[float | None] = mapped_column(Float)
    grid_source: Mapped[str | None] = mapped_column(String(64))
    energy_basis: Mapped[str | None] = mapped_column(String(16))  # estimated | measured
    gpu_joules: Mapped[float | None] = mapped_column(Float)       # measured by the agent (NVML), all nodes
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))  # None: SQL NULL (unlaunched)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    # Set once the launcher has released what the attempt held (processes, VMs).
    released: Mapped[bool] = mapped_column(Boolean, default=False)
    # The node agent's channel: its per-attempt token (digest only), the last
    # event sequence number stored, and when it last spoke.
    agent_token_digest: Mapped[str | None] = mapped_column(String(64), unique=True)
    agent_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The trainer's events stored for the attempt (bounded: recovery/agent_channel.py MAX_KEPT_EVENTS).
    events_kept: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Its team asked for its preemption (`simulate-preemption`): a reclaim the
    # team caused, which steers no other team's placement (placement/histories.py).
    preemption_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    last_heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer, default=1)
    # The checkpoint interval the library is told, and why (broker/recovery/intervals.py).
    checkpoint_interval: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    job: Mapped[Job] = relationship(back_populates="attempts")

    __mapper_args__ = {"version_id_col": version}


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime]
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class LogChunk(Base):
    """A piece of an attempt's output: the bytes at `start` of node `rank`'s
    log, at most logs.ROW_BYTES of them. The rows of one log are contiguous
    from 0; every broker replica reads the same ones (docs/architecture.md)."""

    __tablename__ = "log_chunks"

    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)  # len(data), read without the bytes themselves
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Checkpoint(Base):
    """A committed checkpoint, as the agent reported it. Its objects live in
    object storage under the attempt's own prefix; `keep` ones are never
    deleted or archived."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("attempt_id", "step", name="uq_checkpoints_attempt_id_step"),
                      Index("ix_checkpoints_job_id_step", "job_id", "step"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(String(16))
    keep: Mapped[bool] = mapped_column(Boolean, default=False)
    committed_at: Mapped[datetime]


class UploadReservation(Base):
    """Bytes an upload holds against its team's quota from the moment it
    passed the check until its archive is stored: what makes the check and
    the store one step for every broker on the database. A broker that dies
    in between leaves a row that stops counting at `expires_at`."""

    __tablename__ = "upload_reservations"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime]


class SpotProbe(Base):
    """One ask for spot capacity in a place, made without running a job (the
    policy asks for probes to watch a zone's spell; see broker/placement/placer.py)."""

    __tablename__ = "spot_probes"
    __table_args__ = (Index("ix_spot_probes_at", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str | None] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))
    zone_id: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str | None] = mapped_column(String(64))
    available: Mapped[bool] = mapped_column(Boolean)
    at: Mapped[datetime]


class GridReading(Base):
    """One live carbon-intensity reading of an electricity grid (an Electricity
    Maps zone) for one hour: the history kept like prices' (broker/energy/tracker.py)."""

    __tablename__ = "grid_readings"

    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    at: Mapped[datetime] = mapped_column(primary_key=True)   # the hour the figure is for
    g_per_kwh: Mapped[float] = mapped_column(Float)
    estimated: Mapped[bool] = mapped_column(Boolean)          # the service modelled it
    source: Mapped[str] = mapped_column(String(32))
    observed_at: Mapped[datetime]


class PriceOffer(Base):
    """The current offer of one machine shape in one place, as the price
    sources last saw it. Its history is the `offers` samples (one written
    each time a price changes); `listed` turns false when the source that
    owns it stops listing it, and then nothing is placed on it."""

    __tablename__ = "price_offers"
    __table_args__ = (
        UniqueConstraint("cloud", "region", "place", "instance_type", name="uq_price_offers_key"),
        Index("ix_price_offers_shape", "accelerator", "accelerator_count", "listed", "spot_price"),
        Index("ix_price_offers_spot", "listed", "spot_price"),
        Index("ix_price_offers_shape_od", "accelerator", "accelerator_count", "listed", "ondemand_price"),
        Index("ix_price_offers_ondemand", "listed", "ondemand_price"),
        Index("ix_price_offers_place", "cloud", "instance_type", "place"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64))
    place: Mapped[str] = mapped_column(String(64))            # zone, else zone id, else "" (region-wide)
    zone: Mapped[str | None] = mapped_column(String(64))
    zone_id: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    accelerator: Mapped[str | None] = mapped_column(String(32))
    accelerator_count: Mapped[float] = mapped_column(Float, default=0)
    vcpus: Mapped[float | None] = mapped_column(Float)
    memory_gib: Mapped[float | None] = mapped_column(Float)
    spot_price: Mapped[float | None] = mapped_column(Float)
    ondemand_price: Mapped[float | None] = mapped_column(Float)
    observed_at: Mapped[datetime]                             # since when these prices hold
    checked_at: Mapped[datetime]                              # when a source last confirmed them
    source: Mapped[str] = mapped_column(String(32))
    listed: Mapped[bool] = mapped_column(Boolean, default=True)
    # Published interruption risk: fraction of spot VMs interrupted per month
    # (AWS advisor band, placement score, Azure eviction band); None: unknown.
    risk: Mapped[float | None] = mapped_column(Float)
    risk_source: Mapped[str | None] = mapped_column(String(32))


class PriceSourceLease(Base):
    """Which broker process refreshes a price source, until when, and how
    its last refresh went (one row per source)."""

    __tablename__ = "price_source_leases"

    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    expires_at: Mapped[datetime | None]
    last_run_at: Mapped[datetime | None]
    last_ok_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)


class PriceListFile(Base):
    """What a source that reads large published files remembers of each one
    (`aws-public`: the region index and each region's offer file), so that
    a file is downloaded again only when its published version changed, by
    whichever broker refreshes next: the version (its URL), the ETag for a
    conditional request, and the few rows the source kept of it."""

    __tablename__ = "price_list_files"

    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)   # a region, or "region_index"
    version: Mapped[str | None] = mapped_column(String(512))
    etag: Mapped[str | None] = mapped_column(String(256))
    body: Mapped[str] = mapped_column(Text)                            # JSON: what the source kept
    fetched_at: Mapped[datetime]


class BrokerReplica(Base):
    """A running broker and the settings brokers on one database must share
    (broker/replicas.py): its row is kept fresh while it runs."""

    __tablename__ = "broker_replicas"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime]
    seen_at: Mapped[datetime]
    checkpoint_root: Mapped[str] = mapped_column(Text)
    advertise_url: Mapped[str | None] = mapped_column(Text)
    signing_key_check: Mapped[str | None] = mapped_column(String(64))  # replicas.key_check (None: an older broker)


# The money tables register on the same metadata wherever the models are loaded.
# The tables of metrics and early stops, likewise.
from spotbroker.broker.store import metricmodels as _metric_models  # noqa: E402, F401
from spotbroker.broker.store import moneymodels as _money_models  # noqa: E402, F401
