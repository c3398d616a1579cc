"""What a job's process can do with its attempt's agent token (it can read
it on the local launcher): it cannot jump the attempt's seq to the top, which
would have every later report of the real agent ignored as already
delivered, nor have a checkpoint recorded under another team's prefix."""
from __future__ import annotations

from support.helpers import ev, post, running_job

SEQ_SLACK = 10_000  # broker.recovery.agent_channel.SEQ_SLACK




def test_an_agent_cannot_jump_its_seq_far_ahead_nor_plant_a_checkpoint_in_another_teams_prefix(
        api, team_headers, settings):
    h, _ = team_headers("ml"), team_headers("other")
    job, token = running_job(api, h, settings)
    try:
        r = post(api, token, ev(2**31 - 1, "heartbeat"))
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "events.0.seq" and "nothing of the batch" in r.json()["detail"]
        r = post(api, token, ev(5, "heartbeat"), ev(SEQ_SLACK * 100, "trainer_exited", exit_code=0))
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "events.1.seq"
        later = post(api, token, ev(SEQ_SLACK // 2, "heartbeat"))  # the agent still reports afterwards
        assert later.status_code == 200 and later.json()["accepted"] == 1
        assert later.json()["last_seq"] == SEQ_SLACK // 2
        attempt = job["attempts"][-1]["id"]
        theirs = f"{settings.checkpoint_uri}/other/{job['id']}/{attempt}/step-000000000007"
        r = post(api, token, ev(SEQ_SLACK // 2 + 1, "checkpoint_committed", step=7, uri=theirs, bytes=1, seconds=0.1))
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "events.0.data.uri"
        assert api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"] == []
    finally:
        api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
