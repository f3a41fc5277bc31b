"""`specdec lsp`: inline completion over the Language Server Protocol 3.18 (pygls 2).

Documents are synchronised incrementally; every change goes into the prefix cache's overlay, so
the next completion sees unsaved text. The workspace is indexed in the background with
work-done progress. textDocument/inlineCompletion submits one CompletionOptions to the engine and
awaits its handle on the server's event loop; $/cancelRequest cancels the awaiting task, which
cancels the generation at the next step.
"""

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer

from specdec import DEFAULT_STRATEGY, STRATEGIES, CompletionOptions
from specdec_server.indexing import build_and_attach
from specdec_server.longlived import freeze_what_is_loaded, return_freed_caches, unfreeze

log = logging.getLogger("specdec.lsp")


@dataclass(frozen=True)
class LspSettings:
    """What initializationOptions and workspace/didChangeConfiguration may set (camelCase there)."""

    strategy: str = DEFAULT_STRATEGY
    max_tokens: int = 64  # Automatic requests; Invoked ones get twice as many
    time_budget_ms: float | None = 1000.0
    target: str | None = None  # model directories; None: those the server was started with
    draft: str | None = None
    prefetch: bool = True  # compute the completion after an accept while the suggestion is shown

    def updated(self, values) -> "LspSettings":
        values = (values or {}).get("specdec", values or {}) if isinstance(values, dict) else {}
        changes = {}
        if values.get("strategy") in STRATEGIES:
            changes["strategy"] = values["strategy"]
        if isinstance(values.get("maxTokens"), int) and 0 < values["maxTokens"] <= 512:
            changes["max_tokens"] = values["maxTokens"]
        if isinstance(values.get("timeBudgetMs"), (int, float)) and values["timeBudgetMs"] > 0:
            changes["time_budget_ms"] = float(values["timeBudgetMs"])
        if isinstance(values.get("prefetch"), bool):
            changes["prefetch"] = values["prefetch"]
        for name in ("target", "draft"):
            if isinstance(values.get(name), str) and values[name]:
                changes[name] = values[name]
        return replace(self, **changes)


class CompletionServer(LanguageServer):
    def __init__(self, engine, repo: Path | None = None):
        super().__init__("specdec", "0.2")
        self.engine, self.repo = engine, repo
        self.settings = LspSettings()
        self.models: tuple = (None, None)  # (target, draft) the engine was loaded with; None: the CLI's
        self.root: Path | None = Path(repo).resolve() if repo else None

    def apply(self, settings: LspSettings) -> None:
        """New settings; models named that differ from the engine's load in the background, and
        completions go on with the current engine until they are ready."""
        self.settings = settings
        wanted = (settings.target, settings.draft)
        if any(wanted) and wanted != self.models:
            self.models = wanted
            threading.Thread(target=_reload_models, args=(self, *wanted), daemon=True, name="lsp-models").start()

    def relative(self, uri: str) -> str | None:
        """The document's repository-relative path, or None outside the indexed root."""
        path = Path(unquote(urlparse(uri).path))
        if self.root is None:
            return None
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return None

    def log(self, message: str, kind=types.MessageType.Info) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))


def build_server(engine, repo: Path | None = None) -> CompletionServer:
    server = CompletionServer(engine, repo)

    @server.feature(types.INITIALIZE)
    def initialize(ls: CompletionServer, params: types.InitializeParams):
        ls.apply(ls.settings.updated(params.initialization_options))
        if ls.root is None:
            folders = params.workspace_folders or []
            uri = folders[0].uri if folders else params.root_uri
            if uri:
                ls.root = Path(unquote(urlparse(uri).path)).resolve()

    @server.feature(types.INITIALIZED)
    def initialized(ls: CompletionServer, _params):
        if ls.root is not None and ls.root.is_dir() and ls.engine.index is None:
            threading.Thread(target=_index_workspace, args=(ls,), daemon=True, name="lsp-index").start()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def configuration(ls: CompletionServer, params: types.DidChangeConfigurationParams):
        ls.apply(ls.settings.updated(params.settings))
        ls.log(f"settings: {ls.settings}")

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: CompletionServer, params: types.DidOpenTextDocumentParams):
        _into_index(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: CompletionServer, params: types.DidChangeTextDocumentParams):
        _into_index(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: CompletionServer, params: types.DidSaveTextDocumentParams):
        _into_index(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: CompletionServer, params: types.DidCloseTextDocumentParams):
        pass  # the overlay keeps the last text seen: the file on disk may lag behind it

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: CompletionServer, params: types.InlineCompletionParams):
        return await _complete(ls, params)

    return server


async def _complete(ls: CompletionServer, params: types.InlineCompletionParams):
    uri = params.text_document.uri
    document = ls.workspace.text_documents.get(unquote(uri))
    if document is None:
        return None  # never opened: nothing known to complete
    lines = document.lines
    position = params.position
    if position.line > len(lines) or (position.line < len(lines) and
                                        position.character > len(lines[position.line].rstrip("\r\n"))):
        raise JsonRpcInvalidParams(f"position {position.line}:{position.character} is outside the document")
    version, offset = document.version, document.offset_at_position(position)
    source = document.source
    prefix, suffix = source[:offset], source[offset:]
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    selected = params.context.selected_completion_info
    if selected is not None:  # the completion widget's choice is what the user is about to have
        prefix = source[: document.offset_at_position(selected.range.start)] + selected.text
    options = CompletionOptions(prefix, suffix, max_tokens=ls.settings.max_tokens * (2 if invoked else 1),
                                strategy=ls.settings.strategy, mode="auto", path=ls.relative(uri), document=uri,
                                time_budget_ms=ls.settings.time_budget_ms, time_budget_after_newline=True,
                                prefetch=ls.settings.prefetch)
    handle = ls.engine.submit(options)
    try:
        result = await handle.wait()
    except asyncio.CancelledError:
        handle.cancel()  # $/cancelRequest: the generation stops at the next step
        raise
    now = ls.workspace.text_documents.get(unquote(uri))
    if not invoked and now is not None and now.version != version:
        return None  # typed on since: an automatic suggestion for an old state is not shown
    if not result.text:
        return types.InlineCompletionList(items=[])
    if selected is not None:  # LSP 3.18: the item must extend the selected text, over the same range
        return types.InlineCompletionList(items=[types.InlineCompletionItem(
            insert_text=selected.text + result.text, range=selected.range, filter_text=selected.text)])
    item = types.InlineCompletionItem(insert_text=result.text, range=types.Range(start=position, end=position))
    return types.InlineCompletionList(items=[item])


def _reload_models(ls: CompletionServer, target: str | None, draft: str | None) -> None:
    from specdec import Engine

    try:
        engine = Engine.from_pretrained(Path(target) if target else None, Path(draft) if draft else None,
                                        index=ls.engine.index, repo=ls.root)
        engine.start()
    except Exception as err:  # a wrong path or a broken checkpoint: say so, keep serving
        ls.log(f"models target={target} draft={draft} not loaded, the current ones stay: {err}",
               types.MessageType.Error)
        return
    old, ls.engine = ls.engine, engine
    if engine.index is None:  # indexed meanwhile, into the engine that was current then
        engine.attach_index(old.index)
    ls.log(f"models loaded: target={target or 'default'} draft={draft or 'default'}")
    _stop_when_idle(old)
    freeze_what_is_loaded()  # after the old engine is let go, so that its objects can be collected


def _stop_when_idle(engine, seconds: float = 30.0) -> None:
    """Stop a replaced engine once the requests it still holds are done (at most `seconds`)."""
    deadline = time.monotonic() + seconds
    while engine.queue_depth() and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.stop()


def _into_index(ls: CompletionServer, uri: str) -> None:
    index, rel = ls.engine.index, ls.relative(uri)
    document = ls.workspace.text_documents.get(unquote(uri))
    if index is not None and rel is not None and document is not None:
        index.update(rel, document.source)


def _index_workspace(ls: CompletionServer) -> None:
    token = str(uuid.uuid4())
    try:
        ls.work_done_progress.create(token).result(timeout=10)
        ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(title="specdec: indexing", percentage=0))
    except Exception:  # a client without progress support still gets its index
        token = None
    started = time.perf_counter()
    try:
        index = build_and_attach(ls.root, lambda: ls.engine)
    except Exception as err:
        ls.log(f"indexing {ls.root} failed: {err}", types.MessageType.Error)
        return
    for uri in list(ls.workspace.text_documents):  # what was opened while indexing
        _into_index(ls, uri)
    message = f"indexed {len(index.files)} files in {time.perf_counter() - started:.1f} s"
    ls.log(message)
    if token is not None:
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))


def run(engine, repo: Path | None = None, tcp: str | None = None) -> int:
    engine.start()
    server = build_server(engine, repo)
    freeze_what_is_loaded()
    return_freed_caches()  # a long editing session must not grow the heap once the prompt cache is full
    try:
        if tcp:
            host, _, port = tcp.rpartition(":")
            server.start_tcp(host or "127.0.0.1", int(port))
        else:
            server.start_io()
    finally:
        engine.stop()
        server.engine.stop()  # the one that replaced it, if settings named other models (stop is idempotent)
        unfreeze()
    return 0
