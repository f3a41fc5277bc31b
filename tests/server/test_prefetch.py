"""Prefetch over HTTP: the request after a Tab is answered from work done while the suggestion showed."""

import time

import httpx

from tests.server.conftest import make_server
from tests.server.test_protocols import VIM_BODY


def _idle(engine, timeout=60.0) -> None:
    """Until the request just answered has queued its prefetches and they have run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.prefetcher.jobs and engine.prefetcher.next_runnable() is None:
            return
        time.sleep(0.02)
    raise AssertionError("the prefetch did not finish")


def _accepted(body: dict, content: str) -> dict:
    """What llama.vim sends after Tab on a one-line suggestion: the cursor line grows by it."""
    return dict(body, prompt=body["prompt"] + content)


def test_the_request_after_tab_is_served_from_the_prefetch_with_the_cold_tokens(models, repo):
    with make_server(models, repo) as server:
        body = dict(VIM_BODY, response_fields=None)
        shown = httpx.post(f"{server.url}/infill", json=body, timeout=60).json()
        assert shown["content"] and shown["speculation"]["prefetched"] == ""
        _idle(server.engine)
        after_tab = httpx.post(f"{server.url}/infill", json=_accepted(body, shown["content"]), timeout=60).json()
        assert after_tab["speculation"]["prefetched"] == "served"
        cold = dict(_accepted(body, shown["content"]), cache_prompt=False, prefetch=False)
        assert httpx.post(f"{server.url}/infill", json=cold, timeout=60).json()["tokens"] == after_tab["tokens"]
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'specdec_prefetch_total{outcome="served"} 1' in metrics
        assert "specdec_prefetch_wasted_cpu_share" in metrics


def test_prefetch_is_off_per_request_and_per_server(models, repo):
    with make_server(models, repo) as server:
        response = httpx.post(f"{server.url}/infill", json=dict(VIM_BODY, prefetch=False), timeout=60)
        assert response.status_code == 200
        time.sleep(0.3)
        assert server.engine.metrics().prefetch.started == 0
        bad = httpx.post(f"{server.url}/infill", json=dict(VIM_BODY, prefetch="yes"), timeout=60)
        assert bad.status_code == 400 and "prefetch" in bad.text
    with make_server(models, repo, prefetch=False) as server:
        assert httpx.post(f"{server.url}/infill", json=VIM_BODY, timeout=60).status_code == 200
        time.sleep(0.3)
        assert server.engine.metrics().prefetch.started == 0
        assert 'specdec_prefetch_total{outcome="started"} 0' in httpx.get(f"{server.url}/metrics", timeout=10).text


def test_serve_and_lsp_turn_prefetch_off_by_flag_and_setting():
    import argparse

    from specdec_server.cli import LSP, SERVE
    from specdec_server.lsp import LspSettings

    for command in (SERVE, LSP):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        assert parser.parse_args([]).prefetch is True
        assert parser.parse_args(["--no-prefetch"]).prefetch is False
    assert LspSettings().updated({"specdec": {"prefetch": False}}).prefetch is False
    assert LspSettings().updated({"specdec": {"prefetch": "no"}}).prefetch is True  # not a boolean: ignored
