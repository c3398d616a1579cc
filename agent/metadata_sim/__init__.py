"""A metadata-service simulator that speaks AWS, GCP and Azure as documented.

One small stdlib HTTP server plays one cloud's instance metadata service:

* **aws** — IMDSv2: `PUT /latest/api/token` with
  `X-aws-ec2-metadata-token-ttl-seconds` (400 without it or out of 1..21600),
  reads need `X-aws-ec2-metadata-token` (401 without, or with an unknown or
  expired one); `spot/instance-action` and
  `events/recommendations/rebalance` answer 404 until the notice.
* **gcp** — everything under `/computeMetadata/v1/` needs
  `Metadata-Flavor: Google` (403 without); `instance/preempted` turns from
  `FALSE` to `TRUE`, `instance/maintenance-event` from `NONE`; answers carry
  an `ETag`, and `?wait_for_change=true&last_etag=...&timeout_sec=...`
  long-polls until the value changes.
* **azure** — Scheduled Events at `/metadata/scheduledevents?api-version=...`
  need `Metadata: true` (400 without); a `Preempt` event appears with its
  `NotBefore`; `DocumentIncarnation` grows on every change; a `POST` of
  `StartRequests` acknowledges an event, which then starts.

A notice comes after a delay, at a given time, or on command: the Python API
(`preempt()`, `rebalance()`, `maintenance()`) or the control endpoints under
`/_sim/` (`POST /_sim/preempt {"notice_seconds": N}`, ...). The notice window
(notice → the cloud's hard stop) is the cloud's own unless given. Given a
control token, the `/_sim/` endpoints need it (`X-Sim-Token`): the local
launcher's simulators take orders from the broker only. Fault
modes (`garbage`, `500`, `hang`) let tests check that a watcher survives.

Run it alone: `python -m spotbroker.agent.metadata_sim --cloud aws --port 0`
prints its URL; or embed it: `with MetadataSimulator("gcp") as sim: sim.url`.
Standard library only, so the local launcher can start one per attempt.

Its modules: ``instance`` (the simulated instance: its state, the triggers, the
fault modes and the ``/_sim/`` control endpoints), one per cloud's protocol
(``aws``, ``gcp``, ``azure``), ``server`` (the HTTP server and its replies)
and ``cli`` (``python -m spotbroker.agent.metadata_sim``).
"""
from spotbroker.agent.metadata_sim.instance import MetadataSimulator

__all__ = ["MetadataSimulator"]
