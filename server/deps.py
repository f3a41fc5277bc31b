"""Dependencies shared by the routers, as Annotated aliases."""

from typing import Annotated

from fastapi import Depends, Request

from specdec_server.errors import ApiError
from specdec_server.schemas import parse_json
from specdec_server.state import AppState


def get_state(request: Request) -> AppState:
    return request.app.state.specdec


async def json_body(request: Request) -> dict:
    limit = request.app.state.specdec.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


StateDep = Annotated[AppState, Depends(get_state)]
BodyDep = Annotated[dict, Depends(json_body)]
