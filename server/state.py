"""AppState: what the routers share, kept on the FastAPI app (app.state.specdec)."""

import time
from dataclasses import dataclass, field

from specdec import Engine
from specdec_server.bridge import EngineBridge
from specdec_server.metrics import Metrics
from specdec_server.settings import Settings


@dataclass
class AppState:
    settings: Settings
    engine: Engine | None = None  # loaded at startup when not given
    bridge: EngineBridge | None = None  # made at startup, over the engine
    metrics: Metrics = field(default_factory=Metrics)
    index_status: dict = field(default_factory=lambda: {"state": "none"})
    started: float = field(default_factory=time.time)
