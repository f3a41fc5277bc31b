"""The bridge between the event loop and the engine's scheduler thread: model code never runs on the loop."""

import asyncio
import hashlib

from server.errors import ApiError
from specdec import QueueFull


def document_key(client: str, options: dict) -> str:
    """Requests with the same key supersede each other: an explicit path, else the client and
    the start of its prefix window (llama.vim's 256 lines before the cursor move only when the
    cursor changes line)."""
    if options.get("path"):
        return f"{client}:{options['path']}"
    head = options.get("prefix", "")[:200]
    return f"{client}:{hashlib.blake2b(head.encode(), digest_size=8).hexdigest()}"


async def _until_disconnect(request) -> None:
    """Returns when the client has gone (the body has been read, so nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class EngineBridge:
    def __init__(self, engine, metrics):
        self.engine, self.metrics = engine, metrics
        engine.scheduler.start()

    def start(self, options: dict, document: str | None):
        """A submitted generation, with an asyncio queue of (kind, payload) events (called on the
        event loop: it only validates and enqueues; the scheduler builds the prompt)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        try:
            g = self.engine.generation(**options)
        except ValueError as err:
            raise ApiError(400, str(err)) from None
        g.request.document = document
        g.on_tokens = lambda text: loop.call_soon_threadsafe(events.put_nowait, ("text", text))
        g.on_finish = lambda: loop.call_soon_threadsafe(events.put_nowait, ("done", None))
        try:
            self.engine.scheduler.submit(g)
        except QueueFull as err:
            raise ApiError(429, f"too many queued requests ({err}); retry shortly", kind="rate_limit") from None
        return g, events

    async def run(self, options: dict, document: str | None, request) -> object:
        """Wait for the whole result; a client that disconnects cancels its generation.

        The disconnect is the ASGI server's http.disconnect message, awaited alongside the
        result (polling each request for it costs the event loop more than the requests do,
        at a request per keystroke)."""
        g, events = self.start(options, document)
        done = asyncio.ensure_future(self._until_done(events))
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                g.cancel()
        except asyncio.CancelledError:
            g.cancel()
            raise
        finally:
            done.cancel()
            gone.cancel()
        return self.finish(g)

    @staticmethod
    async def text_deltas(events):
        """The new text of each streaming event, until the generation is done."""
        sent = ""
        while True:
            kind, text = await events.get()
            if kind == "done":
                return
            if text is not None and len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent):]
                sent = text

    @staticmethod
    async def _until_done(events) -> None:
        while True:
            kind, _ = await events.get()
            if kind == "done":
                return

    def finish(self, g):
        if g.error is not None:
            raise ApiError(500, "internal error while generating", kind="server_error")
        result = g.result()
        self.metrics.observe_completion(result.stats)
        return result
