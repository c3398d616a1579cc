"""Errors as `application/problem+json` (RFC 9457), each naming the field or
the reason, so a client can show the user what to fix."""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from spotbroker.api.guard import DATABASE_DOWN, BodyTooLarge, BodyTooSlow
from spotbroker.broker.jobs.specdoc import SpecShapeError, SpecSyntaxError, field_errors
from spotbroker.broker.store.db import driver_said

PROBLEM = "application/problem+json"
log = logging.getLogger("spotbroker.api")


class Problem(Exception):
    def __init__(self, status: int, title: str, detail: str, *, errors: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status, self.title, self.detail = status, title, detail
        self.errors, self.headers = errors, headers


class FieldError(BaseModel):
    field: str = Field(description="the field, dotted from the body's top (`resources.accelerators`), "
                                   "or a parameter's name, or `body`")
    message: str
    line: int | None = Field(None, description="for a YAML/JSON syntax error: the line (1-based)")


class ProblemDoc(BaseModel):
    """Every error answer: RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] | None = Field(None, description="each wrong field, on a 422")


_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
           405: "Method not allowed", 408: "Request timeout", 409: "Conflict", 410: "Gone", 413: "Payload too large",
           415: "Unsupported media type", 422: "Invalid request", 429: "Too many requests",
           500: "Internal error", 503: "Unavailable"}

_MEANINGS = {
    400: "The request could not be read",
    401: "No token, or an unknown or revoked one",
    403: "The token is valid but not for this (a team token on an admin route, or the admin token on a team's)",
    404: "No such thing for this caller",
    409: "The request conflicts with the current state",
    413: "The body is too large",
    415: "The body's content type is not one this route reads",
    422: "A field or parameter is invalid; `errors` names each",
    429: "Too many at once for this team; retry after `Retry-After` seconds",
    503: "The broker's database did not answer; retry after `Retry-After` seconds",
}


def responses(*statuses: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for a route's error answers, all problem documents:
    `responses(401, 403, 404)`, with `s409="why"` to say more for one. Every
    route may answer 503 while the database does not (the README says so to
    a client): it is declared on each."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in dict.fromkeys((*statuses, 503)):
        text = described.get(f"s{status}", _MEANINGS.get(status, _TITLES.get(status, "Error")))
        out[status] = {"description": text,
                       "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/ProblemDoc"}}}}
    return out


def problem_response(status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def invalid(errors: list[dict[str, Any]]) -> Problem:
    names = ", ".join(dict.fromkeys(e["field"] for e in errors))
    return Problem(422, "Invalid request", f"invalid field(s): {names}", errors=errors)


def install(app: FastAPI) -> None:
    """Exception handlers for what routes raise. Anything else is answered
    by `api.guard.Guard` (a 500 that keeps the connection usable)."""

    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.title, exc.detail, exc.errors, exc.headers)

    @app.exception_handler(OperationalError)
    async def _database_unreachable(request: Request, exc: OperationalError) -> JSONResponse:
        # (no connection to be had, one dropped mid-request, SQLite busy past its timeout): the
        # client may try again; one line in the log, not a traceback a request while it lasts
        log.warning("%s %s: the database did not answer: %s", request.method, request.url.path, driver_said(exc))
        return problem_response(503, _TITLES[503], DATABASE_DOWN,
                                headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        p = invalid(field_errors(list(exc.errors()), drop_prefix=("body", "query", "path", "header")))
        return problem_response(p.status, p.title, p.detail, p.errors)

    @app.exception_handler(ValidationError)
    async def _model_invalid(_: Request, exc: ValidationError) -> JSONResponse:
        p = invalid(field_errors(exc.errors()))
        return problem_response(p.status, p.title, p.detail, p.errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own body parsing turns any failure into a 400: say what it was.
        cause = exc.__cause__
        if isinstance(cause, BodyTooLarge):  # the rest of the body is unread: close after
            return problem_response(413, _TITLES[413], str(cause), headers={"Connection": "close"})
        if isinstance(cause, BodyTooSlow):
            return problem_response(408, _TITLES[408], str(cause), headers={"Connection": "close"})
        if isinstance(cause, SpecShapeError):  # a key given twice (api.jsonbody), nested too deeply
            p = invalid([{"field": cause.field, "message": cause.detail}])
            return problem_response(p.status, p.title, p.detail, p.errors)
        if isinstance(cause, SpecSyntaxError):
            p = invalid([{"field": "body", "message": f"not readable JSON: {cause.message}"[:200],
                          **({"line": cause.line} if cause.line else {})}])
            return problem_response(p.status, p.title, p.detail, p.errors)
        if isinstance(cause, RecursionError | ValueError):  # too deep, not UTF-8, a number too long
            message = "nested too deeply" if isinstance(cause, RecursionError) else f"not readable JSON: {cause}"
            p = invalid([{"field": "body", "message": message[:200]}])
            return problem_response(p.status, p.title, p.detail, p.errors)
        return problem_response(exc.status_code, _TITLES.get(exc.status_code, "Error"), str(exc.detail),
                                headers=getattr(exc, "headers", None))
