"""Auth, limits, malformed input, cancellation, superseding and index updates."""

import contextlib
import os
import threading
import time

import httpx

from tests.server.conftest import make_server

# At the first column no dedent can end it; with ignore_eos it runs to its token limit unless cancelled.
LONG = {"input_prefix": "x = 1\n", "input_suffix": "", "prompt": "", "n_predict": 500, "samplers": [],
        "path": "pkg/long.py"}


def test_api_key(models, repo):
    with make_server(models, repo, api_key="s3cret") as live:
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert httpx.get(f"{live.url}/v1/models").status_code == 401
        bad = httpx.post(f"{live.url}/infill", json={"prompt": "x"}, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and "API key" in bad.json()["error"]["message"]
        ok = httpx.get(f"{live.url}/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_limits_name_the_field(live):
    r = httpx.post(f"{live.url}/infill", json={"prompt": "x", "n_predict": 100000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"
    r = httpx.post(f"{live.url}/infill", json={"prompt": "x" * 30_000})
    assert r.status_code == 413 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x", "suffix": "y" * 20_000})
    assert r.status_code == 413 and r.json()["error"]["param"] == "suffix"
    r = httpx.post(f"{live.url}/infill", content=b'{"prompt": "' + b"x" * 200_000 + b'"}')
    assert r.status_code == 413
    r = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x", "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_malformed_bodies(live):
    r = httpx.post(f"{live.url}/infill", content=b"{not json")
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/infill", content=b'{"prompt": "\xff\xfe"}')
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/infill", json={"prompt": "x", "n_predict": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"
    r = httpx.post(f"{live.url}/infill", json=["a list"])
    assert r.status_code == 400
    r = httpx.post(f"{live.url}/v1/completions", json={"prompt": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(f"{live.url}/infill", json={"prompt": "x", "temperature": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(f"{live.url}/infill", json={"prompt": "x", "ignore_eos": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ignore_eos"


def test_queue_full_is_429(models, repo):
    with make_server(models, repo, max_queue=0) as live:
        r = httpx.post(f"{live.url}/infill", json={"prompt": "x"})
        assert r.status_code == 429


def _wait_idle(engine, seconds=10):
    deadline = time.time() + seconds
    while engine.metrics().queue_depth and time.time() < deadline:
        time.sleep(0.01)
    return engine.metrics().queue_depth == 0


@contextlib.contextmanager
def _eager_steps(engine):
    """The tiny models' native step writes LONG's 500 tokens in tens of milliseconds, which can
    end a request before the test's next move lands; eager steps keep it running for seconds."""
    models = (engine.target, engine.draft)
    bound = [model.native_step for model in models]
    for model in models:
        model.native_step = None
    try:
        yield
    finally:
        for model, native_step in zip(models, bound, strict=True):
            model.native_step = native_step


def test_disconnected_stream_stops_generating(live):
    # ignore_eos: the tiny model's own end-of-generation token cannot end it before the disconnect does
    body = dict(LONG, stream=True, path="pkg/cancel.py", ignore_eos=True)
    with _eager_steps(live.engine), httpx.stream("POST", f"{live.url}/infill", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first event: the client hangs up
    assert _wait_idle(live.engine)
    record = next(e for e in reversed(live.engine.metrics().recent) if e.document and "cancel.py" in e.document)
    reason, tokens = record.stop_reason, record.tokens
    assert reason == "cancelled" and tokens < 500


def test_newer_request_supersedes_older(live):
    results = {}
    body = dict(LONG, ignore_eos=True)

    def first():
        results["first"] = httpx.post(f"{live.url}/infill", json=body, timeout=60).json()

    with _eager_steps(live.engine):
        thread = threading.Thread(target=first)
        thread.start()
        deadline = time.time() + 10
        while live.engine.metrics().queue_depth == 0 and time.time() < deadline:
            time.sleep(0.005)
        second = httpx.post(f"{live.url}/infill", json=dict(LONG, n_predict=4), timeout=60)
        thread.join()
    assert second.status_code == 200
    reasons = [e.stop_reason for e in live.engine.metrics().recent if e.document and e.document.endswith("pkg/long.py")]
    assert "superseded" in reasons
    assert results["first"]["timings"]["predicted_n"] < 500


def test_index_update_visible_to_next_completion(live, repo):
    r = httpx.post(f"{live.url}/v1/index/files", json={"files": [
        {"path": "pkg/new.py", "text": "zebra_total = count_zebras(herd)\n"}]})
    assert r.status_code == 200 and r.json() == {"updated": 1, "removed": 0}
    assert live.engine.index.propose("zebra_to")[0].text == "tal = count_zebras(herd)"
    body = {"input_prefix": "", "prompt": "zebra_to", "input_suffix": "", "n_predict": 4, "path": "pkg/new2.py"}
    assert httpx.post(f"{live.url}/infill", json=body).status_code == 200
    (repo / "pkg" / "disk.py").write_text("walrus_count = tally(walruses)\n")
    assert httpx.post(f"{live.url}/v1/index", json={"path": "pkg/disk.py"}).json()["status"] == "updated"
    assert live.engine.index.propose("walrus_c")[0].text == "ount = tally(walruses)"
    r = httpx.post(f"{live.url}/v1/index/files", json={"files": [{"path": "pkg/new.py", "deleted": True}]})
    assert r.json() == {"updated": 0, "removed": 1} and live.engine.index.propose("zebra_to") == []


def test_index_paths_cannot_escape(live, repo, tmp_path):
    r = httpx.post(f"{live.url}/v1/index", json={"path": "../outside.py"})
    assert r.status_code == 403
    r = httpx.post(f"{live.url}/v1/index", json={"path": "/etc/passwd"})
    assert r.status_code == 403
    (tmp_path / "secret.py").write_text("secret = 1\n")
    link = repo / "pkg" / "link.py"
    if not link.exists():
        link.symlink_to(tmp_path / "secret.py")
    assert httpx.post(f"{live.url}/v1/index", json={"path": "pkg/link.py"}).status_code == 403
    fifo = repo / "pkg" / "pipe.py"
    if not fifo.exists():
        os.mkfifo(fifo)
    r = httpx.post(f"{live.url}/v1/index", json={"path": "pkg/pipe.py"})
    assert r.status_code == 400 and "regular file" in r.json()["error"]["message"]
    r = httpx.post(f"{live.url}/v1/index/files", json={"files": [{"path": "../x.py", "text": "x"}]})
    assert r.status_code == 403


def test_what_the_server_loaded_is_kept_out_of_full_collections(models, repo):
    """Models and index are frozen once loaded, so a full collection (about 200 ms over the
    real models and an index) scans only newer objects; the server unfreezes them at shutdown."""
    import gc

    gc.unfreeze()
    with make_server(models, repo) as server:
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the modules, models and index loaded so far
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        assert not any(o is server.engine for o in gc.get_objects())  # the collector's generations skip it
    assert gc.get_freeze_count() == 0


_HEAP_CHILD = """
import sys
import torch
from specdec_server.longlived import return_freed_caches

def anon_mb():
    line = next(l for l in open("/proc/self/status") if l.startswith("RssAnon:"))
    return int(line.split()[1]) / 1024

if sys.argv[1] == "set":
    assert return_freed_caches()
first = torch.ones(3 << 18)
del first  # a first freed mapping: glibc's default then serves this size from the heap
base = anon_mb()
held = [torch.ones(700_000 + 1000 * i) for i in range(40)]  # about 2.8 MB each, as KV caches
del held[:-1]  # the prompt cache evicts the older entries and keeps the newest
print(anon_mb() - base)
"""


def test_caches_the_server_frees_go_back_to_the_system():
    """A long-running server's RSS must stay flat once its prompt cache is full: an evicted KV
    cache is returned to the system when freed, though a newer one is still held."""
    import subprocess
    import sys

    grown = {mode: float(subprocess.run([sys.executable, "-c", _HEAP_CHILD, mode], capture_output=True, text=True,
                                        check=True).stdout) for mode in ("default", "set")}
    assert grown["default"] > 60, grown  # the premise: glibc's default keeps the freed heap
    assert grown["set"] < 16, grown
