"""Errors as `application/problem+json` (RFC 9457), each naming the field or
the reason, so a client can show the user what to fix."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM = "application/problem+json"


class Problem(Exception):
    def __init__(self, status: int, title: str, detail: str, *, errors: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status, self.title, self.detail = status, title, detail
        self.errors, self.headers = errors, headers


def problem_response(status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def field_errors(errors: list[dict[str, Any]], drop_prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Pydantic errors as [{"field": "resources.accelerators", "message": ...}]."""
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in drop_prefix]
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        out.append({"field": ".".join(loc) or "body", "message": message})
    return out


def invalid(errors: list[dict[str, Any]]) -> Problem:
    names = ", ".join(dict.fromkeys(e["field"] for e in errors))
    return Problem(422, "Invalid request", f"invalid field(s): {names}", errors=errors)


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.title, exc.detail, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        p = invalid(field_errors(list(exc.errors()), drop_prefix=("body", "query", "path")))
        return problem_response(p.status, p.title, p.detail, p.errors)

    @app.exception_handler(ValidationError)
    async def _model_invalid(_: Request, exc: ValidationError) -> JSONResponse:
        p = invalid(field_errors(exc.errors()))
        return problem_response(p.status, p.title, p.detail, p.errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem_response(exc.status_code, _TITLES.get(exc.status_code, "Error"), str(exc.detail),
                                headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        import logging

        logging.getLogger("spotbroker.api").exception("unhandled error")
        return problem_response(500, "Internal error", "the server failed; see its log")


_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
           405: "Method not allowed", 409: "Conflict", 413: "Payload too large",
           415: "Unsupported media type", 422: "Invalid request", 503: "Unavailable"}
