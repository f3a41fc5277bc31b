"""Request-body schemas in the OpenAPI document the app serves.

The routes read their bodies themselves (size limit first, then field-by-field checks with
errors that name the field, as llama.cpp's clients expect), so FastAPI cannot infer these. They
are written here, with the server's own limits, for clients and for fuzzing (schemathesis).
"""

from specdec import FIM_MODES
from specdec_server.settings import Settings


def _string(limit: int) -> dict:
    return {"type": "string", "maxLength": limit}


def request_bodies(settings: Settings) -> dict:
    """{path: JSON schema of its POST body}."""
    text, suffix = _string(settings.max_prompt_chars), _string(settings.max_suffix_chars)
    stop = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}]}
    sampling = {"temperature": {"type": "number", "minimum": 0, "maximum": 5},
                "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "top_k": {"type": "integer", "minimum": 0}, "stream": {"type": "boolean"},
                "ignore_eos": {"type": "boolean"},
                "context": {"enum": ["auto", "none"]}, "fim_mode": {"enum": [*FIM_MODES, None]}, "stop": stop}
    chunk = {"type": "object", "properties": {"filename": {"type": "string"}, "text": suffix}}
    infill = {"type": "object", "properties": {
        "input_prefix": text, "input_suffix": suffix, "prompt": text,
        "input_extra": {"type": "array", "items": chunk, "maxItems": settings.max_extra_chunks},
        "n_predict": {"type": "integer", "minimum": -1, "maximum": settings.max_new_tokens},
        "t_max_predict_ms": {"type": "number"}, "t_max_prompt_ms": {"type": "number"}, "n_indent": {"type": "integer", "minimum": 0},
        "samplers": {"type": "array", "items": {"type": "string"}}, "cache_prompt": {"type": "boolean"},
        "path": {"type": "string"}, "response_fields": {"type": "array", "items": {"type": "string"}},
        "id_slot": {"type": "integer", "minimum": -1}, **sampling}}
    completions = {"type": "object", "properties": {
        "prompt": {"oneOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": 1}]},
        "suffix": suffix, "model": {"type": "string"}, "n": {"enum": [1]}, "seed": {"type": "integer"},
        "max_tokens": {"type": "integer", "minimum": -1, "maximum": settings.max_new_tokens}, **sampling}}
    file_edit = {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string"}, "text": _string(settings.max_index_file_bytes), "deleted": {"type": "boolean"}}}
    return {
        "/infill": infill,
        "/v1/completions": completions,
        "/v1/index": {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}},
        "/v1/index/files": {"type": "object", "required": ["files"], "properties": {
            "files": {"type": "array", "items": file_edit, "minItems": 1}}},
    }


def install(app, settings: Settings) -> None:
    """Serve the request bodies' schemas in /openapi.json."""
    plain = app.openapi

    def openapi():
        if app.openapi_schema is None:
            schema = plain()
            for path, body in request_bodies(settings).items():
                operation = schema["paths"].get(path, {}).get("post")
                if operation is not None:
                    operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
