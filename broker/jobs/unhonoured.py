"""What of a SkyPilot task file the broker honours, and for each field it
cannot, what to do instead: a refusal always names the way out."""
from __future__ import annotations

from spotbroker.broker.jobs import resfields

OURS = ("estimated_hours", "deadline", "max_restarts", "early_stop", "checkpoint", "preflight",
        "carbon_price_per_tonne")
HONOURED = frozenset({"name", "resources", "num_nodes", "envs", "secrets", "setup", "run", "workdir",
                      "file_mounts", *OURS})
HONOURED_RESOURCES = frozenset({"accelerators", "any_of", "ordered", "use_spot", "infra", "cloud", "region",
                                "zone", "cpus", "memory", "disk_size", "instance_type", "image_id",
                                *resfields.PASSED})

# Taken and dropped with a warning, as SkyPilot's `sky launch` drops them.
IGNORED = {
    "service": "ignored, as `sky launch` ignores it: the job runs its `run` (the server) until it ends or is "
               "cancelled, on one place, with no endpoint or replicas; to serve, use `sky serve up`",
}
_TOP = {
    "config": "SkyPilot's settings are the broker operator's (its ~/.sky/config.yaml): ask them, and drop config",
    "volumes": "give the data as a file mount of a storage URI (file_mounts: {/data: s3://BUCKET/PATH})",
    "volume_mounts": "give the data as a file mount of a storage URI (file_mounts: {/data: s3://BUCKET/PATH})",
    "event_callback": "follow the job's events instead: `spotbroker job ID` or GET /v1/jobs/{id}/events",
    "pool": "spotbroker places each job itself: drop pool",
    "inputs": "an optimizer hint spotbroker does not use: drop it (placement weighs estimated_hours)",
    "outputs": "an optimizer hint spotbroker does not use: drop it (placement weighs estimated_hours)",
    "managed_secrets": "give each secret's value at submission: `spotbroker submit --secret NAME FILE`",
}
_RESOURCES = {
    "job_recovery": "spotbroker recovers a preempted job itself; set max_restarts (top level) for restarts "
                    "after a failure",
    "spot_recovery": "spotbroker recovers a preempted job itself; set max_restarts (top level) for restarts "
                     "after a failure",
    "autostop": "the broker takes the node down when the job ends: drop autostop",
    "accelerator_args": "spotbroker places no TPUs: drop accelerator_args and ask for a GPU",
    "local_disk": "name an instance_type that has local disks instead (or use disk_size)",
    "priority": "a scheduling priority spotbroker's places do not take: drop it",
    "priority_class": "a scheduling priority spotbroker's places do not take: drop it",
    "ephemeral_storage": "use disk_size for the node's disk",
    "volumes": "give the data as a file mount of a storage URI (file_mounts: {/data: s3://BUCKET/PATH})",
}


def named(key: str, in_resources: bool) -> bool:
    """A field SkyPilot knows whose refusal says more than SkyPilot's schema
    would of what it holds (`config` with a typo inside is still `config`)."""
    return key in (_RESOURCES if in_resources else _TOP)


def why(key: str, in_resources: bool) -> str:
    """The refusal of a field SkyPilot knows and spotbroker cannot honour."""
    way_out = (_RESOURCES if in_resources else _TOP).get(key)
    if way_out is None:
        way_out = "drop it (docs/skypilot.md lists the fields spotbroker honours)"
    return f"SkyPilot knows it, but spotbroker cannot honour it: {way_out}"
