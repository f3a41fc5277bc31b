"""A real uvicorn server on a loopback port, serving tiny real models and a real index."""

import threading
import time

import pytest
import uvicorn

from prefixcache import Index
from specdec import Engine, load_model
from specdec_server.main import create_app
from specdec_server.settings import Settings
from tests.helpers import free_port

REPO_FILES = {
    "pkg/store.py": "import redis\n\nclass Store:\n    def get(self, key):\n        return self.redis_client.get(key)\n",
    "pkg/util.py": "def helper(x):\n    return compute(x)\n",
}


class LiveServer:
    def __init__(self, app, engine, settings):
        self.engine, self.settings = engine, settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def models(tiny_models):
    return load_model(tiny_models[0]), load_model(tiny_models[1])


@pytest.fixture(scope="session")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("served_repo")
    for rel, text in REPO_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def make_server(models, repo, **overrides):
    target, draft = models
    engine = Engine(target, draft, Index.build(repo, workers=1))
    settings = Settings(repo=repo, index_roots=[repo.resolve()], max_new_tokens=512, max_body_bytes=100_000,
                        max_prompt_chars=20_000, max_suffix_chars=10_000, **overrides)
    return LiveServer(create_app(settings, engine), engine, settings)


@pytest.fixture(scope="module")
def live(models, repo):
    with make_server(models, repo) as server:
        yield server
