"""Request bodies of the editor protocols, checked field by field (unknown fields are ignored, as llama.cpp does)."""

import json
from dataclasses import dataclass

from specdec import FIM_MODES, CompletionOptions, OptionsError
from specdec_server.errors import ApiError
from specdec_server.settings import Settings


def _options(**fields) -> CompletionOptions:
    try:
        return CompletionOptions(**fields)
    except OptionsError as err:
        raise ApiError(400, str(err)) from None


def parse_json(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {err.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise ApiError(400, f"malformed JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _get(body, name, kinds, default, *, none_ok=False):
    value = body.get(name, default)
    if value is None and (none_ok or default is None):
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise ApiError(400, f"'{name}' must be {_names(kinds)}", name)
    if not isinstance(value, kinds):
        raise ApiError(400, f"'{name}' must be {_names(kinds)}, not {type(value).__name__}", name)
    return value


def _names(kinds):
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _text(body, name, limit):
    value = _get(body, name, (str,), "")
    if len(value) > limit:
        raise ApiError(413, f"'{name}' has {len(value)} characters; the limit is {limit}", name)
    return value


def _stop_list(body, name="stop"):
    value = body.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 16:
        return tuple(value)
    raise ApiError(400, f"'{name}' must be a string or a list of at most 16 strings", name)


def _tokens(body, name, default, settings: Settings):
    value = _get(body, name, (int,), default)
    if value == -1:
        return settings.max_new_tokens
    if value < 0:
        raise ApiError(400, f"'{name}' must be >= 0 (or -1 for the server's limit)", name)
    if value > settings.max_new_tokens:
        raise ApiError(400, f"'{name}' is {value}; the limit is {settings.max_new_tokens}", name)
    return value


def _sampling(body, default_temperature: float, samplers_gate: bool):
    temperature = float(_get(body, "temperature", (int, float), default_temperature, none_ok=True))
    top_p = float(_get(body, "top_p", (int, float), 1.0, none_ok=True))
    top_k = _get(body, "top_k", (int,), 0, none_ok=True)
    if temperature < 0 or temperature > 5:
        raise ApiError(400, "'temperature' must be in [0, 5]", "temperature")
    if not 0 < top_p <= 1:
        raise ApiError(400, "'top_p' must be in (0, 1]", "top_p")
    if top_k < 0:
        raise ApiError(400, "'top_k' must be >= 0", "top_k")
    samplers = body.get("samplers")
    if samplers is not None and (not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers)):
        raise ApiError(400, "'samplers' must be a list of strings", "samplers")
    if samplers_gate and samplers is not None and "temperature" not in samplers:
        temperature = 0.0  # llama.vim's ["top_k", "top_p", "infill"] applies no temperature: deterministic
    return {"temperature": temperature, "top_p": top_p, "top_k": top_k if temperature > 0 else 0}


@dataclass(frozen=True)
class InfillRequest:
    """A parsed /infill body: the engine's options and how to answer."""

    options: CompletionOptions
    stream: bool
    response_fields: list | None  # only these keys in the answer; None: all
    slot: int  # llama.cpp's id_slot, -1 for any


@dataclass(frozen=True)
class CompletionsRequest:
    """A parsed /v1/completions body: the engine's options and how to answer."""

    options: CompletionOptions
    stream: bool
    model: str  # echoed in the answer


def infill_request(body: dict, settings: Settings) -> InfillRequest:
    """llama.cpp /infill -> the engine's CompletionOptions, plus response options."""
    prompt = _text(body, "prompt", settings.max_prompt_chars)
    prefix = _text(body, "input_prefix", settings.max_prompt_chars) + prompt
    if len(prefix) > settings.max_prompt_chars:
        raise ApiError(413, f"input_prefix + prompt exceed {settings.max_prompt_chars} characters", "input_prefix")
    extra = _extra(body, settings)
    n_indent = _get(body, "n_indent", (int,), 0, none_ok=True)
    t_max = _get(body, "t_max_predict_ms", (int, float), None, none_ok=True)
    if t_max is not None and t_max <= 0:
        t_max = None
    t_wait = _get(body, "t_max_prompt_ms", (int, float), None, none_ok=True)
    if t_wait is not None and t_wait <= 0:
        t_wait = None
    fields = body.get("response_fields")
    if fields is not None and (not isinstance(fields, list) or not all(isinstance(f, str) for f in fields)):
        raise ApiError(400, "'response_fields' must be a list of strings", "response_fields")
    options = _options(
        prefix=prefix, suffix=_text(body, "input_suffix", settings.max_suffix_chars), extra=extra,
        max_tokens=_tokens(body, "n_predict", 128, settings), n_indent=n_indent or None, stop=_stop_list(body),
        time_budget_ms=t_max, time_budget_after_newline=False, wait_budget_ms=t_wait,
        use_prompt_cache=_get(body, "cache_prompt", (bool,), True, none_ok=True),
        path=_get(body, "path", (str,), None, none_ok=True), context=_context(body), fim_mode=_fim_mode(body),
        prefetch=_get(body, "prefetch", (bool,), True, none_ok=True),
        ignore_eos=_get(body, "ignore_eos", (bool,), False, none_ok=True), **_sampling(body, 0.0, True),
    )
    stream = _get(body, "stream", (bool,), False, none_ok=True)
    slot = _get(body, "id_slot", (int,), -1, none_ok=True)
    if slot < -1:
        raise ApiError(400, "'id_slot' must be >= 0 (or -1 for any slot)", "id_slot")
    return InfillRequest(options, stream, fields, slot)


def _context(body) -> str:
    value = _get(body, "context", (str,), "auto", none_ok=True)
    if value not in ("auto", "none"):
        raise ApiError(400, "'context' must be \"auto\" (retrieve repository context) or \"none\"", "context")
    return value


def _fim_mode(body) -> str | None:
    value = _get(body, "fim_mode", (str,), None, none_ok=True)
    if value is not None and value not in FIM_MODES:
        raise ApiError(400, f"'fim_mode' must be one of {', '.join(FIM_MODES)} (or null for the model's)", "fim_mode")
    return value


def _extra(body, settings: Settings):
    chunks = body.get("input_extra") or []
    if not isinstance(chunks, list):
        raise ApiError(400, "'input_extra' must be a list of {filename, text}", "input_extra")
    if len(chunks) > settings.max_extra_chunks:
        raise ApiError(413, f"'input_extra' has {len(chunks)} chunks; the limit is {settings.max_extra_chunks}", "input_extra")
    out = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise ApiError(400, f"input_extra[{i}] must be an object with string 'filename' and 'text'", "input_extra")
        if len(chunk.get("text", "")) > settings.max_suffix_chars:
            raise ApiError(413, f"input_extra[{i}].text is too long", "input_extra")
        out.append((chunk.get("filename", ""), chunk.get("text", "")))
    return tuple(out)


def completions_request(body: dict, settings: Settings) -> CompletionsRequest:
    """OpenAI /v1/completions -> the engine's CompletionOptions, plus response options."""
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise ApiError(400, "'prompt' must be a string or a list of exactly one string", "prompt")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string", "prompt")
    if len(prompt) > settings.max_prompt_chars:
        raise ApiError(413, f"'prompt' has {len(prompt)} characters; the limit is {settings.max_prompt_chars}", "prompt")
    n = _get(body, "n", (int,), 1, none_ok=True)
    if n != 1:
        raise ApiError(400, "only n = 1 is supported", "n")
    suffix = body.get("suffix") or ""
    if not isinstance(suffix, str):
        raise ApiError(400, "'suffix' must be a string", "suffix")
    if len(suffix) > settings.max_suffix_chars:
        raise ApiError(413, f"'suffix' has {len(suffix)} characters; the limit is {settings.max_suffix_chars}", "suffix")
    model = _get(body, "model", (str,), settings.model_name, none_ok=True)
    options = _options(prefix=prompt, suffix=suffix, max_tokens=_tokens(body, "max_tokens", 16, settings),
                       stop=_stop_list(body), seed=_get(body, "seed", (int,), 0, none_ok=True),
                       context=_context(body), fim_mode=_fim_mode(body),
                       prefetch=_get(body, "prefetch", (bool,), True, none_ok=True),
                       ignore_eos=_get(body, "ignore_eos", (bool,), False, none_ok=True), **_sampling(body, 0.0, False))
    return CompletionsRequest(options, _get(body, "stream", (bool,), False, none_ok=True), model)
