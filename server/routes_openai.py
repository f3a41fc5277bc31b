"""POST /v1/completions and GET /v1/models: OpenAI's completions protocol with `suffix` (FIM)."""

import json
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specdec_server.bridge import document_key
from specdec_server.deps import BodyDep, StateDep
from specdec_server.schemas import completions_request

router = APIRouter()


@router.get("/v1/models")
async def models(state: StateDep):
    """The one model this server runs."""
    return {"object": "list", "data": [{"id": state.settings.model_name, "object": "model",
                                        "created": int(state.started), "owned_by": "specdec"}]}


@router.post("/v1/completions")
async def completions(request: Request, state: StateDep, body: BodyDep):
    """Complete `prompt`, filling in before `suffix` when one is given."""
    parsed = completions_request(body, state.settings)
    if await request.is_disconnected():  # abandoned while queued in the server: skip the prompt work
        return Response(status_code=499)
    options, model = parsed.options, parsed.model
    options = options.with_changes(document=document_key(request.client.host if request.client else "-", options))
    meta = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": model}
    if parsed.stream:  # submitted before the stream starts: a refused request still gets its 4xx
        return StreamingResponse(_stream(state, state.bridge.start(options), meta), media_type="text/event-stream")
    result = await state.bridge.run(options, request)
    return JSONResponse({**meta, "choices": [_choice(result.text, _finish_reason(result))],
                         "usage": _usage(result), "speculation": result.stats.as_dict()})


def _choice(text: str, finish_reason):
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _finish_reason(result) -> str:
    return "length" if result.stats.stop_reason == "limit" else "stop"


def _usage(result) -> dict:
    prompt = result.stats.prefill_tokens + result.stats.cached_tokens
    completion = result.stats.generated_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _stream(state, handle, meta):
    """SSE: `data: {json}` events, then `data: [DONE]`; no comment lines (Continue stops at them)."""
    sent = ""
    try:
        async for delta in handle.deltas():
            yield f"data: {json.dumps({**meta, 'choices': [_choice(delta, None)]})}\n\n"
            sent += delta
        result = await state.bridge.finish(handle)
        rest = result.text[len(sent):] if result.text.startswith(sent) else ""
        final = {**meta, "choices": [_choice(rest, _finish_reason(result))], "usage": _usage(result)}
        yield f"data: {json.dumps(final)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        handle.cancel()
