"""Preemption-notice watchers: one small monitor per source, in its own thread.

Modelled on the AWS Node Termination Handler: each source is polled on its
own short ticker with short timeouts; failures (garbage, 5xx, hangs,
refused connections) are logged and retried with jittered exponential
back-off, never raised; an event is reported once (de-duplicated by its
content, or by Azure's EventId).

Sources:

* AWS IMDSv2 — `spot/instance-action` (the 2-minute notice) and
  `events/recommendations/rebalance`; one session token shared by both,
  refreshed before it expires and fetched again on a 401; 404 = nothing yet.
* GCP — `instance/preempted` and `instance/maintenance-event`, long-polled
  with `wait_for_change=true` and the last ETag.
* Azure Scheduled Events — a `Preempt` (or `Terminate`) event for this VM;
  `Watchers.acknowledge()` POSTs `StartRequests` once the flush is committed.

The base URL of every source is configurable (`SPOTBROKER_METADATA_URL`), so
`spotbroker.agent.metadata_sim` can stand in for the cloud.

Its modules: ``watcher`` (the notice, the timing, the polling thread every
watcher is), one per cloud (``aws``, ``gcp``, ``azure``), and ``watchers`` (a
cloud's set of watchers; which cloud the node is on).
"""
from spotbroker.agent.notices.watcher import (
    DRAIN,
    MAINTENANCE,
    PREEMPTION,
    REBALANCE,
    MetadataError,
    Notice,
    WatchConfig,
    drain_notice,
)
from spotbroker.agent.notices.watchers import CLOUDS, Watchers, build_watchers, detect_cloud, resolve_cloud

__all__ = [
    "CLOUDS", "DRAIN", "MAINTENANCE", "PREEMPTION", "REBALANCE", "MetadataError", "Notice", "WatchConfig",
    "Watchers", "build_watchers", "detect_cloud", "drain_notice", "resolve_cloud",
]
