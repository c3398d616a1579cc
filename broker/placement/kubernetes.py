"""Kubernetes places: a team's own clusters, each a place with a configured
price per GPU-hour (zero by default), offered to jobs beside the clouds'.

The operator lists the clusters in a file (`SPOTBROKER_KUBERNETES_PLACES`,
YAML or JSON, read when the broker starts):

    clusters:
      - context: lab-a            # the kube context: SkyPilot's `infra: k8s/lab-a`
        price_per_gpu_hour: 0     # what an attempt there costs the team (default 0)
        teams: [vision]           # who may use it (default: every team)
        nodes:                    # the GPU nodes, by kind
          - {accelerator: H100, gpus_per_node: 8, count: 4, cpus: 96, memory_gib: 1024}

A cluster is not a cloud offer (no row of the price tables, never in
`/v1/prices`): it is never reclaimed, so an attempt there is like
on-demand, at the configured price. Its capacity is its GPUs of a kind less
those held by live attempts there, counted from the database so that every
broker on it agrees (on PostgreSQL the count and the new attempt are
serialised by an advisory lock; SQLite serialises writers already). A place
that refused a launch (Kubernetes could not schedule the pods: SkyPilot's
capacity error) counts as full for one placement interval.

How it joins a decision (`merge`, the placer's hook): the free places that
fit the job are merged into the policy's list by price per node-hour,
before any cloud place that costs more (at equal price the cluster first:
it is never reclaimed), so a paid-for cluster is tried first and a full
one spills to the clouds at once. A job never waits for a cluster unless
it can run nowhere else (`infra: k8s`, or no cloud offer fits it); while
the policy waits for spot, a free cluster that costs no more than the
cheapest spot place is taken instead. With `ordered` resources, a cluster
that fits an earlier alternative comes before the clouds' later ones.
Moves of running jobs (deadlines) stay among the clouds.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy import bindparam, case, func, or_, select, text
from sqlalchemy.orm import Session

from spotbroker.broker.jobs import resfields
from spotbroker.broker.jobs.resources import MAX_ACCELERATORS, MAX_PRICE_PER_HOUR, Infra, ResourceSet, parse_amount
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, EndReason
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.pricing.normalise import accelerator_name, asked_accelerator
from spotbroker.broker.pricing.offers import Placement
from spotbroker.broker.store.models import Attempt, Job, Team

if TYPE_CHECKING:
    from spotbroker.broker.placement.placer import Choice

CLOUD = "k8s"
# Serialises "count what is held, then add an attempt" across brokers on PostgreSQL.
LOCK_ID = 7042
SETTING = "SPOTBROKER_KUBERNETES_PLACES"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)


class NodeKind(_Strict):
    """Nodes of one kind: how many, their GPUs, and (optionally) their CPUs and memory."""

    accelerator: Annotated[str, Field(min_length=1, max_length=32)]
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_ACCELERATORS)]
    count: Annotated[int, Field(ge=1, le=100_000, description="nodes of this kind")]
    cpus: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    memory_gib: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    @field_validator("accelerator")
    @classmethod
    def _one_name(cls, value: str) -> str:
        return accelerator_name(value) or value  # the name offers and jobs use: `a100 80gb` is A100-80GB


class Cluster(_Strict):
    # Attempts keep the context in `region` (64 characters); SkyPilot reads "k8s/CONTEXT".
    context: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\s*]+$")]
    price_per_gpu_hour: Annotated[float, Field(ge=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)] = 0.0
    teams: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(min_length=1)] | None = None
    nodes: Annotated[list[NodeKind], Field(min_length=1)]

    def gpus(self, accelerator: str) -> int:
        return sum(n.gpus_per_node * n.count for n in self.nodes if n.accelerator == accelerator)


class PlacesFile(_Strict):
    clusters: Annotated[list[Cluster], Field(min_length=1)]

    @model_validator(mode="after")
    def _contexts_once(self) -> PlacesFile:
        seen = set()
        for i, c in enumerate(self.clusters):
            if c.context in seen:
                raise ValueError(f"clusters.{i}.context: {c.context!r} is listed twice")
            seen.add(c.context)
        return self


class PlacesFileError(ValueError):
    """The operator's file cannot be used; the message names the file and the field."""


def load(path: Path) -> PlacesFile:
    """The clusters a file lists, or a PlacesFileError saying what to fix."""
    import yaml

    where = f"{SETTING} ({path})"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlacesFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PlacesFileError(f"{where}: not YAML or JSON: {exc}") from None
    try:
        return PlacesFile.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "the file"
            problems.append(f"{field}: {str(err['msg']).removeprefix('Value error, ')}")
        raise PlacesFileError(f"{where}: " + "; ".join(problems)) from None


@dataclass(frozen=True)
class Candidate:
    """A cluster that fits one of the job's resource sets (index `alternative`)."""

    alternative: int
    cluster: Cluster
    placement: Placement

    @property
    def need(self) -> tuple[str, str]:
        return self.cluster.context, self.placement.accelerator or ""


def fits(want: ResourceSet, cluster: Cluster) -> Placement | None:
    """The cluster as a placement for one resource set, if it can run it:
    the accelerator in whole GPUs, at most a node's worth per node; the
    infra (`k8s`, `k8s/CONTEXT`, or none); the cpus and memory a node has,
    where the file says; a Docker image (`docker:...`), or one for this
    context; the price cap. An instance type is a cloud's: never here."""
    if want.accelerator is None or want.instance_type is not None:
        return None
    name, count = want.accelerator
    name = asked_accelerator(name)
    if not float(count).is_integer() or count < 1:
        return None
    if CLOUD in resfields.clouds_refusing(want):  # a disk or network tier a pod cannot have
        return None
    if want.infra is not None:
        infra = Infra(want.infra)
        if infra.cloud not in (None, CLOUD) or infra.zone or infra.region not in (None, cluster.context):
            return None
    if isinstance(want.image_id, dict):
        if cluster.context not in want.image_id:
            return None
    elif want.image_id is not None and not want.image_id.startswith("docker:"):
        return None
    kinds = [n for n in cluster.nodes if n.accelerator == name and n.gpus_per_node >= count
             and _at_most(want.cpus, n.cpus) and _at_most(want.memory, n.memory_gib)]
    price = cluster.price_per_gpu_hour * count
    if not kinds or (want.max_price_per_hour is not None and price > want.max_price_per_hour):
        return None
    return Placement(cloud=CLOUD, region=cluster.context, zone=None, zone_id=None, instance_type=None,
                     accelerator=name, accelerator_count=count, use_spot=False, price_per_hour=price)


def _at_most(wanted: str | None, node_has: float | None) -> bool:
    """A pod's request fits a node that has that much (`8` and `8+` alike: the
    pod asks for that many); where the file does not say, Kubernetes decides."""
    return wanted is None or node_has is None or parse_amount(wanted)[0] <= node_has


# Per (context, accelerator) of the places asked about: the GPUs its live
# attempts hold, and whether one was refused for capacity since `since`. One
# statement, built once (a decision only binds its values); live attempts
# have not ended, so both halves read the `ended_at` index, not the table.
_LIVE = Attempt.ended_at.is_(None) & Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES])
_REFUSED = (Attempt.end_reason == EndReason.NO_CAPACITY) & (Attempt.ended_at >= bindparam("since"))
USAGE = (select(Attempt.region, Attempt.accelerator,
                func.sum(case((_LIVE, Attempt.accelerator_count * Attempt.num_nodes), else_=0)).label("gpus"),
                func.max(case((_REFUSED, 1), else_=0)).label("refused"))
         .where(Attempt.cloud == CLOUD, Attempt.region.in_(bindparam("contexts", expanding=True)),
                or_(Attempt.ended_at.is_(None), Attempt.ended_at >= bindparam("since")))
         .group_by(Attempt.region, Attempt.accelerator))


class KubernetesPlaces:
    """The configured clusters, as places the placer offers beside the clouds'."""

    def __init__(self, places: PlacesFile, cooldown_s: float) -> None:
        self.clusters = places.clusters
        self.cooldown_s = cooldown_s  # a refused place counts as full this long
        self._restricted = any(c.teams is not None for c in self.clusters)

    @classmethod
    def from_settings(cls, settings) -> KubernetesPlaces | None:
        if settings.kubernetes_places is None:
            return None
        return cls(load(Path(settings.kubernetes_places)), settings.placement_interval)

    # --- which clusters fit, and which have room ------------------------------------------

    def why_unfit(self, spec: JobSpec) -> str:
        """Why no cluster fits a job's sets, as far as their nodes' GPUs tell."""
        words = []
        for want in spec.resources.alternatives():
            if want.accelerator is not None:
                name, count = asked_accelerator(want.accelerator[0]), want.accelerator[1]
                most = max((n.gpus_per_node for c in self.clusters for n in c.nodes if n.accelerator == name),
                           default=0)
                if most < count:
                    words.append(f"no Kubernetes node has {count:g} {name}" + (f" (at most {most})" if most else ""))
        return "; ".join(dict.fromkeys(words)) or "no Kubernetes place fits"

    def candidates(self, session: Session, job: Job, spec: JobSpec) -> list[Candidate]:
        """Every (cluster, resource set) that fits the job, whatever is free."""
        team = session.get(Team, job.team_id).name if self._restricted else None
        out: dict[Placement, Candidate] = {}
        for i, want in enumerate(spec.resources.alternatives()):
            for cluster in self.clusters:
                if cluster.teams is not None and team not in cluster.teams:
                    continue
                placement = fits(want, cluster)
                if placement is not None:
                    out.setdefault(placement, Candidate(i, cluster, placement))
        return list(out.values())

    def free(self, session: Session, found: Iterable[Candidate], num_nodes: int,
             now: datetime) -> tuple[list[Candidate], list[str]]:
        """(those with room for `num_nodes` nodes now, a word on each that has
        none). The count reads the database under the placement lock."""
        found = list(found)
        if not found:
            return [], []
        lock(session)
        since = now - timedelta(seconds=self.cooldown_s)
        use = {(r.region, r.accelerator): (r.gpus or 0, bool(r.refused)) for r in session.execute(
            USAGE, {"contexts": sorted({c.cluster.context for c in found}), "since": since})}
        room, full = [], []
        for c in found:
            (used, refused), total = use.get(c.need, (0, False)), c.cluster.gpus(c.need[1])
            if refused:
                full.append(f"{c.cluster.context} refused a launch within {self.cooldown_s:g} s")
            elif used + c.placement.accelerator_count * num_nodes > total:
                full.append(f"{c.cluster.context} has {max(total - used, 0):g} of {total} {c.need[1]} free")
            else:
                room.append(c)
        return room, sorted(set(full))

    def has_room(self, session: Session, placement: Placement, num_nodes: int, now: datetime) -> bool:
        """Whether a placement chosen earlier in a fail-over round still has room."""
        cluster = next((c for c in self.clusters if c.context == placement.region), None)
        if cluster is None:
            return False
        room, _ = self.free(session, [Candidate(0, cluster, placement)], num_nodes, now)
        return bool(room)

    # --- the placer's hook --------------------------------------------------------------

    def merge(self, session: Session, job: Job, spec: JobSpec, now: datetime, cloud: Choice | None,
              enabled: frozenset[str] | None,
              cloud_floor: Callable[[], float | None]) -> tuple[Action, tuple[Placement, ...], str] | None:
        """The decision with the clusters in it, as (action, placements,
        reason), or None when no place can ever fit the job; `cloud` is the
        clouds' alone (the placer's `Choice`, or None when no cloud offer
        can ever fit)."""
        found = self.candidates(session, job, spec)
        if not found:
            return None if cloud is None else (cloud.action, cloud.placements, cloud.reason)
        usable = [c for c in found if enabled_here(c.cluster.context, enabled)]
        room, full = self.free(session, usable, spec.num_nodes, now)
        full += [f"{c.cluster.context} is not enabled in SkyPilot (sky check)" for c in found if c not in usable]
        room.sort(key=lambda c: (c.alternative if spec.resources.is_ordered else 0, c.placement.price_per_hour))
        if cloud is None:
            if room:
                return Action.LAUNCH, tuple(c.placement for c in room), _why(room)
            return Action.WAIT, (), "no Kubernetes place that fits has room: " + "; ".join(full)
        spill = f" (Kubernetes full: {'; '.join(full)})" if full else ""
        if cloud.action is not Action.LAUNCH:  # waiting for spot: a cluster costing no more is better now
            floor = cloud_floor()
            cheap = [c for c in room if floor is not None and c.placement.price_per_hour <= floor]
            if cheap:
                return Action.LAUNCH, tuple(c.placement for c in cheap), _why(cheap)
            return cloud.action, cloud.placements, cloud.reason + spill
        if not room:
            return cloud.action, cloud.placements, cloud.reason + spill
        placements = _merged(spec, list(cloud.placements), room)
        if placements[0].cloud != CLOUD:
            return Action.LAUNCH, placements, cloud.reason
        return Action.LAUNCH, placements, f"{_why(room)}; then {cloud.reason}"


def enabled_here(context: str, enabled: frozenset[str] | None) -> bool:
    """Whether SkyPilot can launch in the context: its `sky check` answer
    names `k8s/CONTEXT` (or only `k8s`, unexpanded); None: no limit (the
    local launcher simulates every place)."""
    if enabled is None:
        return True
    if f"{CLOUD}/{context}" in enabled:
        return True
    return CLOUD in enabled and not any(e.startswith(f"{CLOUD}/") for e in enabled)


def lock(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SELECT pg_advisory_xact_lock({LOCK_ID})"))


def _merged(spec: JobSpec, cloud: list[Placement], room: list[Candidate]) -> tuple[Placement, ...]:
    """The cloud places in the policy's order, each cluster placed before the
    first cloud place that costs more per node-hour (or, with `ordered`
    resources, belongs to a later alternative)."""
    ordered = spec.resources.is_ordered
    cloud_alt = _alternative_of(spec, cloud[0]) if ordered and cloud else 0
    out: list[Placement] = []
    pending = list(room)
    for p in cloud:
        while pending and _before(pending[0], p, cloud_alt, ordered):
            out.append(pending.pop(0).placement)
        out.append(p)
    return tuple(out + [c.placement for c in pending])


def _before(c: Candidate, p: Placement, cloud_alt: int, ordered: bool) -> bool:
    if ordered and c.alternative != cloud_alt:
        return c.alternative < cloud_alt
    return c.placement.price_per_hour <= p.price_per_hour


def _alternative_of(spec: JobSpec, p: Placement) -> int:
    """Which `ordered` alternative the clouds' places were chosen for (the
    first whose accelerator and instance type they carry)."""
    alternatives = spec.resources.alternatives()
    for i, want in enumerate(alternatives):
        name, count = want.accelerator or (None, None)
        if ((name is None or asked_accelerator(name) == p.accelerator and count == p.accelerator_count)
                and want.instance_type in (None, p.instance_type)):
            return i
    return len(alternatives)  # (a place of no alternative: the clusters come first)


def _why(room: list[Candidate]) -> str:
    c = room[0]
    return (f"Kubernetes {c.cluster.context} has room: {c.placement.accelerator}:{c.placement.accelerator_count:g} "
            f"at ${c.placement.price_per_hour:.2f}/h, never reclaimed")
