"""The lines a job's follower reads between its attempts' output: each way
an attempt ends says so in words, with the step it reached."""
from __future__ import annotations

from spotbroker.broker.usecases.narration import AttemptView, JobView, ended, final, next_on, waiting


def attempt(id_: int, end: str | None, step: int | None = None, exit_code: int | None = None,
            reason: str | None = None, place: str = "aws us-east-1a") -> AttemptView:
    return AttemptView(id_, "RUNNING" if end is None else "PREEMPTED", end, reason, exit_code, 1, place, True, step)


def test_each_end_is_said_in_words():
    assert ended(attempt(1, "preempted", 65)) == "preempted at step 65"
    assert ended(attempt(1, "preempted")) == "preempted before any checkpoint"
    assert ended(attempt(1, "vanished", 7)) == "node lost at step 7"
    assert ended(attempt(1, "moved", 7)) == "moved at step 7"
    assert ended(attempt(1, "no_capacity")) == "no capacity on aws us-east-1a"
    assert ended(attempt(1, "failed", exit_code=3)) == "exited 3"
    assert ended(attempt(1, "launch_error", reason="quota")) == "launch failed: quota"


def test_the_next_attempt_resumes_or_restarts_and_a_job_says_why_it_waits():
    nxt = attempt(2, None, 65, place="azure northcentralus")
    assert next_on(attempt(1, "preempted", 65), nxt) == \
        "attempt 1 preempted at step 65, resuming on azure northcentralus (attempt 2)"
    assert next_on(attempt(1, "failed", exit_code=1), nxt) == \
        "attempt 1 exited 1, restarting on azure northcentralus (attempt 2)"
    assert next_on(None, nxt) == "attempt 2 on azure northcentralus"
    held = JobView(5, "HELD", "over budget: $10.00 spent of $5.00 this day", ())
    assert waiting(held) == "job 5 HELD: over budget: $10.00 spent of $5.00 this day"
    assert waiting(JobView(5, "PENDING", None, ())) == "job 5 PENDING"
    assert final(JobView(5, "SUCCEEDED", "no longer relevant", ())) == "job 5 SUCCEEDED"
    assert final(JobView(5, "FAILED", "exit 1", ())) == "job 5 FAILED: exit 1"
