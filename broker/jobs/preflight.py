"""The pre-flight a job may ask for (`preflight: true`, or `preflight: {run:
..., steps: 2, timeout: 600, accelerators: T4:1}`): its `setup` and `run`
(or the pre-flight's own `run`) tried once on the cheapest CPU place, before
any GPU is rented, so that a script which crashes on its first batch, or
whose checkpoint cannot be loaded, costs a CPU's minutes instead of a GPU
fleet's. What the trainer does under it is the checkpoint library's
(`agent/checkpoint/preflight.py`); how the broker runs and judges it,
`broker/recovery/preflight.py`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StringConstraints, field_validator

from spotbroker.agent import protocol
from spotbroker.broker.jobs.resources import Infra, Resources, one_accelerator
from spotbroker.broker.jobs.states import AttemptState

if TYPE_CHECKING:
    from spotbroker.broker.jobs.spec import JobSpec
    from spotbroker.broker.store.models import Job

DEFAULT_STEPS = 2
DEFAULT_TIMEOUT_S = 600
# The events a pre-flight writes (broker/recovery/preflight.py), which the dashboard reads too.
STARTED, PASSED, FAILED = "preflight_started", "preflight_passed", "preflight_failed"


class Preflight(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    run: Annotated[str, StringConstraints(strip_whitespace=False, min_length=1), Field(
        description="the command to try instead of the job's run (its setup runs first all the same)")] | None = None
    steps: Annotated[StrictInt, Field(ge=1, le=10_000, description=(
        "steps the checkpoint library lets the trainer take before one save, a restore of it, and exit 0"))] \
        = DEFAULT_STEPS
    timeout: Annotated[StrictInt, Field(ge=10, le=86_400, description=(
        "seconds before the pre-flight counts as failed"))] = DEFAULT_TIMEOUT_S
    accelerators: Annotated[str, Field(description=(
        "run the pre-flight on the cheapest place with this GPU (NAME[:COUNT]) instead of a CPU"))] | None = None

    @field_validator("run")
    @classmethod
    def _run(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("give a command to run, or leave run out to try the job's own")
        return value

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        return one_accelerator(value, "give one accelerator (NAME[:COUNT])")


def _switch(value: Any) -> Any:
    """`preflight: true` is the defaults; `false` (or null) none."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


PreflightField = Annotated[Preflight | None, BeforeValidator(_switch), Field(description=(
    "try the job's setup and run on the cheapest CPU place before any GPU is rented: true, or "
    "{run, steps, timeout, accelerators}"))]


def trainer_env(preflight: Preflight) -> dict[str, str]:
    """What the pre-flight's trainer is told: it is one, how many steps to take,
    and (on a CPU) that no GPU is there to use."""
    env = {protocol.ENV_PREFLIGHT: "1", protocol.ENV_PREFLIGHT_STEPS: str(preflight.steps)}
    if preflight.accelerators is None:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def trial(spec: Any) -> Any:
    """The job spec the pre-flight is placed and launched with: the job's own
    (its code, envs, secrets, mounts, setup) with the pre-flight's run, one
    node, no deadline, and a CPU of SkyPilot's default shape, or the
    pre-flight's accelerators; kept to the job's `infra` where every
    resource set names the same (else to its cloud, where they share one),
    with the `disk_size` and `image_id` they all name (its setup may need them)."""
    pf: Preflight = spec.preflight
    want: dict[str, Any] = {"accelerators": pf.accelerators} if pf.accelerators else {}
    alternatives = spec.resources.alternatives()
    for key in ("disk_size", "image_id"):
        values = [getattr(a, key) for a in alternatives]
        if values[0] is not None and all(v == values[0] for v in values):
            want[key] = values[0]
    infras = {a.infra for a in alternatives}
    clouds = {Infra(i).cloud if i else None for i in infras}
    if not pf.accelerators and "k8s" in clouds:
        return _trial(spec, pf, want)  # the operator's clusters are priced GPUs: a CPU trial goes to the clouds
    if len(infras) == 1 and (infra := infras.pop()) is not None:
        want["infra"] = infra  # (a job kept to a region, or to the broker's host, tries out there)
    elif len(clouds) == 1 and (cloud := clouds.pop()) is not None:
        want["infra"] = cloud
    return _trial(spec, pf, want)


def _trial(spec: Any, pf: Preflight, want: dict[str, Any]) -> Any:
    return spec.model_copy(update={"run": pf.run or spec.run, "num_nodes": 1, "resources": Resources(**want),
                                   "deadline": None, "estimated_hours": None, "max_restarts": 0})


def wanted(job: Job, spec: JobSpec) -> bool:
    """Whether the job's next attempt is its pre-flight: it asks for one, and
    none has passed yet."""
    return spec.preflight is not None and not any(
        a.preflight and a.state == AttemptState.SUCCEEDED for a in job.attempts)
