"""CompletionHandle: what Engine.submit returns, the one way a caller follows a completion.

result() blocks (and steps the scheduler inline when no background loop runs); wait() and
deltas() are the asyncio forms for a server's event loop; cancel() is safe from any thread.
"""

import asyncio

import torch

from specdec.decode.generation import Generation
from specdec.decode.stats import Result


class CompletionHandle:
    def __init__(self, engine, generation: Generation):
        self._engine, self._generation = engine, generation

    @property
    def done(self) -> bool:
        return self._generation.finished.is_set()

    def busy_wait_ms(self) -> float | None:
        """The expected wait of a request answered at once as busy (Engine.submit), else None."""
        g = self._generation
        return g.stats.expected_wait_ms if g.is_finished and g.stop_reason == "busy" else None

    def cancel(self) -> None:
        """Stop generating at the next step boundary (the result keeps what was generated)."""
        self._generation.request_cancel("cancelled")

    def result(self, timeout: float | None = None) -> Result:
        g, engine = self._generation, self._engine
        if engine.scheduler.thread is not None:
            if not g.finished.wait(timeout):
                raise TimeoutError(f"the completion did not finish within {timeout} s")
        else:
            with engine.lock, torch.inference_mode():
                engine.scheduler.run_until_done([g])
        return self._outcome()

    async def wait(self) -> Result:
        """The result, awaited on the running event loop (needs the scheduler's background loop)."""
        async for _ in self._events():
            pass
        return self._outcome()

    async def deltas(self):
        """Async iterator of the new text after each step, until the completion finishes."""
        sent = ""
        async for text in self._events():
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :]
                sent = text

    def _outcome(self) -> Result:
        if self._generation.error is not None:
            raise self._generation.error
        return self._generation.result()

    async def _events(self):
        """The text after each step, from the scheduler thread to this loop, until done."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def listener(text: str, done: bool) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (text, done))
            except RuntimeError:  # the loop has closed: nobody is listening any more
                pass

        g = self._generation
        g.listeners.append(listener)
        try:
            if g.finished.is_set():  # finished before the listener was there
                listener(g.current_text(), True)
            while True:
                text, done = await queue.get()
                if done:
                    return
                yield text
        finally:
            g.listeners.remove(listener)
