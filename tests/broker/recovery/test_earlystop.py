"""The early_stop rule: counted by the library over every report
(agent/checkpoint/reports.Rule.count), judged by the broker on the newest
standing it is sent (broker/recovery/earlystop.judge)."""
from __future__ import annotations

from typing import Any

from spotbroker.agent.checkpoint.reports import Rule
from spotbroker.broker.jobs.stoprule import EarlyStopRule
from spotbroker.broker.recovery.earlystop import judge


def judged(points: list[tuple[int, float]], rule: EarlyStopRule, extra: dict[str, Any] | None = None):
    """Every point counted by the library, then the broker's verdict on them."""
    counting, extra = Rule.from_env(rule.env_value()), {} if extra is None else extra
    reports = []
    for step, value in points:
        standing = counting.count(extra, step, value)
        reports.append(({"step": step, "values": {rule.metric: value},
                         **({"early_stop": standing} if standing else {})}, None))
    return judge(reports, rule)


def test_patience_counts_reports_that_do_not_beat_the_best_by_min_delta():
    rule = EarlyStopRule(metric="val_loss", patience=2, min_delta=0.1)
    assert judged([(1, 1.0), (2, 0.95), (3, 0.8)], rule) is None          # 0.8 beats 1.0 by 0.2: the best
    verdict = judged([(1, 1.0), (2, 0.95), (3, 0.8), (4, 0.75), (5, 0.71)], rule)
    assert (verdict.best_step, verdict.best_value, verdict.step, verdict.since) == (3, 0.8, 5, 2)


def test_a_curriculum_may_rise_before_min_steps():
    rule = EarlyStopRule(metric="loss", patience=2, min_steps=100)
    rising_then_falling = [(10, 1.0), (50, 2.0), (90, 3.0), (100, 2.5), (110, 2.0), (120, 1.5)]
    assert judged(rising_then_falling, rule) is None
    assert judged([(10, 1.0), (50, 2.0), (90, 3.0)], EarlyStopRule(metric="loss", patience=2)) is not None


def test_max_mode_wants_the_metric_up():
    rule = EarlyStopRule(metric="accuracy", mode="max", patience=1)
    assert judged([(1, 0.5), (2, 0.6)], rule) is None
    assert judged([(1, 0.5), (2, 0.6), (3, 0.6)], rule).best_step == 2


def test_a_resumed_run_counts_on_from_its_checkpoints_standing_and_a_repeated_step_counts_once():
    rule = EarlyStopRule(metric="loss", patience=3)
    at_checkpoint: dict[str, Any] = {}
    assert judged([(1, 1.0), (2, 0.5), (3, 0.6)], rule, at_checkpoint) is None  # saved with the step-3 checkpoint
    resumed = dict(at_checkpoint)  # the next attempt restores it, and repeats steps 4 and 5
    assert judged([(3, 0.6), (4, 0.7)], rule, resumed) is None
    assert judged([(5, 0.7)], rule, resumed).best_step == 2


def test_the_broker_fires_at_the_first_standing_that_meets_patience_and_ignores_reports_without_one():
    rule = EarlyStopRule(metric="loss", patience=3)
    met = {"best_step": 20, "best_value": 0.5, "since": 3, "met": True}
    improved = {"best_step": 60, "best_value": 0.4, "since": 0, "met": False}
    assert judge([({"step": 50, "values": {}, "early_stop": met}, None), ({"step": 60, "values": {}}, None),
                  ({"step": 60, "values": {}, "early_stop": improved}, None)], rule).step == 50  # a backlog
    assert judge([({"step": 50, "values": {}, "early_stop": {**met, "since": 2}}, None)], rule) is None
    assert judge([({"step": 50, "values": {}, "early_stop": {**met, "best_value": "nan"}}, None)], rule) is None
    assert judge([({"step": 60, "values": {"loss": 9.0}}, None)] * 10, rule) is None  # no standing: no count
    for step in (2**70, -1, True):  # a step no column holds (an agent may send any JSON)
        assert judge([({"step": step, "values": {}, "early_stop": met}, None)], rule) is None
