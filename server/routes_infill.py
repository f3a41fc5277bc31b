"""POST /infill: llama.cpp's fill-in-the-middle protocol, as llama.vim and llama.vscode speak it."""

import json
import math

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specdec_server.bridge import document_key, slot_key
from specdec_server.deps import BodyDep, StateDep
from specdec_server.schemas import infill_request

router = APIRouter()
STOP_TYPES = {"eos": "eos", "newline": "eos", "dedent": "eos", "suffix": "eos", "repeat": "eos", "limit": "limit", "time": "limit", "busy": "limit",
              "word": "word"}
SPECULATION_FIELDS = ("target_passes", "generated_tokens", "tau", "accepted_by_source", "prefill_tokens",
                      "cached_tokens", "prefill_ms", "decode_ms", "total_ms", "stop_reason", "context_chunks",
                      "context_tokens", "retrieval_ms", "tree_nodes", "experts_woken", "tokens_cap", "expected_wait_ms", "prefetched")


@router.post("/infill")
async def infill(request: Request, state: StateDep, body: BodyDep):
    """Complete the code between input_prefix + prompt and input_suffix."""
    parsed = infill_request(body, state.settings)
    if await request.is_disconnected():  # abandoned while queued in the server: skip the prompt work
        return Response(status_code=499)
    client = request.client.host if request.client else "-"
    options = parsed.options
    options = options.with_changes(document=document_key(client, options), slot=slot_key(client, parsed.slot))
    if parsed.stream:
        handle = state.bridge.start(options)
        return StreamingResponse(_stream(state, handle, options, parsed.response_fields),
                                 media_type="text/event-stream", headers=_retry_after(handle.busy_wait_ms()))
    result = await state.bridge.run(options, request)
    return JSONResponse(select_fields(infill_body(result, state, options), parsed.response_fields),
                        headers=_retry_after(result.stats.expected_wait_ms if result.stats.stop_reason == "busy" else None))


def _retry_after(expected_wait_ms: float | None) -> dict:
    """A request answered at once because the queue was longer than its budget says when to come back."""
    return {} if expected_wait_ms is None else {"Retry-After": str(max(1, math.ceil(expected_wait_ms / 1000)))}


async def _stream(state, handle, options, fields):
    sent = ""
    try:
        async for delta in handle.deltas():
            yield _sse({"content": delta, "tokens": [], "stop": False})
            sent += delta
        result = await state.bridge.finish(handle)
        final = infill_body(result, state, options)
        final["content"] = result.text[len(sent):] if result.text.startswith(sent) else result.text
        yield _sse(select_fields(final, fields))
    finally:
        handle.cancel()  # a closed stream (client gone) stops the generation at the next step


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def infill_body(result, state, options) -> dict:
    s = result.stats
    prompt_ms, predicted_ms = s.prefill_ms, s.decode_ms
    prompt_n, predicted_n = s.prefill_tokens, s.generated_tokens
    reason = s.stop_reason
    return {
        "content": result.text,
        "tokens": result.tokens,
        "stop": True,
        "stop_type": STOP_TYPES.get(reason, "none"),
        "stopping_word": s.stop_word,
        "model": state.settings.model_name,
        "tokens_cached": s.cached_tokens,
        "tokens_evaluated": prompt_n,
        "truncated": result.truncated,
        "timings": {
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1000 * predicted_n / predicted_ms if predicted_ms else 0.0,
        },
        "generation_settings": {"n_predict": s.tokens_cap or options.max_tokens, "temperature": options.temperature,
                                "top_k": options.top_k, "top_p": options.top_p, "n_indent": options.n_indent or 0},
        "speculation": {k: s[k] for k in SPECULATION_FIELDS},
    }


def select_fields(body: dict, fields) -> dict:
    """llama.cpp's response_fields: only these keys; "a/b" is flattened to a top-level "a/b" key."""
    if not fields:
        return body
    out = {}
    for field in fields:
        value = body
        for part in field.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if field and value is not None:
            out[field] = value
    return out
