"""The money tables. The ledger is append-only: an entry is never updated
or deleted, a correction is a new entry. What is bookkeeping (how far each
attempt has been accrued, who accrues now) lives in tables of its own."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from spotbroker.broker.store.db import Base

BigId = BigInteger().with_variant(Integer(), "sqlite")


class LedgerEntry(Base):
    """Money spent (or, for `waste`, work lost) by one attempt over
    [start_at, end_at). The place and shape are copied from the attempt so a
    team's view groups by day, cloud, GPU or zone without a join."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        # A team's view reads one time range of one team. Accrual appends
        # every team's rows minute by minute, so one team's 90 days lie on
        # ~10,000 different heap pages: on PostgreSQL the index carries the
        # summed and grouped columns, and the view is an index-only scan
        # (bench/costs.py: 280-460 ms cold without them, ~55 ms with).
        Index("ix_ledger_entries_team_id_start_at", "team_id", "start_at",
              postgresql_include=["amount", "ondemand_amount", "wasted", "node_hours", "job_id", "cloud", "region",
                                  "place", "accelerator", "kwh", "co2e_kg"]),
        # Every team's spend since a time (alerts, /metrics): index-only on PostgreSQL.
        Index("ix_ledger_entries_start_at", "start_at", postgresql_include=["team_id", "amount"]),
        Index("ix_ledger_entries_job_id", "job_id"),
        # An attempt's cost (a job's, the dashboard's timeline) sums all its
        # entries, one per heap page: index-only on PostgreSQL (0011; its
        # energy beside it since 0026).
        Index("ix_ledger_entries_attempt_id", "attempt_id", postgresql_include=["amount", "kwh", "co2e_kg"]),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))        # usage | waste | correction
    start_at: Mapped[datetime]
    end_at: Mapped[datetime]
    node_hours: Mapped[float] = mapped_column(Float)
    price_per_hour: Mapped[float] = mapped_column(Float)   # per node, the price in force
    amount: Mapped[float] = mapped_column(Float)           # dollars paid
    ondemand_amount: Mapped[float] = mapped_column(Float)  # the same hours at the on-demand price
    wasted: Mapped[float] = mapped_column(Float)           # dollars of work lost (waste entries)
    kwh: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")      # energy used, at the wall
    co2e_kg: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")  # its emissions
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str | None] = mapped_column(String(64))
    place: Mapped[str | None] = mapped_column(String(64))  # zone, else zone id
    accelerator: Mapped[str | None] = mapped_column(String(32))
    use_spot: Mapped[bool] = mapped_column(Boolean)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class LedgerCursor(Base):
    """How far an attempt's cost has been written to the ledger; `closed`
    once its end (and any waste) is written, after which it is never read."""

    __tablename__ = "ledger_cursors"
    __table_args__ = (Index("ix_ledger_cursors_closed", "closed"),)

    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    accrued_to: Mapped[datetime]
    closed: Mapped[bool] = mapped_column(Boolean, default=False)


class MoneyLease(Base):
    """Which broker process runs one background duty (accrual, alerting), until when."""

    __tablename__ = "money_leases"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    expires_at: Mapped[datetime | None]
    last_run_at: Mapped[datetime | None]


class Budget(Base):
    """A team's budget per period, its alert rules, where alerts go, and what
    happens over it. Notification targets hold secrets (webhook URLs, SMTP
    passwords): they are never answered back, only their names and hints."""

    __tablename__ = "budgets"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True)
    amount: Mapped[float] = mapped_column(Float)
    period: Mapped[str] = mapped_column(String(16))              # day | week | month
    hard_cap_action: Mapped[str] = mapped_column(String(16))     # hold_new | stop_running
    recoveries: Mapped[str] = mapped_column(String(16))          # allow | hold
    rules: Mapped[dict[str, Any]] = mapped_column(JSON)
    targets: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Alert(Base):
    """One condition of one team's budget, from when it fired to when it
    resolved. At most one is open per (team, rule): `open_key` is set while
    it fires and cleared when it resolves (NULLs never collide)."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("open_key", name="uq_alerts_open_key"),
                      Index("ix_alerts_team_id_id", "team_id", "id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(32))
    open_key: Mapped[str | None] = mapped_column(String(128))
    severity: Mapped[str] = mapped_column(String(16))
    summary: Mapped[str] = mapped_column(Text)
    advice: Mapped[str] = mapped_column(Text)
    value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float)
    fired_at: Mapped[datetime]
    resolved_at: Mapped[datetime | None]
    # What happened to it, oldest first: fired, escalated (a spend threshold), resolved, with the figures then.
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # A rate's condition stopped holding at this instant; it resolves once clear for the hold.
    clear_since: Mapped[datetime | None]


class AlertSilence(Base):
    """A rule of a team's budget kept quiet until `until` (it still fires and
    shows in /v1/alerts; nothing is sent)."""

    __tablename__ = "alert_silences"
    __table_args__ = (Index("ix_alert_silences_team_id_rule", "team_id", "rule"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(32))
    until: Mapped[datetime]
    created_at: Mapped[datetime]


class Notification(Base):
    """The outbox: one message per (alert, target, fire or resolve), written
    in the transaction that fired or resolved the alert, and sent after it
    with retries. Its unique key is what keeps a restarted broker from
    sending twice."""

    __tablename__ = "notifications"
    __table_args__ = (UniqueConstraint("alert_id", "target", "kind", name="uq_notifications_alert_id"),
                      Index("ix_notifications_due", "sent_at", "next_try_at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))            # fire | escalate_N | resolve
    title: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    tries: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class CheckpointTier(Base):
    """A checkpoint whose objects the broker moved to the cold tier (an
    archival storage class), and, once a resume asked for it, since when a
    restore runs. No row: the checkpoint is in the storage's standard class."""

    __tablename__ = "checkpoint_tiers"
    __table_args__ = (Index("ix_checkpoint_tiers_team_id", "team_id"),)

    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    storage_class: Mapped[str] = mapped_column(String(32))
    archived_at: Mapped[datetime]
    restore_requested_at: Mapped[datetime | None]


class DashboardSession(Base):
    """A browser's login to the dashboard. The cookie carries a random id
    (signed); only its SHA-256 digest is stored, so the table gives nothing
    a browser could present. Logging out deletes the row, so a copied cookie
    is worth nothing after it. The session stands while the token that
    opened it stands (`api_token_id`, deleted with it; for the admin, a
    fingerprint of the admin token in force when it logged in), until
    `expires_at` (absolute) and while it is used (`last_seen_at`, idle)."""

    __tablename__ = "dashboard_sessions"
    __table_args__ = (Index("ix_dashboard_sessions_expires_at", "expires_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    api_token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    admin_print: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    expires_at: Mapped[datetime]
