"""Who local jobs run as: a uid per team from the configured range, a range
that no account of the host holds, and a clear word when they share one."""
from __future__ import annotations

import logging
import os

import pytest
from pydantic import ValidationError

from spotbroker.broker.launch.base import LaunchError
from spotbroker.broker.launch.identity import JobUser, JobUsers
from spotbroker.broker.settings import Settings


def test_each_team_gets_first_plus_its_id_and_a_team_past_the_range_is_refused(tmp_path):
    users = JobUsers(team_uids=Settings(data_dir=tmp_path, local_uid_range="2000000000-2000000099",
                                        _env_file=None).local_uids)
    assert users.for_team(1, "a") == JobUser(2000000001, 2000000001, "spotbroker-a")
    assert users.for_team(99, "b").uid == 2000000099
    for team_id in (None, 0, 100):  # the first uid is no team's: the launcher's check runs as it
        with pytest.raises(LaunchError, match="SPOTBROKER_LOCAL_UID_RANGE .2000000000-2000000099.: widen"):
            users.for_team(team_id, "c")


@pytest.mark.parametrize("value", ["", "1900000000", "abc-def", "5000-4000", "0-100000", "999-5000",
                                   "1900000000-4294967295"])
def test_a_bad_uid_range_is_a_clear_error(tmp_path, value):
    with pytest.raises(ValidationError, match="local_uid_range"):
        Settings(data_dir=tmp_path, local_uid_range=value, _env_file=None)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the check runs a probe as a uid of the range")
def test_a_range_that_holds_an_account_of_the_host_is_refused(tmp_path):
    """nobody (65534) could read the files of the team given its uid."""
    users = JobUsers(team_uids=range(65000, 66000))
    with pytest.raises(LaunchError, match=r"holds user nobody \(uid 65534\)"):
        users.check("/nonexistent/python", tmp_path / "runs")


def test_jobs_that_share_one_user_are_said_to_at_start(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "spotbroker.broker.launch.identity")
    users = JobUsers.from_settings(Settings(data_dir=tmp_path, local_run_as="", _env_file=None))
    assert users.team_uids is None and not users.separate and users.for_team(1, "a") is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "local jobs of every team run as the broker's own user" in line and "one another's" in line
    if os.geteuid() == 0:  # unset, as root: a uid per team, and nothing to warn of
        caplog.clear()
        users = JobUsers.from_settings(Settings(data_dir=tmp_path, _env_file=None))
        assert users.team_uids == range(1900000000, 1901000000) and users.separate and not caplog.records


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the check runs a probe as a uid of the range")
def test_an_interpreter_or_a_run_directory_the_jobs_users_cannot_reach_is_refused_saying_which(data_dir):
    from spotbroker.broker.launch.local import job_python_default

    users, python = JobUsers(team_uids=range(1900000000, 1901000000)), job_python_default()
    users.check(python, data_dir / "runs")  # fine; and again, from the process's memory of the interpreter
    users.check(python, data_dir / "runs")
    with pytest.raises(LaunchError, match="cannot run /nonexistent/python"):
        users.check("/nonexistent/python", data_dir / "runs")
    private = data_dir / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(LaunchError, match=f"cannot enter {private / 'runs'}"):
        users.check(python, private / "runs")
