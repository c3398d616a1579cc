"""Placement in the broker: the policy decides from what the attempts table
has seen, on both databases."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import EndReason
from spotbroker.broker.placement.placer import Placer, attempt_key, load_histories, zone_key
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.pricing.offers import rank_offers
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Job, PriceOffer
from spotbroker.broker.usecases import jobs

T4 = {"accelerators": "T4:1"}


@pytest.fixture
def team(factory, catalog_offers):
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "ml")
        return team.id


def submit(factory, team_id, **spec) -> int:
    with transaction(factory) as s:
        return jobs.submit(s, team_id, JobSpec.model_validate({"run": "true", **spec})).id


def add_attempt(s, job_id, place, *, state, end=None, started=None, ended=None, use_spot=True):
    """An attempt on `place` (a Placement); times are datetimes or None."""
    now = Clock().now()
    created = (started or ended or now) - timedelta(minutes=3)
    a = Attempt(job_id=job_id, state=state, reason=end and str(end), end_reason=end, launcher="local",
                cloud=place.cloud, region=place.region, zone=place.zone, zone_id=place.zone_id,
                instance_type=place.instance_type,
                accelerator=place.accelerator, accelerator_count=place.accelerator_count, use_spot=use_spot,
                num_nodes=1, price_per_hour=place.price_per_hour, created_at=created, updated_at=now,
                started_at=started, ended_at=ended)
    s.add(a)
    s.flush()
    return a


def test_each_place_history_is_replayed_from_every_teams_attempts(factory, settings, team):
    job_id = submit(factory, team, resources=T4)
    now = Clock().now()
    with transaction(factory) as s:
        place = rank_offers(s, JobSpec.model_validate({"run": "x", "resources": T4}), limit=1)[0]
        t0 = now - timedelta(hours=5)
        ran = add_attempt(s, job_id, place, state="PREEMPTED", end=EndReason.PREEMPTED, started=t0,
                          ended=t0 + timedelta(hours=2))
        add_attempt(s, job_id, place, state="FAILED", end=EndReason.NO_CAPACITY,
                    ended=t0 + timedelta(hours=2, minutes=30))
        add_attempt(s, job_id, place, state="RUNNING", started=t0 + timedelta(hours=3))
        add_attempt(s, job_id, place, state="PREEMPTED", end=EndReason.MOVED, started=t0 - timedelta(hours=1),
                    ended=t0 - timedelta(minutes=10))
        key = attempt_key(ran)
        histories = load_histories(s, now, settings)
    h = histories[key]
    assert (h.launches_ok, h.capacity_failures, h.preemptions) == (3, 1, 1)
    # up: the moved run (50 min), 2 h until reclaimed, and the 2 h running now; a move is no reclaim
    assert h.ups_lost == 1 and h.last_available is True
    assert h.seconds_up == pytest.approx((50 + 120 + 120) * 60, abs=60)


def test_a_place_that_keeps_reclaiming_loses_to_a_steadier_one_at_the_same_price(factory, settings, team):
    spec = JobSpec.model_validate({"run": "x", "resources": T4})
    job_id = submit(factory, team, resources=T4)
    now = Clock().now()
    with transaction(factory) as s:
        cheapest = rank_offers(s, spec, limit=1)[0]
        for i in range(6):  # another job's spot runs there: ten minutes each, then reclaimed
            start = now - timedelta(hours=12 - i)
            add_attempt(s, job_id, cheapest, state="PREEMPTED", end=EndReason.PREEMPTED, started=start,
                        ended=start + timedelta(minutes=10))
    with factory() as s:
        job = s.get(Job, job_id)
        choice = Placer(settings).choose(s, job, spec, now)
    assert choice.action is Action.LAUNCH and choice.placements[0].use_spot
    first = choice.placements[0]
    assert first.place != cheapest.place and first.price_per_hour == pytest.approx(cheapest.price_per_hour, rel=0.1)
    assert cheapest.place in [p.place for p in choice.placements]  # still tried, but last


def test_reclaims_seen_before_a_job_fade_for_it_and_those_it_saw_do_not(factory, settings, team):
    """Six quick reclaims at the cheapest place four and a half days ago: a job
    submitted now weighs them at 2^-4.5 (a half-life of a day) and tries that
    place first again; a job submitted before them saw them, and still puts it
    behind the others. (Unfaded, the 7-day memory kept every job off it for a week.)"""
    spec = JobSpec.model_validate({"run": "x", "resources": T4})
    now = Clock().now()
    early, late = submit(factory, team, resources=T4), submit(factory, team, resources=T4)
    with transaction(factory) as s:
        s.get(Job, early).created_at = now - timedelta(days=5)
        cheapest = rank_offers(s, spec, limit=1)[0]
        # a tenth below the next: a place with any reclaim at all loses a tie to one never seen
        s.execute(update(PriceOffer).where(PriceOffer.cloud == cheapest.cloud, PriceOffer.region == cheapest.region,
                                           PriceOffer.instance_type == cheapest.instance_type)
                  .values(spot_price=PriceOffer.spot_price * 0.9))
        for i in range(6):
            start = now - timedelta(days=4.5, hours=-i)
            add_attempt(s, early, cheapest, state="PREEMPTED", end=EndReason.PREEMPTED, started=start,
                        ended=start + timedelta(minutes=10))
    with factory() as s:
        placer = Placer(settings)
        saw, new = (placer.choose(s, s.get(Job, j), spec, now) for j in (early, late))
    assert saw.placements[0].place != cheapest.place and cheapest.place in [p.place for p in saw.placements]
    assert new.placements[0].place == cheapest.place


def test_a_place_just_seen_reclaimed_is_tried_last(factory, settings, team):
    spec = JobSpec.model_validate({"run": "x", "resources": T4})
    job_id = submit(factory, team, resources=T4)
    now = Clock().now()
    with transaction(factory) as s:
        cheapest = rank_offers(s, spec, limit=1)[0]
        add_attempt(s, job_id, cheapest, state="PREEMPTED", end=EndReason.PREEMPTED, started=now - timedelta(hours=3),
                    ended=now - timedelta(seconds=5))
    with factory() as s:
        choice = Placer(settings).choose(s, s.get(Job, job_id), spec, now)
    assert choice.placements[0].place != cheapest.place and choice.placements[-1].place == cheapest.place


def test_a_place_whose_instance_had_a_notice_counts_as_reclaimed_before_the_flush_ends_it(factory, settings, team):
    spec = JobSpec.model_validate({"run": "x", "resources": T4})
    job_id = submit(factory, team, resources=T4)
    now = Clock().now()
    with transaction(factory) as s:
        cheapest = rank_offers(s, spec, limit=1)[0]
        noticed = add_attempt(s, job_id, cheapest, state="RUNNING", started=now - timedelta(hours=3))
        noticed.end_reason = EndReason.PREEMPTED  # what recovery writes on a notice (the job PREEMPTING)
        s.flush()
        h = load_histories(s, now, settings)[attempt_key(noticed)]
    assert (h.preemptions, h.last_available) == (1, False)
    with factory() as s:
        choice = Placer(settings).choose(s, s.get(Job, job_id), spec, now)
    assert choice.placements[0].place != cheapest.place and choice.placements[-1].place == cheapest.place


def test_on_demand_only_jobs_take_the_list_price(factory, settings, team):
    resources = {**T4, "use_spot": False}
    spec = JobSpec.model_validate({"run": "x", "resources": resources})
    job_id = submit(factory, team, resources=resources)
    with factory() as s:
        choice = Placer(settings).choose(s, s.get(Job, job_id), spec, Clock().now())
        listed = rank_offers(s, spec)
    assert not any(p.use_spot for p in choice.placements)
    assert choice.placements[0] == listed[0]


def test_a_tight_deadline_goes_on_demand_and_a_loose_one_waits_for_spot(factory, settings, team):
    now = Clock().now()
    tight = {"resources": T4, "estimated_hours": 1.0,
             "deadline": (now + timedelta(hours=1, minutes=13)).isoformat()}
    loose = {"resources": T4, "estimated_hours": 1.0, "deadline": (now + timedelta(hours=30)).isoformat()}
    choices = {}
    for name, fields in (("tight", tight), ("loose", loose)):
        job_id = submit(factory, team, **fields)
        with factory() as s:
            spec = JobSpec.model_validate(s.get(Job, job_id).spec)
            choices[name] = Placer(settings).choose(s, s.get(Job, job_id), spec, now)
    assert choices["tight"].action is Action.LAUNCH and not choices["tight"].placements[0].use_spot
    assert choices["loose"].action is Action.LAUNCH and choices["loose"].placements[0].use_spot


def test_probes_the_policy_asks_for_are_made_once_per_place_and_join_the_history(factory, settings, team):
    """On on-demand with time to spare, the policy watches the home zone's spot
    before going back to it: the reconciler probes it and the answer is history."""
    from spotbroker.broker.launch.local import LocalLauncher
    from spotbroker.broker.reconciler import Reconciler

    now = Clock().now()
    fields = {"resources": T4, "estimated_hours": 1.0, "deadline": (now + timedelta(hours=30)).isoformat()}
    job_ids = [submit(factory, team, **fields) for _ in range(2)]
    spec = JobSpec.model_validate({"run": "x", **fields})
    with transaction(factory) as s:
        od = rank_offers(s, JobSpec.model_validate({"run": "x", "resources": {**T4, "use_spot": False}}), limit=1)[0]
        running = [add_attempt(s, j, od, state="RUNNING", started=now - timedelta(minutes=30), use_spot=False).id
                   for j in job_ids]
    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1)}, settings)
    with factory() as s:
        for job_id, attempt_id in zip(job_ids, running, strict=True):
            choice = rec.placer.choose(s, s.get(Job, job_id), spec, now, running=s.get(Attempt, attempt_id))
            assert choice.action is Action.KEEP  # stays on on-demand while it watches
    probes = rec.placer.take_probes(now)
    assert [p.use_spot for p in probes] == [True]  # two jobs, one place: one probe
    rec._probe(probes)
    p = probes[0]
    with factory() as s:
        history = load_histories(s, Clock().now(), settings)[zone_key(p.cloud, p.region, p.zone, p.zone_id,
                                                                       p.instance_type)]
    assert history.probes_ok == 1 and history.last_available is True
    # within half an interval, nobody probes that place again
    rec.placer.new_pass()
    with factory() as s:
        rec.placer.choose(s, s.get(Job, job_ids[0]), spec, Clock().now(), running=s.get(Attempt, running[0]))
    assert rec.placer.take_probes(Clock().now()) == []


def test_overlapping_runs_in_a_place_are_one_stretch_up(factory, settings, team):
    """Two jobs' spot runs overlap: the place was up all along, whatever the
    one reclaimed early or a refusal in between say."""
    job_id = submit(factory, team, resources=T4)
    now = Clock().now()
    t0 = now - timedelta(hours=12)
    with transaction(factory) as s:
        place = rank_offers(s, JobSpec.model_validate({"run": "x", "resources": T4}), limit=1)[0]
        long_run = add_attempt(s, job_id, place, state="SUCCEEDED", end=EndReason.SUCCEEDED, started=t0,
                               ended=t0 + timedelta(hours=10))
        add_attempt(s, job_id, place, state="PREEMPTED", end=EndReason.PREEMPTED, started=t0 + timedelta(hours=1),
                    ended=t0 + timedelta(hours=2))
        add_attempt(s, job_id, place, state="FAILED", end=EndReason.NO_CAPACITY, ended=t0 + timedelta(hours=3))
        history = load_histories(s, now, settings)[attempt_key(long_run)]
    assert history.seconds_up == pytest.approx(10 * 3600) and history.seconds_down == 0
    assert history.ups_lost == 0 and history.capacity_failures == 0


def test_a_refusal_reaches_the_jobs_placed_later_in_the_same_pass(factory, settings, team):
    spec = JobSpec.model_validate({"run": "x", "resources": T4})
    first, second = (submit(factory, team, resources=T4) for _ in range(2))
    now = Clock().now()
    placer = Placer(settings)
    with transaction(factory) as s:
        choice = placer.choose(s, s.get(Job, first), spec, now)
        refused = add_attempt(s, first, choice.placements[0], state="FAILED", end=EndReason.NO_CAPACITY, ended=now)
        placer.capacity_error(refused, now)
        again = placer.choose(s, s.get(Job, second), spec, now)
    assert again.placements[0].place != choice.placements[0].place
    assert again.placements[-1].place == choice.placements[0].place


def test_the_deadline_goes_on_demand_even_when_the_running_offer_left_the_catalog(factory, settings, team):
    from dataclasses import replace

    now = Clock().now()
    fields = {"resources": T4, "estimated_hours": 1.0, "deadline": (now + timedelta(minutes=55)).isoformat()}
    job_id = submit(factory, team, **fields)
    spec = JobSpec.model_validate({"run": "x", **fields})
    with transaction(factory) as s:
        cheapest = rank_offers(s, spec, limit=1)[0]
        gone = replace(cheapest, region="gone-region", instance_type="gone.type", price_per_hour=0.01)
        attempt = add_attempt(s, job_id, gone, state="RUNNING", started=now - timedelta(minutes=20))
        choice = Placer(settings).choose(s, s.get(Job, job_id), spec, now, running=attempt)
    assert choice.action is Action.LAUNCH and not choice.placements[0].use_spot


def test_a_stored_deadline_without_an_estimate_is_still_placed(factory, settings, team):
    """Jobs stored before estimated_hours existed keep working: the rule is the API's."""
    now = Clock().now()
    fields = {"resources": T4, "deadline": (now + timedelta(hours=30)).isoformat()}
    spec = JobSpec.model_validate({"run": "x", **fields})
    assert spec.deadline_error(now, 900) is not None  # a new submission is refused
    job_id = submit(factory, team, **fields)
    with factory() as s:
        choice = Placer(settings).choose(s, s.get(Job, job_id), spec, now)
    assert choice.action is Action.LAUNCH and choice.placements


def test_failover_is_bounded_but_keeps_the_on_demand_safety_net(factory, settings, team):
    from dataclasses import replace

    from spotbroker.broker.reconciler import Reconciler

    with factory() as s:
        spots = rank_offers(s, JobSpec.model_validate({"run": "x", "resources": T4}), limit=8)
    od = replace(spots[0], use_spot=False, price_per_hour=0.5)
    rec = Reconciler(factory, {}, settings)
    bounded = rec.launching.bounded((*spots, od))
    assert len(bounded) == settings.launch_failover_limit and bounded[-1] == od
    assert rec.launching.bounded(tuple(spots)) == tuple(spots[:settings.launch_failover_limit])


def test_work_done_counts_productive_time_up_to_checkpoints_made_before_each_attempt_ended(factory, settings, team):
    from spotbroker.broker.placement.placer import _work_done
    from spotbroker.broker.store.models import Checkpoint

    job_id = submit(factory, team, resources=T4)
    now = Clock().now()
    d = timedelta(seconds=settings.restart_overhead_seconds)
    with transaction(factory) as s:
        place = rank_offers(s, JobSpec.model_validate({"run": "x", "resources": T4}), limit=1)[0]
        start = now - timedelta(hours=5)
        old = add_attempt(s, job_id, place, state="PREEMPTED", end=EndReason.MOVED, started=start,
                          ended=start + timedelta(hours=3))
        old.created_at = start  # launched when it came up: productive from start + d
        for at, step in ((start + timedelta(hours=2), 1), (start + timedelta(hours=3, minutes=5), 2)):
            s.add(Checkpoint(job_id=job_id, attempt_id=old.id, step=step, uri=f"file:///c/{step}", bytes=1,
                             committed_at=at))  # the second came after the attempt ended: a late flush
        live = add_attempt(s, job_id, place, state="RUNNING", started=now - timedelta(hours=1))
        live.created_at = now - timedelta(hours=1)
    with factory() as s:
        done = _work_done(s, s.get(Job, job_id), now, settings.restart_overhead_seconds)
    expected = (timedelta(hours=2) - d) + (timedelta(hours=1) - d)
    assert done == pytest.approx(expected.total_seconds(), abs=1)


@pytest.mark.parametrize("caused", ["asked for", "vanished"])
def test_a_reclaim_a_team_could_cause_steers_its_own_jobs_only(factory, settings, team, caused):
    """A tenant's simulate-preemption, or a node its own job ended (gone
    without a notice), fed the shared history: fifteen such reclaims steered
    every team away from a place (and shortened their checkpoint intervals).
    They count for the team that could have caused them; a reclaim the
    cloud announced still counts for everyone."""
    from spotbroker.broker.recovery import intervals

    spec = JobSpec.model_validate({"run": "x", "resources": T4})
    with transaction(factory) as s:
        other, _ = auth.create_team(s, "vision")
        other = other.id
    mine, theirs = submit(factory, team, resources=T4), submit(factory, other, resources=T4)
    now = Clock().now()
    with transaction(factory) as s:
        cheapest = rank_offers(s, spec, limit=1)[0]
        for i in range(15):
            start = now - timedelta(hours=16 - i)
            a = add_attempt(s, mine, cheapest, state="PREEMPTED", started=start, ended=start + timedelta(minutes=5),
                            end=EndReason.PREEMPTED if caused == "asked for" else EndReason.VANISHED)
            a.preemption_requested = caused == "asked for"
        probe = add_attempt(s, theirs, cheapest, state="RUNNING", started=now - timedelta(minutes=1))
        shared = load_histories(s, now, settings)[attempt_key(probe)]
        assert shared.preemptions == 0
        assert intervals.zone_record(s, probe, now, settings.placement_history_days, other).reclaims == 0
        assert intervals.zone_record(s, probe, now, settings.placement_history_days, team).reclaims == 15
        s.delete(probe)
    with factory() as s:
        placer = Placer(settings)
        steered, free = (placer.choose(s, s.get(Job, j), spec, now) for j in (mine, theirs))
    assert steered.placements[0].place != cheapest.place
    assert free.placements[0].place == cheapest.place
    # The same reclaims announced by the cloud count for every team.
    with transaction(factory) as s:
        s.execute(update(Attempt).where(Attempt.job_id == mine).values(end_reason=EndReason.PREEMPTED,
                                                                        preemption_requested=False))
    with factory() as s:
        assert Placer(settings).choose(s, s.get(Job, theirs), spec, now).placements[0].place != cheapest.place
