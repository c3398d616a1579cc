"""broker/recovery/earlystop.judge: the early_stop rule over a job's reports."""
from __future__ import annotations

from spotbroker.broker.jobs.stoprule import EarlyStopRule
from spotbroker.broker.recovery.earlystop import judge


def test_patience_counts_reports_that_do_not_beat_the_best_by_min_delta():
    rule = EarlyStopRule(metric="val_loss", patience=2, min_delta=0.1)
    assert judge([(1, 1.0), (2, 0.95), (3, 0.8)], rule) is None          # 0.8 beats 1.0 by 0.2: the best
    verdict = judge([(1, 1.0), (2, 0.95), (3, 0.8), (4, 0.75), (5, 0.71)], rule)
    assert (verdict.best_step, verdict.best_value, verdict.step, verdict.since) == (3, 0.8, 5, 2)


def test_a_curriculum_may_rise_before_min_steps():
    rule = EarlyStopRule(metric="loss", patience=2, min_steps=100)
    rising_then_falling = [(10, 1.0), (50, 2.0), (90, 3.0), (100, 2.5), (110, 2.0), (120, 1.5)]
    assert judge(rising_then_falling, rule) is None
    assert judge([(10, 1.0), (50, 2.0), (90, 3.0)], EarlyStopRule(metric="loss", patience=2)) is not None


def test_max_mode_wants_the_metric_up():
    rule = EarlyStopRule(metric="accuracy", mode="max", patience=1)
    assert judge([(1, 0.5), (2, 0.6)], rule) is None
    assert judge([(1, 0.5), (2, 0.6), (3, 0.6)], rule).best_step == 2
