"""The metadata simulator speaks each cloud's protocol, refusals included (real HTTP)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import httpx
import pytest

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
GOOGLE = {"Metadata-Flavor": "Google"}
AZURE = {"Metadata": "true"}
EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"


def _token(client: httpx.Client, ttl: int = 60) -> str:
    answer = client.put("/latest/api/token", headers={TTL: str(ttl)})
    assert answer.status_code == 200
    assert answer.headers[TTL] == str(ttl)
    return answer.text


# --- AWS IMDSv2 ---------------------------------------------------------------


def test_aws_token_refusals(make_sim):
    sim = make_sim("aws")
    with httpx.Client(base_url=sim.url) as client:
        assert client.put("/latest/api/token").status_code == 400            # no TTL header
        for bad in ("0", "21601", "soon"):
            assert client.put("/latest/api/token", headers={TTL: bad}).status_code == 400
        proxied = client.put("/latest/api/token", headers={TTL: "60", "X-Forwarded-For": "10.0.0.9"})
        assert proxied.status_code == 403
        assert client.get("/latest/api/token").status_code == 405


def test_aws_reads_need_a_valid_token(make_sim, wait):
    sim = make_sim("aws")
    with httpx.Client(base_url=sim.url) as client:
        assert client.get("/latest/meta-data/instance-id").status_code == 401
        assert client.get("/latest/meta-data/instance-id", headers={TOKEN: "made-up"}).status_code == 401
        token = _token(client)
        answer = client.get("/latest/meta-data/instance-id", headers={TOKEN: token})
        assert (answer.status_code, answer.text) == (200, sim.instance_id)
        zone = client.get("/latest/meta-data/placement/availability-zone", headers={TOKEN: token}).text
        assert zone == "us-east-1a"
        assert client.get("/latest/meta-data/placement/region", headers={TOKEN: token}).text == "us-east-1"
        short = _token(client, ttl=1)  # expires after its TTL
        wait(lambda: client.get("/latest/meta-data/instance-id", headers={TOKEN: short}).status_code == 401,
             timeout=5, what="the 1-second token to expire")
        sim.revoke_tokens()
        assert client.get("/latest/meta-data/instance-id", headers={TOKEN: token}).status_code == 401


def test_aws_instance_action_and_rebalance_appear_on_notice(make_sim):
    sim = make_sim("aws", notice_window=7)
    with httpx.Client(base_url=sim.url) as client:
        headers = {TOKEN: _token(client)}
        assert client.get("/latest/meta-data/spot/instance-action", headers=headers).status_code == 404
        assert client.get("/latest/meta-data/events/recommendations/rebalance", headers=headers).status_code == 404
        sim.rebalance()
        rebalance = client.get("/latest/meta-data/events/recommendations/rebalance", headers=headers).json()
        assert set(rebalance) == {"noticeTime"} and rebalance["noticeTime"].endswith("Z")
        deadline = sim.preempt()
        action = client.get("/latest/meta-data/spot/instance-action", headers=headers).json()
        assert action["action"] == "terminate"
        assert action["time"] == deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert timedelta(seconds=6) <= deadline - sim.notice_time <= timedelta(seconds=7)
        assert client.get("/latest/meta-data/spot/termination-time", headers=headers).text == action["time"]


def test_default_windows_are_the_clouds_own(make_sim):
    assert make_sim("aws").notice_window == 120
    assert make_sim("gcp").notice_window == 30
    assert make_sim("azure").notice_window >= 30


# --- GCP ------------------------------------------------------------------------


def test_gcp_needs_metadata_flavor(make_sim):
    sim = make_sim("gcp")
    with httpx.Client(base_url=sim.url) as client:
        path = "/computeMetadata/v1/instance/preempted"
        assert client.get(path).status_code == 403
        assert client.get(path, headers={"Metadata-Flavor": "google-ish"}).status_code == 403
        assert client.get(path, headers={**GOOGLE, "X-Forwarded-For": "10.0.0.9"}).status_code == 403
        answer = client.get(path, headers=GOOGLE)
        assert (answer.status_code, answer.text) == (200, "FALSE")
        assert answer.headers["Metadata-Flavor"] == "Google" and answer.headers["ETag"]
        assert client.get("/computeMetadata/v1/instance/name", headers=GOOGLE).text == sim.vm_name
        assert client.get("/computeMetadata/v1/instance/zone", headers=GOOGLE).text.endswith("/zones/us-central1-a")


def test_gcp_preempted_and_maintenance_values_and_etags(make_sim):
    sim = make_sim("gcp")
    with httpx.Client(base_url=sim.url, headers=GOOGLE) as client:
        before = client.get("/computeMetadata/v1/instance/preempted")
        assert client.get("/computeMetadata/v1/instance/maintenance-event").text == "NONE"
        sim.preempt()
        after = client.get("/computeMetadata/v1/instance/preempted")
        assert after.text == "TRUE" and after.headers["ETag"] != before.headers["ETag"]
        sim.maintenance()
        assert client.get("/computeMetadata/v1/instance/maintenance-event").text == "TERMINATE_ON_HOST_MAINTENANCE"


def test_gcp_wait_for_change_long_polls_until_the_value_changes(make_sim):
    sim = make_sim("gcp")
    path = "/computeMetadata/v1/instance/preempted"
    with httpx.Client(base_url=sim.url, headers=GOOGLE, timeout=10) as client:
        etag = client.get(path).headers["ETag"]
        # A stale ETag answers at once with the current value.
        stale = client.get(path, params={"wait_for_change": "true", "last_etag": "0" * 16})
        assert (stale.text, stale.headers["ETag"]) == ("FALSE", etag)
        # timeout_sec: the current value comes back unchanged when nothing happens.
        unchanged = client.get(path, params={"wait_for_change": "true", "last_etag": etag, "timeout_sec": "1"})
        assert (unchanged.text, unchanged.headers["ETag"]) == ("FALSE", etag)
        # The current ETag waits for the change.
        timer = threading.Timer(0.3, sim.preempt)
        timer.start()
        changed = client.get(path, params={"wait_for_change": "true", "last_etag": etag, "timeout_sec": "8"})
        timer.join()
        assert changed.text == "TRUE" and changed.headers["ETag"] != etag


# --- Azure ------------------------------------------------------------------------


def test_azure_refusals(make_sim):
    sim = make_sim("azure")
    with httpx.Client(base_url=sim.url) as client:
        missing = client.get(EVENTS)
        assert missing.status_code == 400 and "metadata header" in missing.json()["error"]
        assert client.get(EVENTS, headers={"Metadata": "false"}).status_code == 400
        assert client.get("/metadata/scheduledevents", headers=AZURE).status_code == 400  # no api-version
        assert client.get("/metadata/scheduledevents?api-version=1999-01-01", headers=AZURE).status_code == 400
        assert client.post(EVENTS, json={"StartRequests": []}).status_code == 400  # POST needs the header too
        assert client.post(EVENTS, headers=AZURE, content=b"not json").status_code == 400
        unknown = client.post(EVENTS, headers=AZURE, json={"StartRequests": [{"EventId": "NOPE"}]})
        assert unknown.status_code == 400


def test_azure_preempt_event_incarnation_and_acknowledgement(make_sim):
    sim = make_sim("azure", notice_window=45, vm_name="trainer-vm-3")
    with httpx.Client(base_url=sim.url, headers=AZURE) as client:
        compute = client.get("/metadata/instance/compute?api-version=2021-02-01").json()
        assert compute["name"] == "trainer-vm-3" and compute["priority"] == "Spot"
        empty = client.get(EVENTS).json()
        assert empty == {"DocumentIncarnation": 1, "Events": []}
        deadline = sim.preempt()
        document = client.get(EVENTS).json()
        assert document["DocumentIncarnation"] == 2
        [event] = document["Events"]
        assert event["EventType"] == "Preempt" and event["ResourceType"] == "VirtualMachine"
        assert event["Resources"] == ["trainer-vm-3"] and event["EventStatus"] == "Scheduled"
        assert event["EventSource"] == "Platform" and "DurationInSeconds" in event and event["Description"]
        assert parsedate_to_datetime(event["NotBefore"]) == deadline.replace(microsecond=0)
        assert client.get(EVENTS).json()["DocumentIncarnation"] == 2  # unchanged: same incarnation
        ack = client.post(EVENTS, json={"StartRequests": [{"EventId": event["EventId"]}]})
        assert ack.status_code == 200
        assert sim.acknowledged == [event["EventId"]]
        started = client.get(EVENTS).json()
        assert started["DocumentIncarnation"] == 3 and started["Events"][0]["EventStatus"] == "Started"


# --- triggers, control endpoints, faults, command line ------------------------------


def test_a_body_larger_than_any_protocol_sends_is_refused_unread(make_sim):
    """The simulator runs as root beside the local launcher's nodes, on a port
    any job on the host can find: it read a body of whatever length it was
    told (300 MiB took it from 24 to 331 MB), and `Content-Length: -1` held a
    thread until the client went."""
    import socket
    from urllib.parse import urlsplit

    sim = make_sim("azure")
    where = urlsplit(sim.url)
    for declared, status in ((400_000_000, b"413"), (-1, b"400"), ("ten", b"400")):
        with socket.create_connection((where.hostname, where.port), timeout=10) as s:
            s.sendall(f"POST {EVENTS} HTTP/1.1\r\nHost: x\r\nMetadata: true\r\n"
                      f"Content-Length: {declared}\r\n\r\n".encode() + b"x" * 1000)
            answer = s.recv(65536)  # answered at once, the body unread
        assert answer.startswith(b"HTTP/1.1 " + status), answer
    with httpx.Client(base_url=sim.url, headers=AZURE) as client:  # and it still serves
        assert client.get(EVENTS).status_code == 200


def test_what_any_job_can_send_keeps_the_simulator_bounded(make_sim):
    """Any job on the host can reach a node's simulator (root's): 20,000
    distinct paths grew its per-path count from 23 MB to 1.37 GB, kept as
    long as the node; and every connection held a thread. Paths past a few
    dozen are counted together; past MAX_CONNECTIONS a connection is closed."""
    import socket
    from urllib.parse import urlsplit

    from spotbroker.agent.metadata_sim import instance, server

    sim = make_sim("aws")
    where = urlsplit(sim.url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as s:
        for i in range(300):  # pipelined on one keep-alive connection
            s.sendall(f"GET /{i}-{'x' * 300 if i % 2 else ''} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 300:
            answers += s.recv(65536)
    assert len(sim.hits) <= instance.MAX_COUNTED_PATHS + 1
    assert sum(sim.hits.values()) == 300 and sim.hits[instance.OTHER_PATHS] >= 300 - instance.MAX_COUNTED_PATHS
    held = [socket.create_connection((where.hostname, where.port), timeout=10)
            for _ in range(server.MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)  # each is being served (a thread each), idle
        with socket.create_connection((where.hostname, where.port), timeout=10) as extra:
            extra.sendall(b"GET /latest/meta-data/ HTTP/1.1\r\nHost: x\r\n\r\n")
            assert extra.recv(65536) == b""  # closed, unanswered
    finally:
        for s in held:
            s.close()
    time.sleep(0.5)  # their threads see them closed
    with httpx.Client(base_url=sim.url) as client:  # and it still serves once they are gone
        assert _token(client)


def test_notice_after_a_delay_and_at_a_time(make_sim, wait):
    t0 = datetime.now(UTC)
    after = make_sim("gcp", notice_after=0.2)
    at = make_sim("gcp", notice_at=datetime.now(UTC) + timedelta(seconds=0.3))
    for sim, delay in ((after, 0.2), (at, 0.3)):
        wait(lambda sim=sim: sim.deadline is not None, timeout=5, what="the scheduled notice")
        assert sim.notice_time >= t0 + timedelta(seconds=delay - 0.01)  # it waited, not sooner
        with httpx.Client(base_url=sim.url, headers=GOOGLE) as client:
            assert client.get("/computeMetadata/v1/instance/preempted").text == "TRUE"


def test_control_endpoints(make_sim):
    sim = make_sim("aws")
    with httpx.Client(base_url=sim.url) as client:
        assert client.get("/_sim/state").json()["deadline"] is None
        answer = client.post("/_sim/preempt", json={"notice_seconds": 4})
        deadline = datetime.fromisoformat(answer.json()["deadline"])
        assert deadline - sim.notice_time == timedelta(seconds=4)
        again = client.post("/_sim/preempt", json={"notice_seconds": 99}).json()
        assert datetime.fromisoformat(again["deadline"]) == deadline  # one notice per instance
        assert client.post("/_sim/rebalance").status_code == 200 and sim.rebalance_time is not None
        assert client.post("/_sim/fault", json={"mode": "wrong"}).status_code == 400
        assert client.post("/_sim/nothing").status_code == 404


def test_with_a_control_token_the_control_endpoints_need_it_and_metadata_does_not(make_sim):
    sim = make_sim("gcp", control_token="the-brokers-token")
    with httpx.Client(base_url=sim.url) as client:
        for headers in ({}, {"X-Sim-Token": "a-guess"}):
            assert client.post("/_sim/preempt", headers=headers).status_code == 403
            assert client.get("/_sim/state", headers=headers).status_code == 403
        assert sim.notice_time is None
        assert client.get("/computeMetadata/v1/instance/preempted", headers=GOOGLE).text == "FALSE"
        assert client.post("/_sim/preempt", headers={"X-Sim-Token": "the-brokers-token"}).status_code == 200
        assert client.get("/computeMetadata/v1/instance/preempted", headers=GOOGLE).text == "TRUE"


@pytest.mark.parametrize("cloud, path, headers", [
    ("gcp", "/computeMetadata/v1/instance/preempted", GOOGLE),
    ("azure", EVENTS, AZURE),
])
def test_fault_modes(make_sim, cloud, path, headers):
    sim = make_sim(cloud)
    with httpx.Client(base_url=sim.url, headers=headers, timeout=0.5) as client:
        sim.set_fault("500")
        assert client.get(path).status_code == 500
        sim.set_fault("garbage")
        garbage = client.get(path)
        assert garbage.status_code == 200 and garbage.content not in (b"FALSE",) and b"\x00" in garbage.content
        sim.set_fault("hang")
        with pytest.raises(httpx.TimeoutException):
            client.get(path)
        sim.set_fault("500", count=1)
        assert client.get(path).status_code == 500
        assert client.get(path).status_code == 200  # the counted fault is spent
        assert sim.faulted_requests == 4


def test_runs_as_a_module_and_prints_its_url():
    process = subprocess.Popen(
        [sys.executable, "-m", "spotbroker.agent.simulator", "--cloud", "azure", "--port", "0", "--window", "5"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=url, headers=AZURE) as client:
            client.post("/_sim/preempt", json={})
            [event] = client.get(EVENTS).json()["Events"]
            not_before = parsedate_to_datetime(event["NotBefore"])
            assert timedelta(seconds=3) < not_before - datetime.now(UTC) <= timedelta(seconds=5)
    finally:
        process.terminate()
        assert process.wait(timeout=5) == 0


def test_hard_stop_starts_the_azure_event_and_calls_back(make_sim, wait):
    stopped = threading.Event()
    sim = make_sim("azure", notice_window=0.2, on_hard_stop=stopped.set)
    sim.preempt()
    wait(stopped.is_set, timeout=5, what="the hard stop")
    with httpx.Client(base_url=sim.url, headers=AZURE) as client:
        document = client.get(EVENTS).json()
    assert document["Events"][0]["EventStatus"] == "Started" and document["DocumentIncarnation"] == 3


def test_command_line_kills_every_process_of_the_node_at_the_hard_stop():
    """The node's processes, one of them in a session of its own (as torchrun's
    workers are): all die at the hard stop, and the node's simulator with them."""
    from spotbroker.agent.proctree import start_time

    node = subprocess.Popen(["bash", "-c", "setsid sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    worker = int(node.stdout.readline())
    sim = subprocess.Popen(
        [sys.executable, "-m", "spotbroker.agent.simulator", "--cloud", "gcp", "--notice-after", "0",
         "--window", "0.2", "--kill-at-hard-stop", str(node.pid)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert sim.stdout.readline().startswith("http://")
        assert node.wait(timeout=10) == -9
        assert sim.wait(timeout=10) == -9
        deadline = time.monotonic() + 5
        while start_time(worker) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert start_time(worker) is None
    finally:
        for proc in (node, sim):
            proc.kill()
            proc.wait(timeout=5)
        subprocess.run(["kill", "-9", str(worker)], capture_output=True)
