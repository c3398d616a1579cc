"""A team's defaults and limits, set by the admin (`PUT /v1/teams/{team}/policy`).

Defaults are merged into a submitted document before it is validated, under
what the job says itself: `envs` key by key (the job's value wins), and
`preflight`, `early_stop` and `checkpoint` as whole fragments, and
`carbon_price_per_tonne`, where the job does not set the key, each checked
by the spec's own model when it is set.

Limits are checked at submission (a 422 naming the rule and the limit,
broker/teampolicy/limits.py) and again before each attempt is launched (a job
that breaks a limit lowered since is HELD with the reason; what runs is
never stopped for it). What "the job's $/h" is: the place's price per node
(spot or on-demand, as the job asks) times its nodes.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator
from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs.checkpointspec import CheckpointSpec
from spotbroker.broker.jobs.preflight import PreflightField
from spotbroker.broker.jobs.resources import ACCELERATOR_NAME, MAX_PRICE_PER_HOUR
from spotbroker.broker.jobs.spec import MAX_CARBON_PRICE, MAX_NODES, env_values
from spotbroker.broker.jobs.stoprule import EarlyStopField
from spotbroker.broker.pricing import normalise
from spotbroker.broker.store.models import TeamPolicy as PolicyRow

# The spec keys whose default is a fragment of the job's own spec.
SPEC_DEFAULTS = ("preflight", "early_stop", "checkpoint", "carbon_price_per_tonne")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class Policy(_Strict):
    """The document the admin PUTs (the whole policy: a key left out is no limit, no default)."""

    envs: dict[str, str] = Field(default_factory=dict, description="merged under each job's own envs")
    allowed_accelerators: Annotated[list[str], Field(max_length=256)] | None = Field(
        default=None, description="accelerator names the team's jobs may ask for (any count); null: any")
    max_price_per_hour: Annotated[StrictFloat, Field(gt=0, le=MAX_PRICE_PER_HOUR * MAX_NODES, allow_inf_nan=False)] \
        | None = Field(default=None, description="dollars per hour for the whole job: the place's price per node "
                                                 "(spot or on-demand, as the job asks) times its nodes")
    max_nodes: Annotated[StrictInt, Field(ge=1, le=MAX_NODES)] | None = Field(default=None, description="per job")
    max_gpus_running: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="accelerators of the team's launching and running attempts at once")
    # Defaults checked by the spec's own models, so a default is a valid job fragment.
    preflight: PreflightField = None
    early_stop: EarlyStopField = None
    checkpoint: CheckpointSpec | None = None
    carbon_price_per_tonne: Annotated[StrictFloat, Field(ge=0, le=MAX_CARBON_PRICE, allow_inf_nan=False)] \
        | None = Field(default=None, description="dollars per tonne of CO2e placement weighs, for jobs that do not say")
    checkpoint_retention_days: Annotated[StrictFloat, Field(gt=0, le=36_500, allow_inf_nan=False)] | None = Field(
        default=None, description="days before a committed checkpoint moves to the cold tier")

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return env_values(value, protocol.PER_ATTEMPT_ENV, "is set by the broker for each attempt: a default may "
                                                           "not set it")

    @field_validator("allowed_accelerators")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for name in value:
            match = ACCELERATOR_NAME.match(name)
            if not match or match["count"] is not None:
                raise ValueError(f"{name!r} is not an accelerator name (T4, L4, A100; no count)")
        return value

    def allows(self, accelerator: str | None) -> bool:
        """Whether a job may run on this accelerator (a CPU place, None, always may)."""
        if self.allowed_accelerators is None or accelerator is None:
            return True
        wanted = normalise.asked_accelerator(accelerator).lower()
        return any(normalise.asked_accelerator(a).lower() == wanted for a in self.allowed_accelerators)

    def spec_defaults(self) -> dict[str, Any]:
        return {key: value for key in SPEC_DEFAULTS
                if (value := _dumped(getattr(self, key))) is not None}

    def shown(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def _dumped(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_none=True) if isinstance(value, BaseModel) else value


EMPTY = Policy()


def get(session: Session, team_id: int) -> Policy:
    row = session.get(PolicyRow, team_id)
    return Policy.model_validate(row.document) if row is not None else EMPTY


def put(session: Session, team_id: int, policy: Policy, clock: Clock = SYSTEM_CLOCK) -> Policy:
    row = session.get(PolicyRow, team_id)
    if row is None:
        row = PolicyRow(team_id=team_id, document={}, updated_at=clock.now())
        session.add(row)
    row.document, row.updated_at = policy.shown(), clock.now()
    return policy


def with_defaults(doc: Any, policy: Policy, known: frozenset[str] | set[str]) -> Any:
    """A submitted document with the team's defaults merged under it. `known`:
    the spec's keys (a default for a key the spec does not know is left out)."""
    if not isinstance(doc, dict) or policy is EMPTY:
        return doc
    out = dict(doc)
    if policy.envs:
        own = out.get("envs")
        if own is None:
            out["envs"] = dict(policy.envs)
        elif isinstance(own, dict):  # (anything else: the spec's validation names it)
            out["envs"] = {**policy.envs, **own}
    for key, value in policy.spec_defaults().items():
        if key in known and out.get(key) is None:
            out[key] = value
    return out
