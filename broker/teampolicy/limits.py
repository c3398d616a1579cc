"""A team policy's limits (broker/teampolicy/policy.py), where they bite.

* At submission, `submit_errors`: a job that breaks a limit is refused
  (422), the message naming the rule and the limit. A job that fits but
  would exceed the team's GPUs at once now is accepted and HELD
  (`gpus_hold`), and its answer warns of it.
* Before each attempt, `hold_reason` and `admits`: the reconciler holds a
  job that a limit lowered since forbids (what runs is never stopped), and
  launches only on places within the limits.

A pre-flight (`preflight`) runs first, on its own accelerators if it names
them: while it has not passed, they meet the same limits (refused at
submission naming `preflight.accelerators`; held, or its places filtered,
before it launches).

The job's GPUs: its accelerators per node (the largest count among its
alternatives) times its nodes. The job's $/h: a place's price per node
(spot or on-demand, as the job asks) times its nodes; at submission, the
cheapest place that fits must be within `max_price_per_hour`.
"""
from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.preflight import trial, wanted
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.placement.host import on_host
from spotbroker.broker.pricing.offers import Placement, rank_offers
from spotbroker.broker.store.models import Attempt, Job, Team
from spotbroker.broker.teampolicy import policy as policies
from spotbroker.broker.teampolicy.policy import EMPTY, Policy

HELD = "held by a limit: "


def job_gpus(spec: JobSpec) -> float:
    per_node = max(((alt.accelerator or ("", 0.0))[1] for alt in spec.resources.alternatives()), default=0.0)
    return per_node * spec.num_nodes


def gpus_running(session: Session, team_id: int, other_than: int | None = None) -> float:
    """Accelerators of the team's launching and running attempts (every node)."""
    query = (select(func.coalesce(func.sum(Attempt.accelerator_count * Attempt.num_nodes), 0.0))
             .join(Job, Job.id == Attempt.job_id)
             .where(Job.team_id == team_id, Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES])))
    if other_than is not None:
        query = query.where(Attempt.job_id != other_than)
    return float(session.scalar(query) or 0.0)


def _n(value: float) -> str:
    return f"{value:g}"


def _refusals(spec: JobSpec, team: str, policy: Policy, preflight: bool = True) -> list[dict[str, str]]:
    """What breaks the accelerator, node and GPU limits, as field errors
    (the pre-flight's too, unless `preflight` is False: it has passed)."""
    out = []
    if policy.allowed_accelerators is not None:
        allowed = ", ".join(policy.allowed_accelerators)
        for alt in spec.resources.alternatives():
            if alt.accelerators and not policy.allows(alt.accelerator[0]):
                out.append({"field": "resources.accelerators", "message": f"accelerators: {alt.accelerators} is "
                            f"not allowed for team {team} (allowed_accelerators: {allowed})"})
                break
    if policy.max_nodes is not None and spec.num_nodes > policy.max_nodes:
        out.append({"field": "num_nodes", "message": f"num_nodes: {spec.num_nodes} nodes is over team {team}'s "
                    f"limit of {policy.max_nodes} nodes per job (max_nodes)"})
    gpus = job_gpus(spec)
    if policy.max_gpus_running is not None and gpus > policy.max_gpus_running:
        out.append({"field": "resources.accelerators", "message": f"the job needs {_n(gpus)} GPUs at once, over "
                    f"team {team}'s limit of {policy.max_gpus_running} GPUs at once (max_gpus_running)"})
    if preflight and spec.preflight is not None and spec.preflight.accelerators:
        out += _preflight_refusals(spec, team, policy)
    return out


def _preflight_refusals(spec: JobSpec, team: str, policy: Policy) -> list[dict[str, str]]:
    """What of the pre-flight's own accelerators breaks the limits (it is a launch of its own)."""
    out, wanted = [], spec.preflight.accelerators
    name, count = trial(spec).resources.accelerator
    if not policy.allows(name):
        out.append({"field": "preflight.accelerators", "message": f"preflight.accelerators: {wanted} is not allowed "
                    f"for team {team} (allowed_accelerators: {', '.join(policy.allowed_accelerators)})"})
    if policy.max_gpus_running is not None and count > policy.max_gpus_running:
        out.append({"field": "preflight.accelerators", "message": f"preflight.accelerators: the pre-flight needs "
                    f"{_n(count)} GPUs at once, over team {team}'s limit of {policy.max_gpus_running} GPUs at once "
                    "(max_gpus_running)"})
    return out


def _price_problem(session: Session, spec: JobSpec, team: str, policy: Policy, cpu_jobs_on_host: bool,
                   what: str = "the job") -> str | None:
    if policy.max_price_per_hour is None or on_host(spec, cpu_jobs_on_host):
        return None
    found = [p for p in rank_offers(session, spec, limit=20) if policy.allows(p.accelerator)][:1]
    if not found:
        return None  # nothing fits at all: placement says so (no_feasible_offer)
    best = found[0]
    cost = best.price_per_hour * spec.num_nodes
    if cost <= policy.max_price_per_hour:
        return None
    kind = "spot" if best.use_spot else "on-demand"
    return (f"max_price_per_hour: the cheapest place that fits costs ${cost:.2f}/h for {what} "
            f"({spec.num_nodes} x ${best.price_per_hour:.4f}/h, {best.place} {kind}), "
            f"over team {team}'s limit of ${policy.max_price_per_hour:.2f}/h per job")


def submit_errors(session: Session, spec: JobSpec, team: str, policy: Policy,
                  cpu_jobs_on_host: bool) -> list[dict[str, str]]:
    """Why the team's policy refuses this job, as field errors ([] when it fits)."""
    if policy is EMPTY:
        return []
    out = _refusals(spec, team, policy)
    if not out and (problem := _price_problem(session, spec, team, policy, cpu_jobs_on_host)):
        out.append({"field": "resources", "message": problem})
    if not out and spec.preflight is not None and (problem := _preflight_price(session, spec, team, policy,
                                                                               cpu_jobs_on_host)):
        out.append({"field": "preflight.accelerators" if spec.preflight.accelerators else "preflight",
                    "message": problem})
    return out


def _preflight_price(session: Session, spec: JobSpec, team: str, policy: Policy, cpu_jobs_on_host: bool) -> str | None:
    return _price_problem(session, trial(spec), team, policy, cpu_jobs_on_host, "its pre-flight")


def gpus_hold(session: Session, team_id: int, spec: JobSpec, policy: Policy, job_id: int | None = None,
              what: str = "it") -> str | None:
    """Why the team's GPUs at once hold the job now (None: it may launch)."""
    if policy.max_gpus_running is None or (gpus := job_gpus(spec)) == 0:
        return None
    running = gpus_running(session, team_id, other_than=job_id)
    if running + gpus <= policy.max_gpus_running:
        return None
    return f"{HELD}team max {policy.max_gpus_running} GPUs at once, {_n(running)} running ({what} needs {_n(gpus)})"


def hold_reason(session: Session, job: Job, spec: JobSpec, team: str, policy: Policy,
                cpu_jobs_on_host: bool) -> str | None:
    """Why the team's policy holds the job before its next attempt (a limit
    lowered since it was submitted, or the GPUs at once now), or None. A
    pre-flight yet to pass meets them too: it launches first."""
    if policy is EMPTY:
        return None
    flight = wanted(job, spec)
    if refused := _refusals(spec, team, policy, preflight=flight):
        return HELD + refused[0]["message"]
    if problem := _price_problem(session, spec, team, policy, cpu_jobs_on_host):
        return HELD + problem
    if flight and (problem := _preflight_price(session, spec, team, policy, cpu_jobs_on_host)):
        return HELD + problem
    return gpus_holds(session, job.team_id, spec, policy, flight, job.id)


def gpus_holds(session: Session, team_id: int, spec: JobSpec, policy: Policy, flight: bool,
               job_id: int | None = None) -> str | None:
    """Why the team's GPUs at once hold the job's next launch: its own, or its
    pre-flight's while `flight` (at submission as before each attempt)."""
    return gpus_hold(session, team_id, spec, policy, job_id) or (
        gpus_hold(session, team_id, trial(spec), policy, job_id, "its pre-flight") if flight else None)


def admits(placement: Placement, spec: JobSpec, policy: Policy) -> bool:
    """Whether the policy lets the job launch on this place (its accelerator, its $/h)."""
    if not policy.allows(placement.accelerator):
        return False
    return policy.max_price_per_hour is None or placement.price_per_hour * spec.num_nodes <= policy.max_price_per_hour


def policy_of(session: Session, job: Job) -> Policy:
    return policies.get(session, job.team_id)


def team_hold(session: Session, job: Job, spec: JobSpec, cpu_jobs_on_host: bool) -> str | None:
    """The reconciler's question before it places a job: does its team's policy hold it?"""
    policy = policies.get(session, job.team_id)
    if policy is EMPTY:
        return None
    return hold_reason(session, job, spec, session.get(Team, job.team_id).name, policy, cpu_jobs_on_host)


def over(placement: Placement, spec: JobSpec, policy: Policy) -> str:
    """What of the policy a place the placement policy chose breaks (see `admits`)."""
    if not policy.allows(placement.accelerator):
        return f"{placement.accelerator} is not in allowed_accelerators ({', '.join(policy.allowed_accelerators)})"
    return (f"{placement.place} costs ${placement.price_per_hour * spec.num_nodes:.2f}/h for the job, over "
            f"max_price_per_hour ${policy.max_price_per_hour:.2f}")
