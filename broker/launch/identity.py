"""Who a local job runs as, so that one team's jobs cannot reach another's.

File modes and signals protect nothing between processes of one uid, and
nothing at all from root's. So when the broker runs as root, the local
launcher runs each team's nodes (the agent and the job) under a uid and gid
of the team's own: `first + team id`, `first` being the start of
SPOTBROKER_LOCAL_UID_RANGE. The team id is the database's, so every broker
sharing the database gives a team the same uid, and a team id is never
reused (teams are never deleted). `first` itself is no team's: the launcher
checks with it that any uid of the range can run the jobs' interpreter.

These uids need no passwd entry: root can `setuid` to a bare number. A job
gets `USER`, `LOGNAME` and `HOME` in its environment, which is what
`getpass`, pip, git and Python's `~` use; what asks the passwd database
itself (`whoami`, `id -un`, `ssh` as a client) finds no name. No uid of the
range may belong to an account of the host (it could read the team's
files): the launcher refuses to start jobs while one does.

A broker that is not root cannot change uid: its jobs run as its own user,
shared by every team (as does a user named by SPOTBROKER_LOCAL_RUN_AS), and
it says so once at start.
"""
from __future__ import annotations

import grp
import logging
import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from spotbroker.broker.launch.base import LaunchError

log = logging.getLogger(__name__)

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class JobUser:
    uid: int
    gid: int
    name: str  # the job's USER and LOGNAME (a team's uid has no passwd entry to name it)


class JobUsers:
    """Who a team's local jobs run as: a uid of the team's own from
    `team_uids`, else one user for every team (`shared`: a user's name, or
    None for the broker's own user)."""

    def __init__(self, team_uids: range | None = None, shared: str | None = None) -> None:
        if team_uids is not None and (len(team_uids) < 2 or team_uids.start < 1):
            raise ValueError("a team uid range holds at least two uids, none of them root's")
        self.team_uids = team_uids
        self.shared = shared or None

    @classmethod
    def from_settings(cls, settings) -> JobUsers:
        """A uid per team when the broker is root and SPOTBROKER_LOCAL_RUN_AS is
        unset; else what it names ("": the broker's own user)."""
        if settings.local_run_as is not None or os.geteuid() != 0:
            users = cls(shared=settings.local_run_as or None)
            fix = "unset SPOTBROKER_LOCAL_RUN_AS" if os.geteuid() == 0 else "run the broker as root"
            log.warning("local jobs of every team run as %s: they can read and signal one another's "
                        "processes and files on this host (%s to give each team a uid of its own; "
                        "docs/security.md)", repr(users.shared) if users.shared else
                        f"the broker's own user ({pwd.getpwuid(os.geteuid()).pw_name})", fix)
            return users
        return cls(team_uids=settings.local_uids)

    @property
    def separate(self) -> bool:
        """Whether jobs run as anyone else than the broker (whose files are then its own alone)."""
        return self.team_uids is not None or self.shared is not None

    def for_team(self, team_id: int | None, team: str) -> JobUser | None:
        """The user the team's jobs run as; None: the broker's own."""
        if self.team_uids is not None:
            if team_id is None or not 0 < team_id < len(self.team_uids):
                raise LaunchError(f"team {team!r} (id {team_id}) has no uid in SPOTBROKER_LOCAL_UID_RANGE "
                                  f"({self.team_uids.start}-{self.team_uids.stop - 1}): widen the range")
            uid = self.team_uids.start + team_id
            return JobUser(uid, uid, f"spotbroker-{team}")
        if self.shared is not None:
            try:
                entry = pwd.getpwnam(self.shared)
            except KeyError:
                raise LaunchError(
                    f"the local launcher runs jobs as the user {self.shared!r}, which does not exist: create it "
                    f"(as root: useradd --system --user-group --no-create-home {self.shared}) or name another "
                    "with SPOTBROKER_LOCAL_RUN_AS (unset, as root: a uid per team)") from None
            return JobUser(entry.pw_uid, entry.pw_gid, self.shared)
        return None

    def check(self, python: str, runs: Path) -> None:
        """Once per launcher: can the jobs' users run the jobs' interpreter and
        enter the run directories, and is no uid of the range someone's? Else
        every launch fails saying what to fix."""
        if self.team_uids is not None:
            self._check_range()
            probe = JobUser(self.team_uids.start, self.team_uids.start, "probe")
        elif self.shared is not None:
            probe = self.for_team(None, "")
        else:
            return
        runs.mkdir(parents=True, exist_ok=True)
        problem = (_interpreter_problem(python, probe)
                   or _run_as(probe, ["test", "-x", str(runs)], f"cannot enter {runs}"))
        if problem:
            who = f"uid {probe.uid}" if self.team_uids is not None else repr(self.shared)
            raise LaunchError(
                f"the local launcher runs jobs as {who}, who cannot run {python} with spotbroker or enter "
                f"{runs} ({problem}): every directory above them must be searchable by any user (chmod o+x), "
                "or set SPOTBROKER_LOCAL_JOB_PYTHON / SPOTBROKER_DATA_DIR (`make install` makes .venv-jobs)")

    def _check_range(self) -> None:
        assert self.team_uids is not None
        taken = [f"user {e.pw_name} (uid {e.pw_uid})" for e in pwd.getpwall() if e.pw_uid in self.team_uids]
        taken += [f"group {e.gr_name} (gid {e.gr_gid})" for e in grp.getgrall() if e.gr_gid in self.team_uids]
        if taken:
            raise LaunchError(
                f"SPOTBROKER_LOCAL_UID_RANGE ({self.team_uids.start}-{self.team_uids.stop - 1}) holds "
                f"{', '.join(taken[:3])}: local jobs run as the range's uids, which must be no one else's. "
                "Choose a range that no account of this host uses")


def secure_data_dir(data_dir: Path) -> None:
    """When jobs run as another user: they may enter the data directory (to
    reach their own run and checkpoint directories) but not list it, and the
    database, the secret key and the logs are the broker's alone."""
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o711)
    for name in ("runs", "checkpoints"):
        (data_dir / name).mkdir(exist_ok=True)
        (data_dir / name).chmod(0o711)
    (data_dir / "logs").mkdir(exist_ok=True)
    (data_dir / "logs").chmod(0o700)
    for path in data_dir.iterdir():
        if path.is_file():
            path.chmod(0o600)


# (interpreter, uid) pairs seen to run the agent: asked once per process,
# for a process may make many launchers (the suite makes one per test server).
_INTERPRETERS_OK: set[tuple[str, int]] = set()


def _interpreter_problem(python: str, user: JobUser) -> str | None:
    if (python, user.uid) in _INTERPRETERS_OK:
        return None
    problem = _run_as(user, [python, "-c", "import spotbroker.agent.cli"], f"cannot run {python}")
    if problem is None:
        _INTERPRETERS_OK.add((python, user.uid))
    return problem


def _run_as(user: JobUser, argv: list[str], failed: str) -> str | None:
    """None if `argv` succeeds as `user`, else what went wrong (its last line of error, or `failed`)."""
    try:
        result = subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=[], cwd="/",
                                env={"PATH": SYSTEM_PATH, "HOME": "/"}, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return exc.strerror or str(exc)
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else failed
