"""A launch SkyPilot's restarted API server forgot is sent again once, by
one broker. Another broker on the same database, whose follower also saw
the request lost, follows the request the first one sent instead of sending
a third. (The resend itself, against moto's AWS, is test_launch_moto.py's.)"""
from __future__ import annotations

import time

from spotbroker.broker.jobs.runs import RunState
from spotbroker.broker.launch.skypilot.follow import LOST
from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher


class ForgetfulSky:
    """SkyPilot's SDK after its API server restarted: it knows no request."""

    def api_status(self, request_ids=None, **_):
        return []


def wait_for(check, timeout=10.0):
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_lost_launch_another_broker_sent_again_is_followed_not_sent_a_third_time(tmp_path):
    launcher = SkyPilotLauncher(tmp_path, prefix="sblost", poll_s=0.01, sky=ForgetfulSky())
    try:
        first = {"cluster": "sblost-1", "request_id": "req-old", "submitted_at": time.time()}
        assert launcher.status(first).state == RunState.PENDING  # followed from now on
        wait_for(lambda: launcher.follower.seen("sblost-1").request == LOST)
        # this broker saw it lost: were the handle still the old one, it would send it again
        assert launcher.status(first).resend
        # ...but the other broker did so first and stored its new request in the attempt's handle
        resent = {**first, "request_id": "req-new"}
        status = launcher.status(resent)
        assert (status.state, status.resend) == (RunState.PENDING, False)
        assert launcher.follower.seen("sblost-1").request_id == "req-new"
    finally:
        launcher.close()
