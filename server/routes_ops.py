"""GET /health and GET /metrics."""

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from specdec_server.deps import StateDep

router = APIRouter()


@router.get("/health")
async def health(state: StateDep):
    """Liveness, and the state of the repository index."""
    return {"status": "ok", "model": state.settings.model_name, "index": dict(state.index_status),
            "queue_depth": state.engine.queue_depth(), "runtime": state.engine.runtime()}


@router.get("/metrics")
async def metrics(state: StateDep):
    """Prometheus text format."""
    text = state.metrics.render(state.engine.metrics())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
