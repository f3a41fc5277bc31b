"""The FastAPI app: middleware, routers, and the engine loaded in the lifespan (never at import)."""

import hmac
import logging
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from specdec_server import openapi, routes_index, routes_infill, routes_openai, routes_ops
from specdec_server.bridge import EngineBridge
from specdec_server.errors import ApiError
from specdec_server.indexing import build_and_attach
from specdec_server.longlived import freeze_what_is_loaded, return_freed_caches, unfreeze
from specdec_server.settings import Settings, context_settings
from specdec_server.state import AppState

log = logging.getLogger("specdec.server")
OPEN_PATHS = {"/health"}


def load_engine(settings: Settings, target_model=None):
    """The Engine the settings name (the embedded models by default); target_model: the target
    already loaded (an expert-parallel shard)."""
    from specdec import Engine

    return Engine.from_pretrained(settings.target, settings.draft, repo=settings.repo, target_model=target_model,
                                  fim_mode=settings.fim_mode, quantize=settings.quantize)


def create_app(settings: Settings, engine=None) -> FastAPI:
    """engine: a ready Engine (tests); None loads the models named in settings (or the embedded ones)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state.specdec
        if state.engine is None:
            state.engine = load_engine(settings)
        state.engine.set_limits(max_batch=settings.max_batch, max_queue=settings.max_queue)
        state.engine.set_prefetch(settings.prefetch)
        if settings.context_tokens is not None:
            state.engine.set_context(context_settings(settings.context_tokens))
        state.bridge = EngineBridge(state.engine, state.metrics)  # warms the engine up and starts its loop
        if settings.repo is not None and state.engine.index is None:
            threading.Thread(target=_build_index, args=(state,), daemon=True, name="index-build").start()
        elif state.engine.index is not None:
            state.index_status = {"state": "ready", "files": len(state.engine.index.files)}
        freeze_what_is_loaded()
        yield
        state.engine.stop()
        unfreeze()

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.state.specdec = AppState(settings, engine)
    app.add_middleware(AuthAndMetrics, state=app.state.specdec)
    _error_handlers(app)
    for router in (routes_infill.router, routes_openai.router, routes_index.router, routes_ops.router):
        app.include_router(router)
    openapi.install(app, settings)
    return app


def _build_index(state: AppState) -> None:
    state.index_status = {"state": "building", "repo": str(state.settings.repo)}
    try:
        idx = build_and_attach(state.settings.repo, lambda: state.engine)
    except Exception as err:  # the server keeps serving without the prefix cache
        log.exception("indexing failed")
        state.index_status = {"state": "failed", "error": str(err)}
        return
    state.index_status = {"state": "ready", **{k: idx.summary.get(k) for k in ("indexed", "units", "build_seconds")}}
    log.info("index ready: %s", state.index_status)


class AuthAndMetrics:
    """Pure ASGI middleware: the API key check and request metrics. (Starlette's
    BaseHTTPMiddleware spawns a task group per request, which under a keystroke-rate load of
    abandoned requests costs the event loop more than the request itself.)"""

    def __init__(self, app, state: AppState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 500}
        path = scope.get("path", "")
        key = self.state.settings.api_key
        if key and path not in OPEN_PATHS and not _authorized(scope, key):
            error = ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", kind="authentication_error")
            status["code"] = 401
            await error.response()(scope, receive, send)
        else:
            async def send_and_record(message):
                if message["type"] == "http.response.start":
                    status["code"] = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, send_and_record)
            except ClientDisconnect:  # gone while its body was read: nobody to answer
                status["code"] = 499
        self.state.metrics.observe_request(path, status["code"], (time.perf_counter() - started) * 1000)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request, err: ApiError):
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        field_name = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"error": {"message": first.get("msg", "invalid request"), "param": field_name,
                                       "type": "invalid_request_error", "code": 400}}, status_code=400)


def _authorized(scope, key: str) -> bool:
    header = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def serve(settings: Settings, engine=None) -> int:
    """specdec serve: run uvicorn on the settings' host and port (engine: one already loaded)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        log.warning("listening on %s without an API key: anyone who can reach it can use it", settings.host)
    return_freed_caches()  # the whole process serves: its heap must stay flat under a full prompt cache
    uvicorn.run(create_app(settings, engine), host=settings.host, port=settings.port, log_level="info")
    return 0
