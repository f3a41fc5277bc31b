"""Server settings that reach the engine: the repository context's token budget."""

import argparse

import httpx
import pytest

from specdec.prompt.retrieval import ContextSettings
from tests.server.conftest import make_server
from tests.server.test_protocols import VIM_BODY

# helper, used a line above the cursor, is defined in the repository's pkg/util.py: its definition
# is what retrieval offers
BODY = dict(VIM_BODY, response_fields=None, input_extra=[], input_prefix="import os\n\ndef main():\n    value = helper(1)\n",
            prompt="    files = ")


def test_context_tokens_size_the_retrieved_context_and_zero_turns_it_off(models, repo):
    with make_server(models, repo) as server:
        chosen = httpx.post(f"{server.url}/infill", json=BODY, timeout=60).json()["speculation"]
        assert server.engine.contexts.settings == ContextSettings()
    with make_server(models, repo, context_tokens=0) as server:
        off = httpx.post(f"{server.url}/infill", json=BODY, timeout=60).json()["speculation"]
        assert server.engine.contexts.settings.tokens == 0
    assert chosen["context_chunks"] > 0 and chosen["context_tokens"] > 0
    assert off["context_chunks"] == 0 and off["retrieval_ms"] == 0


def test_serve_and_lsp_take_a_context_budget_and_refuse_a_bad_one(capsys):
    from specdec_server.cli import LSP, SERVE

    for command in (SERVE, LSP):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        assert parser.parse_args([]).context_tokens is None
        assert parser.parse_args(["--context-tokens", "256"]).context_tokens == 256
        for bad in ("-1", "many"):
            with pytest.raises(SystemExit):
                parser.parse_args(["--context-tokens", bad])
            assert "expected a whole number of tokens" in capsys.readouterr().err
