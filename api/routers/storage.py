"""A team's storage: the bucket prefixes its jobs may mount besides its own
(broker/jobs/buckets.py). The admin sets the list; a team reads its own."""
from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from sqlalchemy import select

from spotbroker.api.deps import Admin, SessionDep
from spotbroker.api.errors import Problem, invalid, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.api.routers.costs import Caller, TeamName, may_read
from spotbroker.broker.jobs import buckets
from spotbroker.broker.jobs.mounts import team_prefix
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Team

router = APIRouter(prefix="/v1", tags=["teams"], route_class=JSONBodyRoute)


class BucketOut(BaseModel):
    uri: str = Field(description="a prefix: every mount under it is allowed")
    read_only: bool


class StorageOut(BaseModel):
    team: str
    own: str = Field(description="the team's own storage: its checkpoints, uploads and buckets by name "
                                 "(buckets/{name}/)")
    buckets: list[BucketOut] = Field(description="what else its jobs may mount")


def _out(request: Request, name: str, allow: list[buckets.Allowed]) -> StorageOut:
    return StorageOut(team=name, own=team_prefix(request.app.state.settings, name),
                      buckets=[BucketOut(uri=a.uri, read_only=a.read_only) for a in allow])


def _team(session, name: str) -> Team:
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise Problem(404, "Not found", f"no team {name!r}")
    return team


@router.get("/teams/{name}/storage", response_model=StorageOut, responses=responses(
    401, 403, 404, 422, s403="A team's token asking for another team"))
def get_storage(request: Request, session: SessionDep, principal: Caller, name: TeamName) -> StorageOut:
    """The buckets the team's jobs may mount."""
    may_read(principal, name)
    return _out(request, name, buckets.allowed(session, _team(session, name).id))


@router.put("/teams/{name}/storage", response_model=StorageOut, responses=responses(
    401, 403, 404, 422, s403="Only the admin sets a team's storage"))
def put_storage(request: Request, body: buckets.StorageIn, name: TeamName, _: Admin) -> StorageOut:
    """Replace the list of bucket prefixes the team's jobs may mount (and whether read-only)."""
    if problems := buckets.overlap_error(body.buckets, request.app.state.settings.checkpoint_uri):
        raise invalid(problems)
    with transaction(request.app.state.session_factory) as session:
        allow = buckets.replace(session, _team(session, name), body.buckets)
    return _out(request, name, allow)
