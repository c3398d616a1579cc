"""The wire between the broker, the node agent and the trainer: one source.

Three parties talk, and every name they share is defined here:

* the **broker** launches an attempt and gives the agent its environment;
* the **agent** (supervisor, `agent/runner.py`) starts the trainer, watches
  the cloud's preemption notice and reports to the broker over HTTP;
* the **trainer** uses the checkpoint library (`agent/checkpoint/`), which
  talks to the agent through files in a private control directory.

This module imports nothing beyond the standard library: the broker, the
agent and the trainer all import it.
"""
from __future__ import annotations

import json
import os
from datetime import UTC
from pathlib import Path
from typing import Any

# --- Environment given to the agent by the launcher, and passed on to the trainer.
ENV_BROKER_URL = "SPOTBROKER_URL"            # e.g. http://10.0.0.5:8000
ENV_AGENT_TOKEN = "SPOTBROKER_AGENT_TOKEN"   # per-attempt token; may post only for its attempt
ENV_AGENT_TOKEN_FD = "SPOTBROKER_AGENT_TOKEN_FD"  # or: the fd to read it from (the local launcher's pipe)
# The local launcher's: an fd holding a JSON object of variables for the trainer
# only (the dynamic loader's, LD_*, which would load the job's code into the agent).
ENV_TRAINER_ENV_FD = "SPOTBROKER_TRAINER_ENV_FD"
ENV_JOB_ID = "SPOTBROKER_JOB_ID"
ENV_ATTEMPT_ID = "SPOTBROKER_ATTEMPT_ID"
ENV_CLOUD = "SPOTBROKER_CLOUD"               # aws | gcp | azure | local; unset = detect
ENV_METADATA_URL = "SPOTBROKER_METADATA_URL"  # stand-in for the cloud's metadata endpoint
ENV_CHECKPOINT_URI = "CHECKPOINT_URI"        # {root}/{team}/{job}/{attempt}: this attempt's prefix
ENV_CHECKPOINT_ROOT = "SPOTBROKER_CHECKPOINT_JOB_URI"  # {root}/{team}/{job}: all attempts of the job
ENV_RESUME_FROM = "RESUME_FROM"              # a committed checkpoint's URI, or empty
ENV_CONTROL_DIR = "SPOTBROKER_CONTROL_DIR"   # trainer <-> agent files, private to the attempt; always absolute
# A pre-flight attempt (broker/jobs/preflight.py): the library stops the trainer after this many steps.
ENV_PREFLIGHT = "SPOTBROKER_PREFLIGHT"       # "1" on a pre-flight
ENV_PREFLIGHT_STEPS = "SPOTBROKER_PREFLIGHT_STEPS"
# The job's `early_stop` as JSON ({"metric", "mode", "min_delta", "min_steps", "patience"}), or unset:
# with it the library checkpoints each report that improves the metric (the best weights).
ENV_EARLY_STOP = "SPOTBROKER_EARLY_STOP"
# Where the attempt runs, for the trainer (and the job's own scripts).
ENV_REGION = "SPOTBROKER_REGION"
ENV_ZONE = "SPOTBROKER_ZONE"
ENV_INSTANCE_TYPE = "SPOTBROKER_INSTANCE_TYPE"
# The job's uploaded workdir (broker/jobs/uploads.py): each node fetches it and checks its sha256 (agent/code.py).
ENV_CODE_URI = "SPOTBROKER_CODE_URI"
ENV_CODE_SHA256 = "SPOTBROKER_CODE_SHA256"
# The job's file mounts as resolved by the broker (agent/mounts.py: `encode`), placed before `setup`.
ENV_MOUNTS = "SPOTBROKER_MOUNTS"
# Where a local node places an absolute mount path `/P` (it has no file system of its own to give a job).
ENV_MOUNT_ROOT = "SPOTBROKER_MOUNT_ROOT"
# Seconds between a notice without a deadline (GCP, a drain) and the hard stop, when the launcher
# knows better than the agent's default (the local launcher's simulated GCP window).
ENV_NOTICE_WINDOW = "SPOTBROKER_NOTICE_WINDOW"
# The metadata-service simulator's control token (agent/metadata_sim/), from the local launcher's
# node: an environment variable, not an argument (arguments are readable by every user in /proc).
ENV_SIM_CONTROL_TOKEN = "SPOTBROKER_SIM_CONTROL_TOKEN"

# --- The attempt's own storage credentials, scoped to its job (the broker mints
# them: broker/launch/storage_credentials.py). They are spotbroker's alone: never
# in the provider's standard variables (AWS_ACCESS_KEY_ID, GOOGLE_*...), which
# stay the user's own (their secrets, the node's instance identity). The launch
# gives the credentials document in ENV_STORAGE_CREDENTIALS (secret); the agent
# writes it to CREDENTIALS_FILE in the control directory, keeps it fresh from
# CREDENTIALS_PATH, names it to the trainer in ENV_STORAGE_CREDENTIALS_FILE and
# takes ENV_STORAGE_CREDENTIALS out of the trainer's environment. The
# checkpoint library uses them for the document's bucket only.
ENV_STORAGE_CREDENTIALS = "SPOTBROKER_STORAGE_CREDENTIALS"  # the launch's document, as JSON
ENV_STORAGE_CREDENTIALS_FILE = "SPOTBROKER_STORAGE_CREDENTIALS_FILE"
# {"provider": "s3" | "gs", "expires_at": iso8601, "bucket": the checkpoint root's bucket,
#  "options": {"endpoint": url, "region": ...} (where the bucket is, when not the provider's default),
#  "credentials": obstore's fields (S3: access_key_id, secret_access_key, token; GCS: token)}
CREDENTIALS_FILE = "storage-credentials.json"

# Everything the broker sets for each attempt (the above, the place, the
# code): a job's own `envs` and `secrets` may not name them, since on a
# SkyPilot node a secret would win over the broker's value.
PER_ATTEMPT_ENV = frozenset({
    ENV_BROKER_URL, ENV_AGENT_TOKEN, ENV_AGENT_TOKEN_FD, ENV_TRAINER_ENV_FD, ENV_JOB_ID, ENV_ATTEMPT_ID, ENV_CLOUD,
    ENV_METADATA_URL,
    ENV_CHECKPOINT_URI, ENV_CHECKPOINT_ROOT, ENV_RESUME_FROM, ENV_CONTROL_DIR, ENV_EARLY_STOP,
    ENV_REGION, ENV_ZONE, ENV_INSTANCE_TYPE, ENV_CODE_URI, ENV_CODE_SHA256,
    ENV_STORAGE_CREDENTIALS, ENV_STORAGE_CREDENTIALS_FILE, ENV_PREFLIGHT, ENV_PREFLIGHT_STEPS,
    ENV_MOUNTS, ENV_MOUNT_ROOT, ENV_NOTICE_WINDOW, ENV_SIM_CONTROL_TOKEN})

# --- Trainer <-> agent, through files in the control directory.
# Each process of the library announces itself at start in its own
# library-{pid}.json: {"pid": int, "start": str (the kernel's start time of
# the pid, /proc/PID/stat field 22), "rank": int, "local_rank": int,
# "version": 2}; the agent signals every one of them that is alive and in its
# trainer's process tree. The first rank of the node also writes
# library.json ({"pid": int, "version": 1}), which is all an older agent reads.
LIBRARY_FILE = "library.json"
LIBRARY_PREFIX, LIBRARY_SUFFIX = "library-", ".json"
FLUSH_FILE = "flush.json"      # the agent writes it on a notice: {"deadline": iso8601, "reason": str}
EVENTS_FILE = "events.jsonl"   # the library appends one JSON object per line (types below)
FLUSH_SIGNAL = "SIGUSR1"       # sent to each announced pid (never a process group) with FLUSH_FILE
# The agent writes it when the broker stops the run early ({"at": iso8601, "reason": "early_stop"}): the
# library checkpoints at the next step boundary (CHECKPOINT_COMMITTED, reason EARLY_STOP) and says should_stop.
STOP_FILE = "stop.json"
EARLY_STOP = "early_stop"      # that checkpoint's reason; the job ends SUCCEEDED with reason EARLY_STOPPED
EARLY_STOPPED = "early_stopped"
# The agent writes the broker's checkpoint interval: {"seconds": float | null} (null: the trainer's own).
INTERVAL_FILE = "interval.json"

# --- Event types (trainer -> agent -> broker, and agent -> broker).
HEARTBEAT = "heartbeat"
# A heartbeat's (and trainer_exited's) data carries, where the node's agent
# reads NVML, its GPUs' energy since the trainer started and over how long:
GPU_JOULES = "gpu_joules"
GPU_SECONDS = "gpu_seconds"
PREEMPTION_NOTICE = "preemption_notice"        # data: cloud, kind, deadline (iso8601), raw
REBALANCE_RECOMMENDATION = "rebalance_recommendation"
CHECKPOINT_COMMITTED = "checkpoint_committed"  # data: step, uri, bytes, seconds, reason
NO_FLUSH = "no_flush"                          # data: reason (no library, deadline passed, trainer gone)
# Every event of a multi-node job's agent on node N > 0 carries data "node": N
# and its own seq (counted per node); the broker keeps one seq per node.
EVENT_NODE = "node"
RESUMED = "resumed"                            # data: step, uri
# data: steps (ints): this attempt's checkpoints the library's keep_last deleted (the broker forgets them)
CHECKPOINTS_PRUNED = "checkpoints_pruned"
MAX_PRUNED_STEPS = 1000                        # steps in one such event
TRAINER_STARTED = "trainer_started"            # data: pid, library (bool)
TRAINER_EXITED = "trainer_exited"              # data: exit_code, log_bytes
# trainer_exited's data: how long the node's log is. It may overtake the log's
# last bytes (a broker back from an outage takes both at once): the broker
# holds the log unfinished until it has them.
EVENT_LOG_BYTES = "log_bytes"
# data: step (int), values ({name: finite float}). The library writes one per
# report(); the agent folds those that come more often than every few seconds.
# Under early_stop, data[EARLY_STOP] is the rule's standing, counted by the library
# over every report (folding keeps the newest): {"best_step": int, "best_value":
# float, "since": int (reports since the best that did not beat it), "met": bool
# (since >= patience: the agent sends it at once)}. The broker fires on it.
METRICS = "metrics"
INTERVAL_ADOPTED = "checkpoint_interval_adopted"  # data: seconds (null: the trainer's own), code_seconds
# data: reason. The agent could not set up the trainer's control directory:
# no flush can be asked, so a notice goes straight to recovery.
CONTROL_UNAVAILABLE = "control_unavailable"
AGENT_EVENT_TYPES = frozenset({
    HEARTBEAT, PREEMPTION_NOTICE, REBALANCE_RECOMMENDATION, CHECKPOINT_COMMITTED,
    NO_FLUSH, RESUMED, TRAINER_STARTED, TRAINER_EXITED, CONTROL_UNAVAILABLE, METRICS, INTERVAL_ADOPTED,
    CHECKPOINTS_PRUNED,
})

# --- Agent -> broker over HTTP, `Authorization: Bearer <agent token>`.
# POST EVENTS_PATH  {"events": [{"seq": int, "type": str, "at": iso8601, "data": {...}}]}
#   seq counts from 1 per attempt; the broker ignores a seq it has already
#   stored, so a buffered batch can be re-sent safely. Answer 200
#   {"accepted": int, "last_seq": int, "cancel": bool, "drain": bool,
#    "drain_seconds": float | null}:
#   cancel: the attempt is over, stop the trainer. drain: the broker is moving
#   the job (to on-demand before a deadline, to a cheaper zone): the agent
#   handles it once per attempt as a preemption notice whose deadline is
#   drain_seconds from now (its own notice window if the broker gives none),
#   reported as PREEMPTION_NOTICE with data kind
#   DRAIN_KIND, cloud DRAIN_CLOUD, source DRAIN_SOURCE and raw null, and asks
#   the library to flush (reason DRAIN_KIND); the broker then cancels the
#   attempt. An answer without "drain" (an older broker) is no drain.
#   "checkpoint_interval_s": float | null, the library's periodic interval in
#   force (the job spec's `checkpoint.interval`: fitted, fixed, or null for the
#   trainer's own); the agent writes each new value to INTERVAL_FILE.
# POST LOGS_PATH    raw bytes of the trainer's output, header `X-Log-Offset`:
#   the byte offset of this chunk in the attempt's log; re-sent chunks are
#   ignored by offset. Header `X-Log-Node`: the node's rank, whose log it is
#   (absent: 0). Answer 200 {"size": int} (bytes stored so far).
# POST CREDENTIALS_PATH (no body): fresh storage credentials for the attempt,
#   answered 200 with CREDENTIALS_FILE's JSON while the attempt is live; 404
#   when its checkpoint root needs none (file://); 409 once it has ended. The
#   attempt's nodes asking within 10 s of each other get the same credentials.
EVENTS_PATH = "/v1/agent/events"
CREDENTIALS_PATH = "/v1/agent/credentials"
LOGS_PATH = "/v1/agent/logs"
LOG_OFFSET_HEADER = "X-Log-Offset"
LOG_NODE_HEADER = "X-Log-Node"
ANSWER_CANCEL = "cancel"  # fields of the events answer
ANSWER_DRAIN = "drain"
ANSWER_DRAIN_SECONDS = "drain_seconds"
ANSWER_STOP = "stop"
ANSWER_CHECKPOINT_INTERVAL = "checkpoint_interval_s"
DRAIN_KIND = "drain"           # a drain's notice kind, and the reason in its flush.json
DRAIN_CLOUD = "broker"
DRAIN_SOURCE = "broker.drain"

# --- Checkpoint layout (see DESIGN.md): {prefix}/step-{N:012d}/... then MANIFEST.json last.
MANIFEST = "MANIFEST.json"


def now_iso() -> str:
    """Now, as the agent and the library write times in events (UTC, ms)."""
    from datetime import datetime

    return datetime.now(UTC).isoformat(timespec="milliseconds")


def step_dir(step: int) -> str:
    return f"step-{step:012d}"


def append_event(control_dir: str | os.PathLike[str], event: dict[str, Any]) -> None:
    """Append one event line; a single small O_APPEND write is atomic on POSIX."""
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    fd = os.open(Path(control_dir) / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
