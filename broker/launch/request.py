"""What a node is given to run an attempt: the launch request, built from
the attempt's row (its place and price, the job's code, and the agent's
environment: its token, where to write checkpoints and what to resume
from)."""
from __future__ import annotations

from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.broker.checkpoints import coldtier
from spotbroker.broker.checkpoints.records import newest_checkpoint
from spotbroker.broker.checkpoints.uris import attempt_prefix, job_prefix
from spotbroker.broker.jobs import buckets, mounts, preflight, sealed, uploads
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.uploads import CodeRef
from spotbroker.broker.launch import storage_credentials
from spotbroker.broker.launch.base import LaunchError, LaunchRequest
from spotbroker.broker.pricing.offers import Placement
from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import sealing
from spotbroker.broker.store.models import Attempt, Team
from spotbroker.broker.store.sealing import SealError


def launch_request(session: Session, attempt: Attempt, settings: Settings, key: bytes) -> LaunchRequest:
    """The request that launches `attempt` (`key`: the broker's signing key,
    from which the attempt's agent token is derived)."""
    job = attempt.job
    try:  # the secrets' values, opened only here, to be handed to the job's process
        spec = sealed.opened(job, sealing.keyring(settings))
    except SealError as exc:
        raise LaunchError(f"not launched: its secrets cannot be read: {exc}") from None
    # Refused at submission since; a spec stored before cannot set them either.
    spec = spec.without_per_attempt()
    if attempt.preflight:  # the job's trial: its own run, one node, a CPU (broker/jobs/preflight.py)
        spec = preflight.trial(spec)
    team = session.get(Team, job.team_id)
    job_uri = job_prefix(settings.checkpoint_uri, team.name, job.id)
    placement = Placement(cloud=attempt.cloud, region=attempt.region, zone=attempt.zone,
                          zone_id=attempt.zone_id, instance_type=attempt.instance_type,
                          accelerator=attempt.accelerator, accelerator_count=attempt.accelerator_count,
                          use_spot=attempt.use_spot, price_per_hour=attempt.price_per_hour)
    resume = newest_checkpoint(session, job.id)
    cold = coldtier.cold_reason(session, resume)
    if cold is not None:  # never handed to a node as RESUME_FROM: it could not read it
        raise LaunchError(f"not launched: {cold}")
    extra = {
        protocol.ENV_JOB_ID: str(job.id), protocol.ENV_ATTEMPT_ID: str(attempt.id),
        protocol.ENV_CHECKPOINT_ROOT: job_uri,
        protocol.ENV_CHECKPOINT_URI: attempt_prefix(settings.checkpoint_uri, team.name, job.id, attempt.id),
        protocol.ENV_RESUME_FROM: resume.uri if resume else "",
        protocol.ENV_BROKER_URL: settings.agent_url,
        protocol.ENV_AGENT_TOKEN: agent_token(key, attempt.id),
        **(preflight.trainer_env(spec.preflight) if attempt.preflight else {}),
        **({protocol.ENV_EARLY_STOP: spec.early_stop.env_value()} if spec.early_stop else {}),
    }
    code = _code(settings, spec, team.name)
    placed = tuple(mounts.resolved(settings, team.name, spec, buckets.allowed(session, team.id)))
    storage = storage_credentials.for_attempt(session, attempt, settings)  # None: a file:// root
    return LaunchRequest(attempt_id=attempt.id, job_id=job.id, team=team.name, team_id=team.id, run=spec.run,
                         setup=spec.setup, envs=spec.envs, num_nodes=spec.num_nodes, placement=placement,
                         code=code, extra_env=extra, secrets=spec.secret_values(), spec=spec,
                         storage_env=storage.env if storage else {}, mounts=placed)


def _code(settings: Settings, spec: JobSpec, team: str) -> CodeRef | None:
    """The job's uploaded workdir, from the team's own storage prefix. A
    path on the broker's host (accepted before uploads existed, refused at
    submission since) is refused here too: a job may not run in, or ship,
    the broker's own directories."""
    if spec.workdir is None:
        return None
    if isinstance(spec.workdir, str):
        raise LaunchError(f"workdir {spec.workdir!r} is a path on the broker's host, which jobs may not use: "
                          "submit the job with `spotbroker submit FILE`, which uploads its workdir")
    return uploads.code_ref(settings, team, spec.workdir.upload)
