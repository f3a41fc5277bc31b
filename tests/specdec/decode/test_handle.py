"""CompletionHandle: streamed deltas."""

import asyncio

from specdec import CompletionOptions
from tests.helpers import code_prompts


def test_handle_streams_deltas_that_add_up_to_the_result(engine):
    _, prefix, suffix = code_prompts(1, seed=23, before=300)[0]
    reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=10, mode="multi")
    engine.start()
    try:
        async def follow():
            handle = engine.submit(CompletionOptions(prefix, suffix, strategy="hybrid", max_tokens=10, mode="multi"))
            deltas = [d async for d in handle.deltas()]
            return deltas, await handle.wait()

        deltas, result = asyncio.run(follow())
    finally:
        engine.stop()
    assert result.tokens == reference.tokens
    assert reference.text.startswith("".join(deltas))
