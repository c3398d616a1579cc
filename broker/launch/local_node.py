"""One node of a local run: what a cloud VM is to a real one.

The local launcher starts `python -m spotbroker.broker.launch.local_node SPEC`
in a session of its own, as the broker's user, for every node of an attempt.
SPEC is a JSON file only the broker's user can read (it holds the attempt's
agent token, the job's secrets and its storage credentials); see `NodeSpec`.
The node reads it once and removes it, so that no secret stays on the
broker's disk in a run directory that outlives the job. The node:

1. records its own pid and kernel start time (`node-{rank}.self`) before
   anything else, so that a launcher that died while starting it finds it
   instead of starting it twice;
2. becomes a child subreaper, so that everything the job starts, whatever
   its session (torchrun's workers, daemons), stays below it;
3. provisions the node directory (`home/`, `tmp/`, the job's code in
   `workdir/`, the agent's `agent/`) and the job's file:// checkpoint
   prefixes, owned by the user the job runs as (its team's uid, when the
   broker is root: `identity.py`) with mode 0700;
4. starts the node's metadata-service simulator, if the attempt simulates a
   cloud: it plays the cloud, so it runs as the broker's user and its hard
   stop ends every process of the node, this one included (no exit recorded:
   the node vanished);
5. runs the job's command as that user, with exactly the environment the
   launcher built (nothing of the broker's own), in `workdir/`; the agent's
   token goes through a pipe (`--token-fd`), never an environment; the
   job's output goes through a pipe too, into the node's output file, up to
   `max_log_bytes` (then a marker, and the rest is read and dropped);
6. records that the command started (`started-{rank}`), then its exit code
   (`exit-{rank}`), ends what the job left behind, and exits with that code.
   A provisioning failure, or a command the kernel refuses to start (E2BIG),
   is recorded in `error-{rank}` instead, with the reason.

SIGTERM (the launcher's terminate) is passed to every process of the node;
whatever is still alive after the grace period gets SIGKILL.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotbroker.agent import proctree, protocol
from spotbroker.agent.code import CodeError
from spotbroker.agent.logbound import BoundedWriter
from spotbroker.broker.launch import local_mounts

SKY_WORKDIR = "sky_workdir"  # SkyPilot's name for a task's working directory, in the node's home

ERROR_EXIT = 125  # provisioning failed before the job's command ran


@dataclass
class NodeSpec:
    rank: int
    run_dir: str                       # the attempt's directory: node-N.self, exit-N, error-N, sim*.url
    node_dir: str                      # this node's own: home/, tmp/, workdir/, agent/
    command: list[str]                 # run in workdir/ as `owner`
    env: dict[str, str]                # the job's whole environment
    owner: list[int] | None = None     # [uid, gid] the job runs as; None: the broker's own user
    agent_token: str | None = None     # handed to the agent (the command) through a pipe
    code: dict[str, str] | None = None  # {"uri", "sha256"}: the job's uploaded workdir
    checkpoint_dirs: list[str] = field(default_factory=list)  # file:// prefixes the job writes or reads
    mounts: list[dict] = field(default_factory=list)  # the job's file mounts (agent/mounts.py), placed before setup
    simulator: list[str] | None = None  # the simulator's arguments, if the node simulates a cloud
    kill_grace: float = 10.0
    max_log_bytes: int = 0             # of the job's output kept in the node's output file (0: no bound)

    @classmethod
    def load(cls, path: str) -> NodeSpec:
        return cls(**json.loads(Path(path).read_text()))


class ProvisionError(RuntimeError):
    pass


def _write_atomic(path: Path, text: str) -> None:
    """A record of the node's (its pid, its exit, why it failed): the broker's alone, as the run directory is
    entered by every team's jobs."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _give(path: Path, owner: tuple[int, int] | None, mode: int = 0o700) -> None:
    """Make `path` a directory that belongs to the job's user (and no one
    else). Never through a link: where the job owns the parent (its job
    prefix, written by an earlier attempt that may still run), one there
    would have root change the mode and owner of whatever it points to."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ProvisionError(f"{path} is a link or not a directory ({exc.strerror}): nothing is made "
                              "through it") from None
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _give_tree(root: Path, owner: tuple[int, int]) -> None:
    """Give `root` and everything in it to the job's user. Walked by
    descriptors from a root opened without following a link, deepest
    first (a directory becomes the job's only after what is in it): a
    name swapped for a link, at the top or below, is never followed, so
    root never changes the owner of what it points to."""
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ProvisionError(f"{root} is a link or not a directory ({exc.strerror}): nothing is given through it") \
            from None
    try:
        for _dir, dirs, files, dir_fd in os.fwalk(".", topdown=False, follow_symlinks=False, dir_fd=top):
            for name in (*dirs, *files):
                os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)
        os.fchown(top, *owner)
    finally:
        os.close(top)


def _adopt(root: Path, owner: tuple[int, int]) -> None:
    """A job prefix that another uid owns (written before each team ran as
    its own, or under another range): its directories and files become the
    team's, to resume from. What root wrote (KEEP markers) stays root's, and
    a file with other links keeps its owner (through one, another's file
    would change hands). Walked by descriptors, never through a link, as the
    old owner may still run and swap names."""
    for _top, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in (*dirs, *files):
            try:  # O_NOFOLLOW: a link is skipped; O_NONBLOCK: a FIFO does not wait
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                info = os.fstat(fd)
                own = stat.S_ISDIR(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_nlink == 1)
                if own and info.st_uid not in (0, owner[0]):
                    os.fchown(fd, *owner)
            finally:
                os.close(fd)


def provision(spec: NodeSpec) -> Path:
    """The node directory and the job's checkpoint prefixes; returns workdir/."""
    owner = tuple(spec.owner) if spec.owner else None
    node = Path(spec.node_dir)
    # The node directory stays root's (0700) until everything in it is made:
    # were it the job's user's, any other process of the team (another job,
    # a node still draining) could swap a name in it for a link while root
    # fetches and hands over the code through that name.
    _give(node, (0, 0) if owner is not None else None)
    for name in ("home", "tmp", "agent"):
        _give(node / name, owner)
    workdir = node / "workdir"
    if spec.code:
        from spotbroker.agent.code import fetch_code

        try:
            fetch_code(spec.code["uri"], spec.code["sha256"], workdir)
        except CodeError as exc:
            raise ProvisionError(f"cannot fetch the job's code: {exc}") from None
        if owner is not None:
            _give_tree(workdir, owner)
    else:
        _give(workdir, owner)
    for prefix in spec.checkpoint_dirs:
        # The parents ({root}/{team}) stay the broker's (traversable, not
        # listable); the job's own prefix is the job's uid's alone: no other
        # team's job can read it or plant a checkpoint in it.
        path = Path(prefix)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
        if owner is not None and path.is_dir() and not path.is_symlink() and path.stat().st_uid != owner[0]:
            _adopt(path, owner)
        _give(path, owner)
    try:
        local_mounts.place(spec.mounts, spec.env, node, owner, _give, _give_tree)
    except CodeError as exc:
        raise ProvisionError(str(exc)) from None
    # Where SkyPilot puts a task's workdir: recipes `cd ~/sky_workdir`.
    link = node / "home" / SKY_WORKDIR
    if not link.exists() and not link.is_symlink():
        link.symlink_to("../workdir")
        if owner is not None:
            os.lchown(link, *owner)
    _give(node, owner)
    return workdir


def _pipe_holding(secret: str) -> int:
    """The read end of a pipe that holds `secret` (for a child's --token-fd):
    unlike an environment or a file, no other process of the child's uid can read it."""
    read, write = os.pipe()
    try:
        os.write(write, secret.encode())  # far below a pipe's buffer: never blocks
    finally:
        os.close(write)
    return read


def _memory_file_holding(text: str) -> int:
    """A file in memory holding `text`, read from its start: of any size,
    where a pipe's writer would wait for a reader that has not started."""
    fd = os.memfd_create("spotbroker-trainer-env")
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def started_file(rank: int) -> str:
    """Written once node `rank` started the job's command: a node that ends
    without it failed to start the job (the launcher says so), and did not vanish."""
    return f"started-{rank}"


def start_failure(run_dir: Path, node: dict) -> str | None:
    """Why a node that is gone without an exit code failed: None if it had
    started the job's command (it vanished: a reclaim), else its last words
    (the node prints why it ended, a traceback's last line included). Nodes
    recorded before `started_file` existed (no `marks_start`) vanished."""
    if not node.get("marks_start") or (run_dir / started_file(node["rank"])).exists():
        return None
    last = ""
    try:
        with open(node["log"], "rb") as out:
            out.seek(max(0, os.fstat(out.fileno()).st_size - 4096))
            last = next((line for line in reversed(out.read().decode(errors="replace").splitlines())
                         if line.strip()), "")
    except (OSError, KeyError):
        pass
    return f"node {node['rank']} ended before the job's command started" + (f": {last.strip()[:500]}" if last else "")


def sim_url_file(rank: int) -> str:
    """Where node `rank`'s simulator writes its URL (node 0's name is the one older runs have)."""
    return "sim.url" if rank == 0 else f"sim-{rank}.url"


SIMULATOR_START_S = 20  # how long a node waits for its metadata simulator to listen


def sim_token_file(rank: int) -> str:
    """Where node `rank` keeps its simulator's control token, for the broker's `simulate_preemption`."""
    return sim_url_file(rank).replace(".url", ".token")


def _private(path: Path, flags: int):
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600), "wb")


def start_simulator(spec: NodeSpec) -> subprocess.Popen[bytes] | None:
    """The simulated cloud's metadata service for this node; its URL joins the job's environment."""
    if spec.simulator is None:
        return None
    run_dir = Path(spec.run_dir)
    url_file = run_dir / sim_url_file(spec.rank)
    # The broker's alone: the job learns the URL from its environment, and
    # another team's job that read it could send this node notices.
    # Its port is no secret (any process on the host lists listening sockets):
    # its control endpoints take orders only with this token, the broker's.
    token = secrets.token_urlsafe(24)
    with _private(run_dir / sim_token_file(spec.rank), os.O_TRUNC) as f:
        f.write(token.encode())
    log_name = url_file.name.replace(".url", ".log")
    with _private(run_dir / log_name, os.O_APPEND) as log, _private(url_file, os.O_TRUNC) as out:
        sim = subprocess.Popen([sys.executable, "-m", "spotbroker.agent.metadata_sim", *spec.simulator,
                                "--kill-at-hard-stop", str(os.getpid())],
                               stdin=subprocess.DEVNULL, stdout=out, stderr=log,
                               env={**os.environ, protocol.ENV_SIM_CONTROL_TOKEN: token})
    deadline = time.monotonic() + SIMULATOR_START_S
    while time.monotonic() < deadline:
        text = url_file.read_text()
        if "\n" in text:  # the simulator prints its URL as one line once it listens
            spec.env[protocol.ENV_METADATA_URL] = text.split("\n", 1)[0].strip()
            return sim
        if sim.poll() is not None:
            break
        time.sleep(0.02)
    raise ProvisionError(f"the metadata simulator did not start (see {run_dir / log_name})")


class Node:
    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.job: subprocess.Popen[bytes] | None = None
        self.pump: threading.Thread | None = None  # the job's output into the node's file
        self.stopping = False

    def on_term(self, signum: int, frame: Any) -> None:
        """The launcher stops the node: every process of it is told, then killed after the grace period."""
        self.stopping = True
        proctree.signal_tree(os.getpid(), signal.SIGTERM, include_root=False)
        signal.alarm(max(1, round(self.spec.kill_grace)))

    def on_alarm(self, signum: int, frame: Any) -> None:
        proctree.kill_tree(os.getpid(), spare=(os.getpid(),))

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGALRM, self.on_alarm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # held by the launcher until now
        try:
            return self._run(Path(self.spec.run_dir), self.spec.rank)
        finally:  # on every way out, even with its run directory gone: nothing of the node outlives it
            self._end_leftovers()
            if self.pump is not None:
                self.pump.join(5.0)

    def _run(self, run_dir: Path, rank: int) -> int:
        try:
            workdir = provision(self.spec)
            if not self.stopping:
                start_simulator(self.spec)
        except (ProvisionError, OSError) as exc:
            _write_atomic(run_dir / f"error-{rank}", json.dumps({"reason": str(exc)}))
            print(f"spotbroker: node {rank}: {exc}", file=sys.stderr, flush=True)
            return ERROR_EXIT
        if self.stopping:  # stopped while starting: it ends with a code all the same
            _write_atomic(run_dir / f"exit-{rank}", f"{128 + signal.SIGTERM}\n")
            return 128 + signal.SIGTERM
        owner, env = self.spec.owner, dict(self.spec.env)
        env.pop(protocol.ENV_AGENT_TOKEN_FD, None)
        env.pop(protocol.ENV_TRAINER_ENV_FD, None)
        token_fd = _pipe_holding(self.spec.agent_token) if self.spec.agent_token else None
        fds = [] if token_fd is None else [token_fd]
        if token_fd is not None:
            env[protocol.ENV_AGENT_TOKEN_FD] = str(token_fd)
            # The dynamic loader's variables would load the job's code into the
            # agent, which holds the token: they reach its trainer only.
            if loader := {name: env.pop(name) for name in list(env) if name.startswith("LD_")}:
                fds.append(_memory_file_holding(json.dumps(loader)))
                env[protocol.ENV_TRAINER_ENV_FD] = str(fds[-1])
        output, into_output = os.pipe()
        try:
            self.job = subprocess.Popen(
                self.spec.command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=into_output,
                stderr=subprocess.STDOUT, pass_fds=tuple(fds),
                user=owner[0] if owner else None, group=owner[1] if owner else None,
                extra_groups=[] if owner else None, umask=0o077)
        except (OSError, subprocess.SubprocessError) as exc:
            # execve refused it (E2BIG: an environment or command over what the
            # kernel takes): a failed start, said as such, never a node that vanished.
            os.close(output)
            reason = f"cannot start the job's command: {exc}"
            _write_atomic(run_dir / f"error-{rank}", json.dumps({"reason": reason}))
            print(f"spotbroker: node {rank}: {reason}", file=sys.stderr, flush=True)
            return ERROR_EXIT
        finally:
            os.close(into_output)
            for fd in fds:
                os.close(fd)
        _write_atomic(run_dir / started_file(rank), f"{self.job.pid}\n")
        self.pump = threading.Thread(target=self._pump_output, args=(output,), name="output", daemon=True)
        self.pump.start()
        code = self._wait_for_job()
        self.pump.join(1.0)  # the job's last words before its exit is recorded (unless a leftover holds the pipe)
        if local_mounts.written_back(self.spec.mounts):
            self._end_leftovers()  # nothing of the job writes while its files are saved
            local_mounts.save(self.spec.mounts, self.spec.env, Path(self.spec.node_dir), self.spec.owner, rank)
        _write_atomic(run_dir / f"exit-{rank}", f"{code}\n")
        return code

    def _pump_output(self, fd: int) -> None:
        """The job's output into the node's output file (this process's
        stdout), up to `max_log_bytes`; past them the marker, and the rest is
        read and dropped: the job never blocks on a full pipe, and never fills
        the broker's disk."""
        with open(fd, "rb", buffering=0) as source, open(os.dup(sys.stdout.fileno()), "ab") as sink:
            out = BoundedWriter(sink, self.spec.max_log_bytes, stored=os.fstat(sink.fileno()).st_size)
            while chunk := source.read(65536):
                out.write(chunk)
                out.flush()

    def _wait_for_job(self) -> int:
        """Reap every child (orphans come to us) until the job's own process ends."""
        assert self.job is not None
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == self.job.pid:
                self.job.returncode = os.waitstatus_to_exitcode(status)
                code = self.job.returncode
                return 128 - code if code < 0 else code

    def _end_leftovers(self) -> None:
        """What the job left running ends with its node's run (as on a VM torn down)."""
        if proctree.signal_tree(os.getpid(), signal.SIGTERM, include_root=False):
            deadline = time.monotonic() + min(self.spec.kill_grace, 5.0)
            while proctree.descendants(os.getpid()) and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.05)
            proctree.kill_tree(os.getpid(), spare=(os.getpid(),))
        self._reap()

    @staticmethod
    def _reap() -> None:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def main(argv: list[str]) -> int:
    spec = NodeSpec.load(argv[0])
    Path(argv[0]).unlink(missing_ok=True)  # in memory only from now on (see the module's docstring)
    run_dir = Path(spec.run_dir)
    _write_atomic(run_dir / f"node-{spec.rank}.self", f"{os.getpid()} {proctree.start_time(os.getpid())}\n")
    proctree.become_subreaper()
    return Node(spec).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
