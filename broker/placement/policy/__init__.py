"""Placement policy: what a job should run on next (used by the reconciler and the simulator).

The interface (all plain dataclasses, `model.py`; times in seconds on the
caller's clock, prices in $/h, sizes in GB):

    from spotbroker.broker.placement.policy import SpotBroker, Observation, ZoneState, ZoneHistory, Event

    policy = SpotBroker()                       # one per job; it only caches solved plans
    history = {z: ZoneHistory(join_within_s=1.5 * pass_s) for z in zones}
    ...each pass, for a PENDING/RECOVERING job, or a running job with a deadline:
    history[z].record(Event.PREEMPTED, now)     # and LAUNCH_OK, CAPACITY_FAILURE,
                                                # PROBE_OK/FAILED, RUNNING (one per pass
                                                # for the zone our spot instance is in)
    decision = policy.decide(Observation(
        now_s=now, step_s=pass_s, work_left_s=..., work_total_s=..., started_s=...,
        deadline_s=... or None, restart_overhead_s=..., checkpoint_gb=...,
        zones=tuple(ZoneState(zone, region_of(zone), spot_price, on_demand_price, history[zone])
                    for zone in candidate_zones),
        running=Running(zone, Capacity.SPOT, overhead_left_s, since_s) or None,
        last_zone=zone_holding_the_checkpoint or None,
        egress=EgressPrices(...)))              # defaults: the protocol's rule

`decision.action` is KEEP, WAIT (stop the instance) or LAUNCH: try
`decision.offers` (zone, SPOT | ON_DEMAND) in order, the first success
replaces the running instance (an offer equal to it is a restart); if all
fail, apply `decision.otherwise` (KEEP or WAIT). Then probe `decision.probe`
and record the results. With a deadline the policy never misses it on its
own (on-demand is its safety net); without one it waits for spot. See
`model.py` for the fields and `spotbroker.py` for how it decides.
"""
from spotbroker.broker.placement.policy.egress import EgressPrices, region_of
from spotbroker.broker.placement.policy.model import (
    Action,
    Capacity,
    Decision,
    Event,
    Observation,
    Offer,
    Policy,
    Running,
    ZoneHistory,
    ZoneState,
)
from spotbroker.broker.placement.policy.spotbroker import SpotBroker

__all__ = [
    "Action",
    "Capacity",
    "Decision",
    "EgressPrices",
    "Event",
    "Observation",
    "Offer",
    "Policy",
    "Running",
    "SpotBroker",
    "ZoneHistory",
    "ZoneState",
    "region_of",
]
