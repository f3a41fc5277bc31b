"""The bridge between the event loop and the engine: model code never runs on the loop.

A request's CompletionOptions go to Engine.submit, on the loop (it only enqueues: the
scheduler's thread builds the prompt); the handle it returns is awaited, streamed or cancelled.
"""

import asyncio
import hashlib

from specdec import CompletionHandle, CompletionOptions, OptionsError, QueueFull, Result
from specdec_server.errors import ApiError


def document_key(client: str, options: CompletionOptions) -> str:
    """Requests with the same key supersede each other: an explicit path, else the client and
    the start of its prefix window (llama.vim's 256 lines before the cursor move only when the
    cursor changes line)."""
    if options.path:
        return f"{client}:{options.path}"
    head = options.prefix[:200]
    return f"{client}:{hashlib.blake2b(head.encode(), digest_size=8).hexdigest()}"


def slot_key(client: str, slot: int) -> str | None:
    """llama.cpp's id_slot: a client's requests to one slot supersede each other (-1: no slot)."""
    return f"{client}:slot:{slot}" if slot >= 0 else None


async def _until_disconnect(request) -> None:
    """Returns when the client has gone (the body has been read, so nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class EngineBridge:
    def __init__(self, engine, metrics):
        self.engine, self.metrics = engine, metrics
        engine.start()

    def start(self, options: CompletionOptions) -> CompletionHandle:
        try:
            return self.engine.submit(options)
        except QueueFull as err:
            raise ApiError(429, f"too many queued requests ({err}); retry shortly", kind="rate_limit") from None
        except OptionsError as err:  # an option only the loaded model can check (a FIM order its family lacks)
            raise ApiError(400, str(err), err.field) from None

    async def run(self, options: CompletionOptions, request) -> Result:
        """Wait for the whole result; a client that disconnects cancels its generation.

        The disconnect is the ASGI server's http.disconnect message, awaited alongside the
        result (polling each request for it costs the event loop more than the requests do,
        at a request per keystroke)."""
        handle = self.start(options)
        done = asyncio.ensure_future(handle.wait())
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                handle.cancel()
        except asyncio.CancelledError:
            handle.cancel()
            raise
        finally:
            done.cancel()
            gone.cancel()
        return await self.finish(handle)

    async def finish(self, handle: CompletionHandle) -> Result:
        try:
            result = await handle.wait()
        except Exception:
            raise ApiError(500, "internal error while generating", kind="server_error") from None
        self.metrics.observe_completion(result.stats)
        return result
