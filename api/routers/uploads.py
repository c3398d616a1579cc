"""Uploads: a job's workdir, sent before the job that runs in it.

    PUT /v1/uploads/{sha256}    the archive (a gzipped tar) as the body
    GET /v1/uploads/{sha256}    whether the team has it already

The body is hashed while it streams in and refused unless it hashes to the
name it was sent under; the broker stores it under the caller's team (the
client never names a path). A job then refers to it: `workdir: {upload: SHA256}`.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path as FsPath
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from spotbroker.agent.code import MAX_ARCHIVE_BYTES, MAX_FILES_BYTES
from spotbroker.api.deps import CurrentTeam
from spotbroker.api.errors import Problem, invalid, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.broker.jobs import uploads

router = APIRouter(prefix="/v1/uploads", tags=["uploads"], route_class=JSONBodyRoute)
# Archives checked at once per server process: a check is pure Python holding
# the GIL (seconds for 100,000 members); the others wait without a thread.
ARCHIVE_CHECKS = 2
BODY_IDLE_S = 60.0  # the longest a body may stop coming before the upload is given up (408)

Sha256 = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="sha256 of the archive, lower-case hex")]


class UploadOut(BaseModel):
    sha256: str
    bytes: int


@router.put("/{sha256}", status_code=201, response_model=UploadOut, responses=responses(
    400, 401, 403, 408, 413, 422, s413=f"Over {MAX_ARCHIVE_BYTES} bytes, or over the team's upload quota",
    s408=f"The body stopped coming for {BODY_IDLE_S:g} s",
    s422="Not the sha256 of the body, or not an archive a node would unpack"),
    openapi_extra={"requestBody": {"required": True, "description": (
        "A gzipped tar of the workdir: regular files, directories and links that stay inside it; "
        f"at most {MAX_ARCHIVE_BYTES} bytes, and its files at most {MAX_FILES_BYTES} unpacked."),
        "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def put_upload(request: Request, sha256: Sha256, team: CurrentTeam) -> UploadOut:
    """Upload a job's workdir. Idempotent: the same bytes under the same
    hash are stored once, and a job submitted with `workdir: {upload: SHA256}`
    runs in a fresh copy of them on every attempt."""
    state = request.app.state
    usage = await run_in_threadpool(uploads.quota_usage, state.settings, state.session_factory, team.team_id,
                                    team.team_name, sha256)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > MAX_ARCHIVE_BYTES:
            raise _too_large()
        if over := uploads.over_quota(usage, int(declared)):  # before a byte is read: it costs no disk
            raise Problem(413, "Payload too large", over)
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=".tar.gz", dir=state.receiving_dir)
    path = FsPath(name)
    try:
        digest, received = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            async for chunk in _body(request):
                received += len(chunk)
                if received > MAX_ARCHIVE_BYTES:
                    raise _too_large()
                if over := uploads.over_quota(usage, received):  # a streamed body: stopped where it passes
                    raise Problem(413, "Payload too large", over)
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise invalid([{"field": "sha256", "message": (
                f"the body ({received} bytes) hashes to {digest.hexdigest()}, not to the name it was sent under")}])
        if await run_in_threadpool(uploads.size, state.settings, team.team_name, sha256) is not None:
            return UploadOut(sha256=sha256, bytes=received)  # these very bytes, checked when first stored
        limiter = getattr(state, "upload_limiter", None)
        if limiter is None:  # made in the app's own event loop, which it belongs to
            limiter = state.upload_limiter = anyio.CapacityLimiter(ARCHIVE_CHECKS)
        try:  # one check at a time per team: a team's big archives cannot take every slot from the others
            async with state.upload_turns.turn(team.team_id):
                await anyio.to_thread.run_sync(uploads.store, state.settings, state.session_factory, team.team_id,
                                               team.team_name, sha256, path, state.clock, limiter=limiter)
        except uploads.UploadInvalid as exc:
            raise invalid([{"field": "body", "message": str(exc)}]) from None
        except uploads.QuotaExceeded as exc:
            raise Problem(413, "Payload too large", str(exc)) from None
    finally:
        path.unlink(missing_ok=True)
    return UploadOut(sha256=sha256, bytes=received)


@router.get("/{sha256}", response_model=UploadOut, responses=responses(
    401, 403, 404, 422, s404="The team has no such upload"))
async def get_upload(request: Request, sha256: Sha256, team: CurrentTeam) -> UploadOut:
    """Whether the caller's team has this upload (a client skips sending it again)."""
    found = await run_in_threadpool(uploads.size, request.app.state.settings, team.team_name, sha256)
    if found is None:
        raise Problem(404, "Not found", f"your team has no upload {sha256}")
    return UploadOut(sha256=sha256, bytes=found)


async def _body(request: Request):
    """The body's chunks; a client that goes before it has sent them all gets
    a 400 (which it will not read) instead of a traceback in the log, and one
    that stops sending for BODY_IDLE_S a 408: a stalled upload holds a file
    of the broker's temporary disk."""
    chunks = request.stream().__aiter__()
    while True:
        try:
            with anyio.fail_after(BODY_IDLE_S):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise Problem(408, "Request timeout", f"no part of the body came for {BODY_IDLE_S:g} s") from None
        except ClientDisconnect:
            raise Problem(400, "Bad request", "the client went away before the body was complete") from None
        yield chunk


def _too_large() -> Problem:
    return Problem(413, "Payload too large", f"an upload is at most {MAX_ARCHIVE_BYTES} bytes: "
                   "leave out what the job does not need (.skyignore, .gitignore)")
