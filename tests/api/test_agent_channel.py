"""The node agent's channel, spoken to as an agent speaks: over HTTP, with
the attempt's own token."""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import pytest
from support.helpers import ev, post, running_job, wait_for, wait_state

from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Checkpoint


def test_only_the_attempts_own_token_is_accepted(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    assert post(api, "sba_forged", ev(100, "heartbeat")).status_code == 401
    assert post(api, h["Authorization"].split()[1], ev(100, "heartbeat")).status_code == 401  # a team token
    assert api.post("/v1/agent/events", json={"events": []}).status_code == 401
    r = post(api, token, ev(100, "no_such_event"))
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_resent_events_are_stored_once_and_a_second_notice_changes_nothing(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    notice = ev(100, "preemption_notice", cloud="local", kind="preemption", deadline=None)
    first = post(api, token, notice).json()
    again = post(api, token, notice).json()
    assert (first["accepted"], again["accepted"], again["last_seq"]) == (1, 0, 100)
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "PREEMPTING"
    r = post(api, token, ev(101, "no_flush", reason="no library"), ev(102, "preemption_notice", cloud="local"))
    assert r.json()["cancel"] is True  # the attempt is over: its agent should stop the trainer
    job = wait_state(api, h, job["id"], {"RUNNING", "LAUNCHING", "RECOVERING"})
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert [e["type"] for e in events].count("preemption_notice") == 2  # both kept
    moves = [(e["data"]["from"], e["data"]["to"]) for e in events if e["type"] == "job_state"]
    assert moves.count(("RUNNING", "PREEMPTING")) == 1 and moves.count(("PREEMPTING", "RECOVERING")) == 1
    first_attempt = api.get(f"/v1/jobs/{job['id']}", headers=h).json()["attempts"][0]
    assert (first_attempt["state"], first_attempt["reason"]) == ("PREEMPTED", "preempted")
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_notice_for_a_finished_job_moves_nothing_but_is_kept(api, team_headers, settings):
    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "true"}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"SUCCEEDED"})
    token = agent_token(settings.signing_key(), job["attempts"][0]["id"])
    r = post(api, token, ev(500, "preemption_notice", cloud="aws"),
             committed(501, 3, f"{attempt_prefix(settings, job)}/step-000000000003", reason="flush"))
    assert r.status_code == 200 and r.json()["cancel"] is True
    assert api.get(f"/v1/jobs/{job_id}", headers=h).json()["state"] == "SUCCEEDED"
    # A late checkpoint is still a committed checkpoint under that attempt's own prefix.
    assert [c["step"] for c in api.get(f"/v1/jobs/{job_id}/checkpoints", headers=h).json()["checkpoints"]] == [3]


def test_logs_are_stored_by_offset(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    auth = {"Authorization": f"Bearer {token}"}
    attempt = job["attempts"][-1]["id"]

    def send(offset: int, data: bytes) -> int:
        r = api.post("/v1/agent/logs", content=data, headers={**auth, "X-Log-Offset": str(offset)})
        assert r.status_code == 200, r.text
        return r.json()["size"]

    base = send(0, b"")  # what the agent itself already shipped
    assert send(base, b"one\n") == base + 4
    assert send(base, b"one\n") == base + 4                  # re-sent: ignored
    assert send(base + 2, b"e\ntwo\n") == base + 8           # overlapping: only the new bytes
    assert send(base + 100, b"gap\n") == base + 8            # past the end: refused, resend from size
    text = api.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": attempt}, headers=h).text
    assert text.endswith("one\ntwo\n")
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_log_keeps_at_most_max_log_bytes_then_a_marker_and_one_event(api, team_headers, settings):
    """Past SPOTBROKER_MAX_LOG_BYTES the chunk that crosses it is cut and
    ends with the marker; what the agent sends after is taken (it moves on)
    and dropped; the job's events say so once, whatever is re-sent."""
    h = team_headers()
    job, token = running_job(api, h, settings)
    auth = {"Authorization": f"Bearer {token}"}
    base = api.post("/v1/agent/logs", content=b"", headers={**auth, "X-Log-Offset": "0"}).json()["size"]
    settings.max_log_bytes = limit = base + 100

    def send(offset: int, data: bytes) -> int:
        r = api.post("/v1/agent/logs", content=data, headers={**auth, "X-Log-Offset": str(offset)})
        assert r.status_code == 200, r.text
        return r.json()["size"]

    assert send(base, b"a" * 60) == base + 60
    assert send(base + 60, b"b" * 60) == base + 120          # crosses the bound: cut, and taken whole
    assert send(base + 60, b"b" * 60) == base + 120          # re-sent after the cut: taken, dropped
    assert send(base + 120, b"c" * 10_000) == base + 10_120  # later output: taken, dropped
    text = api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text
    assert text.endswith("a" * 60 + "b" * 40 + f"\n[spotbroker: output truncated here: a log keeps at most {limit} "
                         "bytes (SPOTBROKER_MAX_LOG_BYTES); the rest was not stored]\n")
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert [e["data"] for e in events if e["type"] == "log_truncated"] == [
        {"bytes": limit, "setting": "SPOTBROKER_MAX_LOG_BYTES"}]
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_node_whose_agent_goes_silent_is_recovered(api, team_headers, settings, job_scratch):
    h = team_headers()
    marker = job_scratch / "first"
    run = f"if [ -e {marker} ]; then echo second; else touch {marker}; sleep 60; fi"
    job_id = api.post("/v1/jobs", json={"run": run}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"})
    token = agent_token(settings.signing_key(), job["attempts"][0]["id"])
    post(api, token, ev(1000, "heartbeat", pid=1, library=False))
    # Silence only once its command runs: an attempt recovered before its touch
    # (a loaded machine) would leave the second to sleep its 60 s.
    wait_for(marker.exists, 120, what="the first attempt's command running")
    settings.heartbeat_timeout = 1.0  # shorter than the agent's 5 s beat: it now counts as silent
    try:
        # Only the first attempt is to fall silent: a loaded machine may take
        # longer than 1 s between the next one's beats too.
        wait_for(lambda: len(api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"]) > 1, 30,
                 what="a second attempt")
    finally:
        settings.heartbeat_timeout = 60.0
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    first, second = job["attempts"]
    assert (first["state"], first["reason"]) == ("PREEMPTED", "vanished") and second["state"] == "SUCCEEDED"


def attempt_prefix(settings, job: dict, team: str = "ml") -> str:
    return f"{settings.checkpoint_uri}/{team}/{job['id']}/{job['attempts'][-1]['id']}"


AFTER_AGENT = 5_000  # seqs the job's own agent (it runs, and reports) will not reach in a test


def committed(seq: int, step: int, uri: object, reason: str = "periodic") -> dict:
    return ev(AFTER_AGENT + seq, "checkpoint_committed", step=step, uri=uri, bytes=10, seconds=0.1, reason=reason)


def test_a_checkpoint_outside_the_attempts_prefix_is_refused_and_keep_writes_nothing_there(
        api, team_headers, settings, job_scratch):
    """The attack: report a checkpoint at file:///etc, then ask to keep it
    (which once created /etc/KEEP). Also a directory outside the prefix that
    looks like a committed checkpoint (a manifest planted there)."""
    h = team_headers()
    job, token = running_job(api, h, settings)
    planted = job_scratch / "step-000000000007"
    planted.mkdir()
    (planted / "MANIFEST.json").write_text('{"format": "spotbroker-checkpoint/1", "step": 7, "objects": {}}')
    etc_keep_before = os.path.exists("/etc/KEEP")
    try:
        answers = [post(api, token, committed(seq, 7, uri)) for seq, uri in ((1, "file:///etc"), (2, planted.as_uri()))]
        for c in api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]:
            keep = api.post(f"/v1/jobs/{job['id']}/checkpoints/{c['id']}/keep", headers=h)
            assert keep.status_code == 409, keep.text
        assert os.path.exists("/etc/KEEP") == etc_keep_before
        assert not (planted / "KEEP").exists()
        for r in answers:
            assert r.status_code == 422, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["errors"][0]["field"] == "events.0.data.uri"
        assert api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"] == []
        events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
        refused = [e for e in events if e["type"] == "checkpoint_refused"]
        assert [e["data"]["uri"] for e in refused] == ["file:///etc", planted.as_uri()]
    finally:
        if not etc_keep_before and os.path.exists("/etc/KEEP"):
            os.unlink("/etc/KEEP")  # left by the broker before the fix
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


ODD_URIS = ["ftp://host/x", "relative/step-000000000007", "step-000000000007", "s3://bucket/x/step-000000000007",
            "gs://bucket/step-000000000007", "az://c/step-000000000007", "file://otherhost/step-000000000007",
            "http://127.0.0.1/step-000000000007", "", 7, None, ["file:///etc"], "file:///" + "a/" * 2000,
            "file:///etc\x00/step-000000000007"]


def test_odd_checkpoint_uris_are_refused_never_a_server_error(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    prefix = attempt_prefix(settings, job)
    other_attempt = prefix.rsplit("/", 1)[0] + f"/{job['attempts'][-1]['id'] + 1}"
    escapes = [f"{prefix}/../../../../etc", f"{prefix}/%2e%2e/%2E%2E/step-000000000007",
               f"{prefix}/step-000000000007/..", f"{prefix}/step-000000000007?x=1", f"{prefix}//step-000000000007",
               f"{prefix}/step-000000000008", f"{prefix}/step-000000000007/deeper", f"{prefix}",
               f"{other_attempt}/step-000000000007", f"{prefix}/./step-000000000007",
               f"{prefix}/step-000000000007%2f..%2f..", f"{prefix}%2f..%2fstep-000000000007"]
    for seq, uri in enumerate(ODD_URIS + escapes, start=1):
        r = post(api, token, committed(seq, 7, uri))
        assert r.status_code == 422, (uri, r.text)
        assert r.json()["errors"][0]["field"] in ("events.0.data.uri", "events.0.data"), uri  # data: the NUL
    for seq, (name, bad) in enumerate([("step", -1), ("step", 2**63), ("step", "7"), ("step", True),
                                       ("bytes", 2**64), ("bytes", 2**50 + 1), ("seconds", "x"), ("reason", "r" * 17)],
                                      start=100):
        event = committed(seq, 7, f"{prefix}/step-000000000007")
        event["data"][name] = bad
        r = post(api, token, event)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == f"events.0.data.{name}", (name, r.text)
    # The same place spelled otherwise is the same place; the broker stores its own spelling.
    spelled = prefix.replace("file:///", "file://localhost/", 1) + "/step-00000000000%37"
    r = post(api, token, ev(AFTER_AGENT + 200, "heartbeat"), committed(201, 7, spelled))
    assert r.status_code == 200, r.text
    [c] = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]
    assert c["uri"] == f"{prefix}/step-000000000007"
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_refused_checkpoint_refuses_its_batch_and_is_told_once(api, team_headers, settings):
    """The agent re-sends a refused batch one event at a time: the good ones
    are then stored in order, the refused one is told on the job once."""
    h = team_headers()
    job, token = running_job(api, h, settings)
    prefix = attempt_prefix(settings, job)
    batch = [ev(AFTER_AGENT + 1, "heartbeat"), committed(2, 5, "file:///etc"),
             committed(3, 6, f"{prefix}/step-000000000006")]
    r = post(api, token, *batch)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "events.1.data.uri"
    assert api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"] == []
    assert [post(api, token, e).status_code for e in batch] == [200, 422, 200]
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert [e["type"] for e in events].count("checkpoint_refused") == 1
    assert [c["step"] for c in api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]] == [6]
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_an_attempts_checkpoint_rows_are_bounded_and_listed_in_pages(api, team_headers, settings, monkeypatch):
    """A trainer reporting 200 checkpoints a second made 20,292 rows in
    100 s, all answered in one 4.5 MB list: past MAX_CHECKPOINTS_PER_ATTEMPT
    the attempt's oldest unkept rows are forgotten, and the list comes in
    pages (newest step first)."""
    from spotbroker.broker.recovery import agent_channel

    monkeypatch.setattr(agent_channel, "MAX_CHECKPOINTS_PER_ATTEMPT", 5)
    h = team_headers()
    job, token = running_job(api, h, settings)
    prefix = attempt_prefix(settings, job)
    assert post(api, token, *[committed(i, i, f"{prefix}/step-{i:012d}") for i in range(1, 9)]).status_code == 200
    listed = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()
    assert [c["step"] for c in listed["checkpoints"]] == [8, 7, 6, 5, 4] and listed["next_cursor"] is None
    steps, cursor = [], None
    while True:
        page = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h,
                       params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        steps += [c["step"] for c in page["checkpoints"]]
        if not (cursor := page["next_cursor"]):
            break
    assert steps == [8, 7, 6, 5, 4]
    bad = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h, params={"cursor": "x"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "cursor"
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_checkpoints_the_trainers_keep_last_deleted_are_forgotten(api, team_headers, settings):
    """keep_last deleted them and the broker went on listing them (52 listed, 1 on disk;
    keep answered 409): the library says which it deleted, and only the attempt's own
    rows, never a kept one, are forgotten."""
    h = team_headers()
    job, token = running_job(api, h, settings)
    prefix = attempt_prefix(settings, job)
    assert post(api, token, *[committed(i, i, f"{prefix}/step-{i:012d}") for i in range(1, 5)]).status_code == 200
    # A writing transaction from its start (IMMEDIATE on SQLite): a deferred one that read, then
    # wrote, failed at once with "database is locked" when the app wrote in between.
    with transaction(make_session_factory(make_engine(settings.database_url))) as s:
        s.query(Checkpoint).filter_by(attempt_id=job["attempts"][-1]["id"], step=1).one().keep = True
    odd = [ev(AFTER_AGENT + 10, "checkpoints_pruned", steps="1"), ev(AFTER_AGENT + 11, "checkpoints_pruned")]
    assert post(api, token, *odd).status_code == 200  # nothing to act on: forgets nothing
    assert post(api, token, ev(AFTER_AGENT + 12, "checkpoints_pruned", steps=[1, 2, 3])).status_code == 200
    listed = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]
    assert [c["step"] for c in listed] == [4, 1]
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert not [e for e in events if e["type"] == "checkpoints_pruned"]  # acted on, not stored
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_keep_marks_only_a_checkpoint_its_manifest_confirms(api, team_headers, settings, job_scratch):
    torch = pytest.importorskip("torch")
    from spotbroker.agent.checkpoint import Checkpointer

    h = team_headers()
    job, token = running_job(api, h, settings)
    prefix = attempt_prefix(settings, job)
    info = Checkpointer(torch.nn.Linear(2, 2), uri=prefix, every_seconds=None, handle_signal=False).save(4)
    post(api, token, committed(1, 4, info.uri), committed(2, 9, f"{prefix}/step-000000000009"))
    by_step = {c["step"]: c for c in api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]}
    ckpt_dir = Path(urlparse(info.uri).path)

    def keep(step: int):
        return api.post(f"/v1/jobs/{job['id']}/checkpoints/{by_step[step]['id']}/keep", headers=h)

    r = keep(9)  # reported, but nothing there: no manifest, no marker, no directory made
    assert r.status_code == 409 and "manifest" in r.json()["detail"], r.text
    assert not (ckpt_dir.parent / "step-000000000009").exists()
    # A manifest that does not match what it lists is not a checkpoint either.
    manifest = ckpt_dir / "MANIFEST.json"
    good = manifest.read_bytes()
    doc = json.loads(good)
    doc["objects"]["index.json"]["size"] += 1
    manifest.write_text(json.dumps(doc))
    assert keep(4).status_code == 409 and not (ckpt_dir / "KEEP").exists()
    manifest.write_bytes(good)
    r = keep(4)
    assert r.status_code == 200 and r.json()["keep"] is True, r.text
    assert (ckpt_dir / "KEEP").exists()
    # The job owns its prefix: a step directory swapped for a link out of it is not followed.
    outside = job_scratch / "elsewhere"
    os.rename(ckpt_dir, outside)
    (outside / "KEEP").unlink()
    os.symlink(outside, ckpt_dir)
    assert keep(4).status_code == 409 and not (outside / "KEEP").exists()
    os.unlink(ckpt_dir)
    os.rename(outside, ckpt_dir)
    # Nor an object (or the manifest) swapped for a link to a file of the broker's of the same size.
    secret = job_scratch / "brokers-own"
    part = next(p for p in ckpt_dir.iterdir() if p.name.startswith("part-"))
    secret.write_bytes(b"s" * part.stat().st_size)
    part.unlink()
    os.symlink(secret, part)
    r = keep(4)
    assert r.status_code == 409 and "link" in r.json()["detail"] and not (ckpt_dir / "KEEP").exists(), r.text
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_keep_of_a_checkpoint_recorded_elsewhere_writes_nothing(api, team_headers, settings):
    """A row stored before reported URIs were checked (the attack's
    `file:///etc`): keep refuses it, and writes nothing there."""
    h = team_headers()
    job, _ = running_job(api, h, settings)
    engine = make_engine(settings.sqlalchemy_url)
    with transaction(make_session_factory(engine)) as s:
        s.add(Checkpoint(job_id=job["id"], attempt_id=job["attempts"][-1]["id"], step=7, uri="file:///etc",
                         bytes=0, committed_at=datetime.now(UTC)))
    engine.dispose()
    [c] = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]
    before = os.path.exists("/etc/KEEP")
    try:
        r = api.post(f"/v1/jobs/{job['id']}/checkpoints/{c['id']}/keep", headers=h)
        assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json", r.text
        assert os.path.exists("/etc/KEEP") == before
    finally:
        if not before and os.path.exists("/etc/KEEP"):
            os.unlink("/etc/KEEP")
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_odd_event_bodies_are_refused_never_a_server_error(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    at = datetime.now(UTC).isoformat()

    def body(seq: int, kind: str, data: str) -> str:  # raw JSON: some of it no encoder would write
        head = json.dumps({"seq": seq, "type": kind, "at": at})[:-1]
        return '{"events": [' + head + ', "data": ' + data + "}]}"

    deep = "[" * 5000 + "]" * 5000
    bodies = [body(1, "heartbeat", '{"x": NaN}'), body(2, "heartbeat", '{"x": Infinity}'),
              body(3, "resumed", '{"x": "a\\u0000b"}'), body(4, "resumed", '{"a\\u0000": 1}'),
              body(5, "resumed", '{"x": 1e999}'), body(99999999999, "heartbeat", "{}"),
              body(6, "resumed", deep), body(7, "resumed", '{"x": ' + deep + "}"),
              body(8, "resumed", '{"x": ' + "[" * 50 + "]" * 50 + "}"),
              body(9, "resumed", '{"x": "' + "y" * 70000 + '"}')]
    for raw in bodies:
        r = api.post("/v1/agent/events", content=raw, headers=auth)
        # 400: a body nested beyond what the JSON parser takes is not parsed at all
        assert r.status_code in (400, 422), (raw[:120], r.status_code, r.text[:300])
        assert r.headers["content-type"] == "application/problem+json"
    r = api.post("/v1/agent/logs", content=b"x", headers={**auth, "X-Log-Offset": str(2**64)})
    assert r.status_code == 422, r.text
    assert api.get(f"/v1/jobs/{job['id']}/events", headers=h).status_code == 200
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_an_event_racing_another_writer_of_its_job_is_stored_not_a_server_error(
        api, team_headers, settings, monkeypatch):
    """The reconciler (or another broker) may write the job between the moment
    the agent's batch read it and the moment it writes; the ORM's version
    check then raises StaleDataError at the flush (seen as a 500 on
    PostgreSQL). Here the first flush is made to lose that race: the batch is
    taken again on the new row, never answered with a 500."""
    from sqlalchemy.orm.exc import StaleDataError

    from spotbroker.broker.recovery import agent_channel

    h = team_headers()
    job, token = running_job(api, h, settings)
    real, raced = agent_channel.record, []

    def record_losing_the_first_race(session, attempt, *args, **kwargs):
        outcome = real(session, attempt, *args, **kwargs)
        if not raced:
            raced.append(True)
            raise StaleDataError("UPDATE statement on table 'jobs' expected to update 1 row(s); 0 were matched.")
        return outcome

    monkeypatch.setattr(agent_channel, "record", record_losing_the_first_race)
    r = post(api, token, ev(100, "preemption_notice"))
    assert r.status_code == 200, r.text
    assert raced and r.json()["accepted"] == 1
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "PREEMPTING"
    notices = [e for e in api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
               if e["type"] == "preemption_notice"]
    assert len(notices) == 1  # the lost try wrote nothing
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_each_node_ships_its_own_log_and_a_reader_picks_the_node(api, team_headers, settings):
    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "sleep 60", "num_nodes": 2}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    auth = {"Authorization": f"Bearer {agent_token(settings.signing_key(), job['attempts'][-1]['id'])}"}

    def send(node: str | None, data: bytes):
        node_header = {"X-Log-Node": node} if node is not None else {}
        return api.post("/v1/agent/logs", content=data, headers={**auth, "X-Log-Offset": "0", **node_header})

    assert send(None, b"from node 0\n").json()["size"] == 12
    assert send("1", b"node 1 says\n").json()["size"] == 12
    for bad in ("2", "-1", "x"):  # the attempt has nodes 0 and 1
        r = send(bad, b"lost\n")
        assert r.status_code == 422 and "X-Log-Node" in r.text, r.text
    assert api.get(f"/v1/jobs/{job_id}/logs", headers=h).text == "from node 0\n"
    assert api.get(f"/v1/jobs/{job_id}/logs", params={"node": 1, "tail": 1}, headers=h).text == "node 1 says\n"
    r = api.get(f"/v1/jobs/{job_id}/logs", params={"node": 2}, headers=h)
    assert r.status_code == 404 and "no node 2" in r.json()["detail"]
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)


def test_measured_gpu_energy_in_a_heartbeat_replaces_the_rating(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    attempt_id = job["attempts"][-1]["id"]
    factory = make_session_factory(make_engine(settings.database_url))

    def attempt():
        from spotbroker.broker.store.models import Attempt
        with factory() as s:
            return s.get(Attempt, attempt_id)

    assert attempt().energy_basis == "estimated"
    # Absurd figures (a GPU at 50 kW; a negative count) leave the rating alone.
    assert post(api, token, ev(200, "heartbeat", gpu_joules=5e7, gpu_seconds=1.0),
                ev(201, "heartbeat", gpu_joules=-1, gpu_seconds=10)).status_code == 200
    assert attempt().energy_basis == "estimated"
    # A trainer's own event (from its events.jsonl, passed on by the agent) says nothing of energy:
    # a job once made itself "measured" at a sixth of its rating.
    assert post(api, token, ev(203, "resumed", step=0, gpu_joules=1, gpu_seconds=100_000)).status_code == 200
    assert attempt().energy_basis == "estimated"
    assert post(api, token, ev(204, "heartbeat", gpu_joules=250.0 * 60, gpu_seconds=60.0)).status_code == 200
    measured = attempt()
    assert measured.energy_basis == "measured" and measured.gpu_joules == 250.0 * 60
    assert measured.power_kw > 0.25  # 250 W of GPU, and the instance's share, times PUE
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_an_event_from_a_node_the_attempt_does_not_have_is_refused(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)  # one node: node 0 only
    for node in (1, 4096, -1, "x", True):
        r = post(api, token, ev(300, "preemption_notice", cloud="local", node=node))
        assert r.status_code == 422 and "events.0.data.node" in r.text, (node, r.text)
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "RUNNING"  # nothing moved
    assert post(api, token, ev(301, "heartbeat", node=0)).status_code == 200      # node 0 may say so
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_numbers_and_times_no_reader_can_hold_are_never_a_500(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    huge = 10**400  # JSON allows it; a float, a BIGINT and math.isfinite() do not
    r = post(api, token, ev(400, "metrics", step=7, values={"loss": huge, "acc": 0.5}),
             ev(401, "heartbeat", gpu_joules=huge, gpu_seconds=1),
             ev(402, "heartbeat", gpu_joules=1.0, gpu_seconds=huge),
             ev(403, "metrics", step=huge, values={"loss": 1.0}))
    assert r.status_code == 200, r.text  # taken, and what no reader can hold is dropped
    series = api.get(f"/v1/jobs/{job['id']}/metrics", headers=h).json()
    assert "loss" not in str(series) and "acc" in str(series)
    early = {**ev(404, "heartbeat"), "at": "0001-01-01T00:00:00+14:00"}
    r = post(api, token, early)
    assert r.status_code == 422 and "events.0.at" in r.text, r.text
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_padded_event_does_what_it_says_and_the_history_keeps_4_kib_of_it(api, team_headers, settings):
    # A trainer writes its own events (its control directory is its own): 200 of 60 KB each once
    # cost the database 12 MB and one events read of its job as much again.
    h = team_headers()
    job, token = running_job(api, h, settings)
    uri = f"{attempt_prefix(settings, job)}/step-000000000007"
    pad = "A" * 60_000
    padded = committed(1, 7, uri)
    padded["data"] = {"pad": pad[:40_000], **padded["data"], "deep": {"list": ["b" * 100] * 100}}
    assert post(api, token, padded).json()["accepted"] == 1
    spam = [ev(AFTER_AGENT + 1 + i, "resumed", step=i, uri="x", pad=pad) for i in range(1, 100)]
    assert sum(post(api, token, *spam[i:i + 10]).json()["accepted"] for i in range(0, 99, 10)) == 99
    assert [c["step"] for c in api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]] == [7]
    r = api.get(f"/v1/jobs/{job['id']}/events", headers=h)
    stored = [e for e in r.json()["events"] if e["type"] in ("checkpoint_committed", "resumed")]
    assert len(stored) == 100 and len(r.content) < 100 * 4096 + 50_000, len(r.content)
    first = stored[0]["data"]
    assert (first["step"], first["uri"], first["reason"], first["bytes"]) == (7, uri, "periodic", 10)
    assert first["pad"] == "A" * 1024 and "deep" not in first and first["cut"] > 50_000
    assert [e["data"]["step"] for e in stored[1:]] == list(range(1, 100))
    small = post(api, token, ev(AFTER_AGENT + 200, "no_flush", reason="no library")).json()
    assert small["accepted"] == 1
    kept = [e["data"] for e in api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
            if e["type"] == "no_flush"]
    assert kept == [{"reason": "no library", "agent_at": kept[0]["agent_at"]}]  # an ordinary event whole
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_trainer_flooding_its_events_is_stored_up_to_a_bound_and_still_acts(api, team_headers, settings,
                                                                              monkeypatch):
    """10,000 padded `resumed` an attempt, every restart, grew the database 40 MB an attempt
    (at most 1,000 restarts): the history now keeps MAX_KEPT_EVENTS of the trainer's events an
    attempt, says once that it drops the rest, and a checkpoint past the bound is still recorded."""
    from spotbroker.broker.recovery import agent_channel

    monkeypatch.setattr(agent_channel, "MAX_KEPT_EVENTS", 30)  # (the bound's size is not what is tested)
    h = team_headers()
    job, token = running_job(api, h, settings)
    flood = [ev(AFTER_AGENT + i, "resumed", step=i, uri="x") for i in range(1, 41)]
    assert sum(post(api, token, *flood[i:i + 10]).json()["accepted"] for i in range(0, 40, 10)) == 40
    uri = f"{attempt_prefix(settings, job)}/step-000000000009"
    assert post(api, token, committed(41, 9, uri)).json()["accepted"] == 1
    assert [c["step"] for c in api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]] == [9]
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert [e["type"] for e in events].count("resumed") == 30
    (dropped,) = [e for e in events if e["type"] == "events_dropped"]
    assert dropped["data"]["kept"] == 30 and "not stored" in dropped["data"]["reason"]
    assert post(api, token, ev(AFTER_AGENT + 100, "heartbeat")).json()["accepted"] == 1  # the agent's own go on
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
