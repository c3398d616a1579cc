"""JSON bodies read as a job's document is read (`specdoc.load_json`): a key
given twice is refused, naming the field, where `json.loads` would keep the
last one silently (`{"monthly_usd": 10, "monthly_usd": 10000}`). Every
router is built with `route_class=JSONBodyRoute`."""
from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from spotbroker.broker.jobs.specdoc import decode, load_json


class JSONBodyRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = load_json(decode(await self.body()))
        return self._json


class JSONBodyRoute(APIRoute):
    """FastAPI's route with `JSONBodyRequest` for its body. What `json()`
    raises reaches `api.errors` as the cause of FastAPI's 400, which answers
    it as a 422 naming the field (or the line)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def with_json_body(request: Request) -> Response:
            return await handler(JSONBodyRequest(request.scope, request.receive))

        return with_json_body
