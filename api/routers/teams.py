"""Teams and tokens (admin token; a team may rotate its own), and who-am-I
(any token)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from sqlalchemy import select

from spotbroker.api.deps import Admin, CurrentTeam, SessionDep
from spotbroker.api.errors import Problem, invalid, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.api.routers.costs import Caller, may_read
from spotbroker.api.schemas import PolicyOut, TeamCreate, TeamOut, TokenOut, TokensRevoked
from spotbroker.broker import auth
from spotbroker.broker.money.hardcap import release_held
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Team
from spotbroker.broker.teampolicy import policy as policies

router = APIRouter(prefix="/v1", tags=["teams"], route_class=JSONBodyRoute)


TeamName = Annotated[str, Path(pattern=auth.TEAM_NAME_RE.pattern)]


@router.post("/teams", status_code=201, response_model=TokenOut, responses=responses(401, 403, 409, 422))
def create_team(request: Request, response: Response, body: TeamCreate, _: Admin) -> TokenOut:
    """Create a team; the answer holds its first token (shown once)."""
    shown_once(response)
    with transaction(request.app.state.session_factory) as session:
        try:
            team, token = auth.create_team(session, body.name, clock=request.app.state.clock)
        except auth.TeamExists as exc:
            raise Problem(409, "Conflict", str(exc)) from None
        except ValueError as exc:
            raise Problem(422, "Invalid request", str(exc), errors=[{"field": "name", "message": str(exc)}]) from None
    return TokenOut(team=team.name, token=token)


@router.get("/teams", response_model=list[TeamOut], responses=responses(401, 403))
def list_teams(session: SessionDep, _: Admin) -> list[TeamOut]:
    return [TeamOut(id=t.id, name=t.name, created_at=t.created_at)
            for t in session.scalars(select(Team).order_by(Team.id))]


@router.post("/teams/{name}/tokens", status_code=201, response_model=TokenOut,
             responses=responses(401, 403, 404, 422))
def create_token(request: Request, response: Response, name: TeamName, _: Admin) -> TokenOut:
    """Another token for a team (the old ones stay valid)."""
    shown_once(response)
    with transaction(request.app.state.session_factory) as session:
        team = session.scalar(select(Team).where(Team.name == name))
        if team is None:
            raise Problem(404, "Not found", f"no team {name!r}")
        token = auth.create_token(session, team, name="api", clock=request.app.state.clock)
    return TokenOut(team=team.name, token=token)


def shown_once(response: Response) -> None:
    """An answer holding a token in the clear: no cache (a proxy's, a browser's) may keep it."""
    response.headers["Cache-Control"] = "no-store"


def _team(session, name: str) -> Team:
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise Problem(404, "Not found", f"no team {name!r}")
    return team


@router.post("/teams/{name}/tokens/rotate", status_code=201, response_model=TokenOut,
             responses=responses(401, 403, 404, 422, s403="A team's token naming another team"))
def rotate_tokens(request: Request, response: Response, name: TeamName, principal: Caller) -> TokenOut:
    """Replace every token of the team by one new one (shown once); the old
    ones stop working at once. The admin's token, or the team's own (a team
    that still holds its token may replace it, e.g. after a leak)."""
    shown_once(response)
    may_read(principal, name)
    with transaction(request.app.state.session_factory) as session:
        team = _team(session, name)
        token = auth.rotate_tokens(session, team, clock=request.app.state.clock)
    request.app.state.tokens.forget_team(team.id)
    return TokenOut(team=team.name, token=token)


@router.post("/teams/{name}/tokens/revoke", response_model=TokensRevoked,
             responses=responses(401, 403, 404, 422))
def revoke_tokens(request: Request, name: TeamName, _: Admin) -> TokensRevoked:
    """Revoke every token of the team: it has none that works until the
    admin rotates (its jobs keep running; only API access ends)."""
    with transaction(request.app.state.session_factory) as session:
        team = _team(session, name)
        count = auth.revoke_tokens(session, team, clock=request.app.state.clock)
    request.app.state.tokens.forget_team(team.id)
    return TokensRevoked(team=team.name, revoked=count)


def _policy_out(team: Team, policy: policies.Policy) -> PolicyOut:
    return PolicyOut.model_validate({**policy.shown(), "team": team.name})


@router.put("/teams/{name}/policy", response_model=PolicyOut, response_model_exclude_none=True,
            responses=responses(401, 403, 404, 422))
def put_policy(request: Request, name: TeamName, body: policies.Policy, _: Admin) -> PolicyOut:
    """Set the team's defaults and limits (the whole document: a key left out
    is no default, no limit). Jobs submitted from now on meet them; a job
    that already runs is never stopped for a lowered limit, its next attempt
    is held with the reason."""
    state = request.app.state
    if body.allowed_accelerators and (unknown := state.accelerators.unknown_names(body.allowed_accelerators,
                                                                                  "allowed_accelerators")):
        raise invalid(unknown)
    with transaction(state.session_factory) as session:
        team = _team(session, name)
        policies.put(session, team.id, body, clock=state.clock)
        release_held(session, team.id, state.clock.now())  # a raised limit releases what it held
    state.reconciler.hint()
    return _policy_out(team, body)


@router.get("/teams/{name}/policy", response_model=PolicyOut, response_model_exclude_none=True,
            responses=responses(401, 403, 404, 422, s403="A team's token naming another team"))
def get_policy(session: SessionDep, name: TeamName, principal: Caller) -> PolicyOut:
    """The team's defaults and limits: the admin's token, or the team's own."""
    may_read(principal, name)
    team = _team(session, name)
    return _policy_out(team, policies.get(session, team.id))


@router.get("/whoami", response_model=TeamOut, responses=responses(401, 403))
def whoami(session: SessionDep, team: CurrentTeam) -> TeamOut:
    row = session.get(Team, team.team_id)
    return TeamOut(id=row.id, name=row.name, created_at=row.created_at)
