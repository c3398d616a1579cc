"""Finding the committed checkpoints under a prefix, and marking one to keep."""
from __future__ import annotations

import re
from datetime import UTC, datetime

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.format import KEEP_MARKER, CheckpointInfo
from spotbroker.agent.checkpoint.storage import Storage

_STEP_MANIFEST_RE = re.compile(r"(?:^|/)step-(\d{12})/" + re.escape(protocol.MANIFEST) + r"$")


def list_checkpoints(uri: str) -> list[CheckpointInfo]:
    """Committed checkpoints anywhere under ``uri`` (a job or attempt prefix), newest first.

    Committed means the manifest exists; the objects are not verified here
    (:meth:`Checkpointer.restore` does that). ``bytes`` sums the step's objects.
    """
    storage = Storage(uri)
    sizes: dict[str, int] = {}
    manifests: dict[str, tuple[int, datetime | None]] = {}
    for obj in storage.iter():
        directory, _, name = obj.key.rpartition("/")
        sizes[directory] = sizes.get(directory, 0) + obj.size
        match = _STEP_MANIFEST_RE.search(obj.key)
        if match:
            manifests[directory] = (int(match.group(1)), obj.last_modified)
    found = [
        CheckpointInfo(step=step, uri=storage.url(directory), bytes=sizes[directory], created_at=created)
        for directory, (step, created) in manifests.items()
    ]
    oldest = datetime.min.replace(tzinfo=UTC)
    found.sort(key=lambda c: (c.step, c.created_at or oldest), reverse=True)
    return found


def restore_candidates(search: str | None, resume_from: str | None) -> list[str]:
    """Checkpoint URIs to restore from, best first: `resume_from` (the broker's
    RESUME_FROM), then the others under `search` no newer than it."""
    found = list_checkpoints(search) if search else []
    if not resume_from:
        return [c.uri for c in found]
    resume = resume_from.rstrip("/")
    match = re.search(r"step-(\d{12})$", resume)
    ceiling = int(match.group(1)) if match else None
    older = [c.uri for c in found if c.uri != resume and (ceiling is None or c.step <= ceiling)]
    return [resume] + older


def mark_keep(checkpoint_uri: str) -> None:
    """Mark a checkpoint (its ``.../step-N`` URI) so that ``keep_last`` never deletes it."""
    Storage(checkpoint_uri).put(KEEP_MARKER, b"")
