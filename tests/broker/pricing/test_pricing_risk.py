"""Published risk as the policy's prior: an equally priced zone with a higher
published risk is chosen later; no risk means the neutral prior; the
policy's own observations still outweigh the prior."""
from datetime import UTC, datetime

import pytest

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.placement.placer import Placer
from spotbroker.broker.placement.policy import Action, Event, Observation, SpotBroker, ZoneHistory, ZoneState
from spotbroker.broker.placement.policy.egress import region_of
from spotbroker.broker.placement.policy.estimators import PRIOR_UP_S, estimate, prior_up_s
from spotbroker.broker.pricing import risk, store
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job, Team


def zone(name, price, published=None):
    history = ZoneHistory()
    history.record(Event.PROBE_OK, 0.0)
    return ZoneState(name, region_of(name), price, 3.0, history, published)


def observation(zones):
    return Observation(now_s=0.0, step_s=600.0, work_left_s=36000.0, work_total_s=36000.0, started_s=0.0,
                       deadline_s=None, restart_overhead_s=720.0, checkpoint_gb=50.0, zones=tuple(zones),
                       running=None, last_zone=None)


@pytest.mark.parametrize("first", ["us-east-1a", "us-east-1b"])
def test_a_high_risk_zone_is_chosen_after_an_equally_priced_low_risk_one(first):
    low, high = zone("us-east-1a", 1.0, risk.from_advisor_band(0)), zone("us-east-1b", 1.0, risk.from_advisor_band(4))
    zones = [low, high] if first == "us-east-1a" else [high, low]  # whatever the order given
    decision = SpotBroker().decide(observation(zones))
    assert decision.action is Action.LAUNCH
    assert [o.zone for o in decision.offers][:2] == ["us-east-1a", "us-east-1b"]


def test_no_published_risk_is_the_neutral_prior():
    assert prior_up_s(None) == PRIOR_UP_S
    assert estimate(ZoneHistory(), None) == estimate(ZoneHistory())
    assert prior_up_s(0.025) > PRIOR_UP_S > prior_up_s(0.25)
    assert prior_up_s(0.0001) == 4 * PRIOR_UP_S and prior_up_s(0.9) == PRIOR_UP_S / 4  # bounded


def test_observations_outweigh_the_prior():
    """A low-risk zone seen reclaimed again and again ends up worse than a
    high-risk one seen to hold."""
    flaky, steady, t = ZoneHistory(join_within_s=900), ZoneHistory(join_within_s=900), 0.0
    for _ in range(12):
        for up in (True, False):
            flaky.record(Event.PROBE_OK if up else Event.PROBE_FAILED, t)
            steady.record(Event.PROBE_OK, t)
            t += 600
    assert estimate(flaky, 0.025).up_mean_s < estimate(steady, 0.25).up_mean_s


def test_the_placement_path_reads_risk_from_the_offers(factory):
    """Two equally priced offers: the reconciler's placement launches on the low-risk one first."""
    now = datetime(2026, 11, 1, tzinfo=UTC)
    rows = [OfferRow(cloud="aws", region="us-east-1", zone=z, zone_id=zid, instance_type="p4d.24xlarge",
                     accelerator="A100", accelerator_count=8, vcpus=96, memory_gib=1152, spot_price=8.0,
                     ondemand_price=21.96, risk=r, risk_source="aws-advisor")
            for z, zid, r in (("us-east-1a", "use1-az6", 0.25), ("us-east-1b", "use1-az1", 0.025))]
    spec = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "A100:8"}})
    with transaction(factory) as s:
        store.apply_refresh(s, "aws", rows, now, {"aws": None})
        team = Team(name="ml", created_at=now)
        s.add(team)
        s.flush()
        job = Job(team_id=team.id, name="j", state="PENDING", spec=spec.model_dump(mode="json"), restarts=0,
                  recoveries=0, created_at=now, updated_at=now, version=1)
        s.add(job)
    with factory() as s:
        choice = Placer(Settings(_env_file=None)).choose(s, s.get(Job, job.id), spec, now)
    assert choice.action is Action.LAUNCH
    assert [p.zone_id for p in choice.placements][:2] == ["use1-az1", "use1-az6"]
