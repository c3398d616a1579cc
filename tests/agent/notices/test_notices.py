"""The notice watchers' production code against the metadata simulator, over real HTTP."""
from __future__ import annotations

import dataclasses
import socket
from datetime import UTC, datetime, timedelta

import pytest

from spotbroker.agent.notices import (
    MAINTENANCE,
    PREEMPTION,
    REBALANCE,
    build_watchers,
    detect_cloud,
    resolve_cloud,
)
from spotbroker.agent.protocol import PREEMPTION_NOTICE, REBALANCE_RECOMMENDATION

CLOUDS = ("aws", "gcp", "azure")


@pytest.fixture
def watch(fast_config, notices):
    """Start a cloud's watchers against a simulator; stopped at the end of the test."""
    running = []

    def start(cloud, sim, config=None, **kwargs):
        watchers = build_watchers(cloud, notices, sim.url, config or fast_config, **kwargs)
        watchers.start()
        running.append(watchers)
        return watchers

    yield start
    for watchers in running:
        watchers.stop()


def _polls(watchers) -> int:
    return min(w.polls for w in watchers.watchers)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_each_cloud_notice_is_seen_once_with_its_deadline(cloud, make_sim, watch, notices, wait):
    sim = make_sim(cloud, notice_window=40)
    watchers = watch(cloud, sim)
    wait(lambda: _polls(watchers) >= 1, what="a first poll")
    deadline = sim.preempt()
    [notice] = notices.wait(1)
    assert notice.cloud == cloud and notice.kind == PREEMPTION
    assert notice.event_type == PREEMPTION_NOTICE
    if cloud == "gcp":  # GCP publishes no time: the watcher assumes its documented window
        assert notice.deadline - notice.observed_at == timedelta(seconds=30)
    else:
        assert abs(notice.deadline - deadline) < timedelta(seconds=1)
    # More polls see the same event: still one notice (de-duplicated by content).
    seen = _polls(watchers)
    more = 1 if cloud == "gcp" else 3  # a GCP poll waits out its long poll
    wait(lambda: _polls(watchers) >= seen + more, what="more polls")
    assert len(notices) == 1
    data = notice.event_data()
    assert data["cloud"] == cloud and data["deadline"] == notice.deadline.isoformat() and data["raw"]


def test_aws_rebalance_is_a_recommendation_not_a_notice(make_sim, watch, notices):
    sim = make_sim("aws")
    watch("aws", sim)
    sim.rebalance()
    [notice] = notices.wait(1)
    assert (notice.kind, notice.event_type, notice.deadline) == (REBALANCE, REBALANCE_RECOMMENDATION, None)
    assert set(notice.raw) == {"noticeTime"}


def test_aws_token_is_refreshed_before_expiry(make_sim, watch, notices, fast_config, wait):
    sim = make_sim("aws")
    config = dataclasses.replace(fast_config, aws_token_ttl=2)  # refreshed 0.5 s before expiry
    watchers = watch("aws", sim, config)
    token = watchers.watchers[0].token
    wait(lambda: token.fetches >= 2, timeout=10, what="a token refresh")
    assert sim.hits["/latest/api/token"] == token.fetches
    assert sim.statuses[401] == 0  # never read with an expired token
    sim.preempt()
    assert notices.wait(1)[0].kind == PREEMPTION


def test_aws_token_is_fetched_again_after_a_401(make_sim, watch, notices, wait):
    sim = make_sim("aws")
    watchers = watch("aws", sim)
    token = watchers.watchers[0].token
    wait(lambda: _polls(watchers) >= 2, what="polls with the first token")
    assert token.fetches == 1  # one token serves every poll within its TTL
    sim.revoke_tokens()  # as if IMDS restarted: every read is 401 until a new token
    sim.preempt()
    assert notices.wait(1)[0].kind == PREEMPTION
    assert sim.statuses[401] >= 1 and token.fetches >= 2


def test_gcp_long_polls_with_the_etag(make_sim, watch, notices, wait):
    sim = make_sim("gcp")
    watchers = watch("gcp", sim)
    preempted = watchers.watchers[0]
    path = "/computeMetadata/v1/instance/preempted"
    wait(lambda: preempted.etag is not None, what="the first answer's ETag")
    wait(lambda: sim.hits[path] >= 2, what="the long poll to start")
    before = sim.hits[path]
    sim.preempt()
    [notice] = notices.wait(1)
    assert notice.raw == "TRUE"
    # The change came back on the waiting request, not on a new poll.
    assert sim.hits[path] - before <= 1


def test_gcp_maintenance_event_is_a_notice(make_sim, watch, notices, fast_config):
    sim = make_sim("gcp")
    watch("gcp", sim)
    sim.maintenance()
    [notice] = notices.wait(1)
    assert (notice.kind, notice.raw, notice.event_type) == (MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE",
                                                           PREEMPTION_NOTICE)
    assert notice.deadline - notice.observed_at == timedelta(seconds=fast_config.gcp_maintenance_window)


def test_azure_notice_is_acknowledged(make_sim, watch, notices, wait):
    sim = make_sim("azure", vm_name="vm-7", notice_window=35)
    watchers = watch("azure", sim)
    sim.preempt()
    [notice] = notices.wait(1)
    assert notice.event_id and notice.raw["EventType"] == "Preempt"
    assert watchers.watchers[0].vm_name == "vm-7"  # learned from /metadata/instance/compute
    assert watchers.acknowledge(notice) is True
    assert sim.acknowledged == [notice.event_id]
    # The event goes on as Started: still the same event, no second notice.
    polls = _polls(watchers)
    wait(lambda: _polls(watchers) >= polls + 3, what="polls after the acknowledgement")
    assert len(notices) == 1


def test_azure_ignores_an_event_for_another_vm(make_sim, watch, notices, wait):
    sim = make_sim("azure", vm_name="someone-else")
    watchers = watch("azure", sim, azure_vm_name="me")
    sim.preempt()
    wait(lambda: watchers.watchers[0].incarnation == 2, what="the new incarnation")
    assert len(notices) == 0


def test_acknowledge_is_a_no_op_where_the_cloud_wants_none(make_sim, watch, notices):
    sim = make_sim("gcp")
    watchers = watch("gcp", sim)
    sim.preempt()
    assert watchers.acknowledge(notices.wait(1)[0]) is False


@pytest.mark.parametrize("mode", ["garbage", "500", "hang"])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_watcher_survives_faults_and_sees_a_later_notice(cloud, mode, make_sim, watch, notices, wait):
    sim = make_sim(cloud)
    watchers = watch(cloud, sim)
    wait(lambda: _polls(watchers) >= 1, what="a first poll")
    sim.set_fault(mode)
    wait(lambda: any(w.failures >= 1 for w in watchers.watchers) and sim.faulted_requests >= 2,
         what="failed polls")
    sim.set_fault(None)
    sim.preempt()
    assert notices.wait(1)[0].kind == PREEMPTION
    assert all(w.alive for w in watchers.watchers)


def test_watcher_survives_a_service_that_is_not_there(fast_config, notices, wait):
    with socket.socket() as sock:  # a port with nobody listening
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    watchers = build_watchers("azure", notices, url, fast_config)
    watchers.start()
    try:
        wait(lambda: watchers.watchers[0].failures >= 3, what="refused connections")
        assert watchers.watchers[0].alive
    finally:
        watchers.stop()


@pytest.mark.parametrize("cloud", CLOUDS)
def test_detect_cloud_against_the_simulator(cloud, make_sim):
    sim = make_sim(cloud)
    assert detect_cloud(sim.url) == cloud
    assert resolve_cloud(None, sim.url) == cloud
    assert resolve_cloud("local", sim.url) == cloud  # the local launcher's simulator


def test_resolve_cloud_settings(free_port):
    assert resolve_cloud("GCP", None) == "gcp"  # set by the launcher: no probing
    assert resolve_cloud("local", None) is None
    assert resolve_cloud("k8s", None) is None  # a pod on the operator's cluster: no cloud to watch
    assert detect_cloud(f"http://127.0.0.1:{free_port}", timeout=0.5) is None
    with pytest.raises(ValueError):
        resolve_cloud("oracle", None)


def test_notice_deadline_is_timezone_aware(make_sim, watch, notices):
    sim = make_sim("aws")
    watch("aws", sim)
    sim.preempt()
    notice = notices.wait(1)[0]
    assert notice.deadline.tzinfo is not None and notice.deadline > datetime.now(UTC)
