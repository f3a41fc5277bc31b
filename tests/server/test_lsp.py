"""`specdec lsp` as a real subprocess, driven over stdio by a pygls client (pytest-lsp)."""

import asyncio
import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import ClientServerConfig, LanguageClient

REPO = Path(tempfile.mkdtemp(prefix="specdec-lsp-"))  # the server's command line is fixed at import
atexit.register(shutil.rmtree, REPO, True)
(REPO / "pkg").mkdir()
(REPO / "pkg" / "store.py").write_text(
    "class Store:\n    def get_item(self, key):\n        return self.items[key]\n\n"
    "    def put_item(self, key, value):\n        self.items[key] = value\n")
OPEN_TEXT = "from pkg.store import Store\n\n\ndef main():\n    store = Store()\n    store.put_item(\"a\", 1)\n    "
URI = (REPO / "pkg" / "app.py").as_uri()
CAPABILITIES = types.ClientCapabilities(  # recorded capability sets predate inline completion
    text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities(),
        synchronization=types.TextDocumentSyncClientCapabilities(did_save=True)),
    window=types.WindowClientCapabilities(work_done_progress=True),
    workspace=types.WorkspaceClientCapabilities(configuration=True))


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "specdec.cli", "lsp"]))
async def client(lsp_client: LanguageClient):
    result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=CAPABILITIES, root_uri=REPO.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=REPO.as_uri(), name="repo")],
        initialization_options={"maxTokens": 16}))
    lsp_client.server_info = result
    yield
    await lsp_client.shutdown_session()
    assert lsp_client._server.returncode == 0  # shutdown, then exit: a clean end


def _open(client, text=OPEN_TEXT, uri=URI):
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


def _request(line, character, uri=URI, kind=types.InlineCompletionTriggerKind.Invoked):
    return types.InlineCompletionParams(text_document=types.TextDocumentIdentifier(uri=uri),
                                        position=types.Position(line=line, character=character),
                                        context=types.InlineCompletionContext(trigger_kind=kind))


@pytest.mark.asyncio
async def test_capability_is_announced_and_a_completion_comes_back(client: LanguageClient):
    assert client.server_info.capabilities.inline_completion_provider is not None
    _open(client)
    result = await client.text_document_inline_completion_async(_request(6, 4))
    assert isinstance(result, types.InlineCompletionList) and len(result.items) <= 1
    for item in result.items:
        assert isinstance(item.insert_text, str) and item.insert_text
        assert item.range.start == item.range.end == types.Position(line=6, character=4)


@pytest.mark.asyncio
async def test_incremental_changes_are_seen(client: LanguageClient):
    _open(client)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=6, character=4), end=types.Position(line=6, character=4)),
            text="value = store.get_item(\"a\")\n    total = ")]))
    result = await client.text_document_inline_completion_async(_request(7, 12))  # exists only after the change
    assert isinstance(result, types.InlineCompletionList)
    with pytest.raises(Exception, match="outside the document"):
        await client.text_document_inline_completion_async(_request(7, 40))


@pytest.mark.asyncio
async def test_unknown_document_gets_an_empty_result(client: LanguageClient):
    result = await client.text_document_inline_completion_async(_request(0, 0, uri=(REPO / "nope.py").as_uri()))
    assert result is None


@pytest.mark.asyncio
async def test_cancel_answers_and_the_server_keeps_serving(client: LanguageClient):
    long_text = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(150))
    _open(client, text=long_text + "def long_function():\n    ")  # a cold prompt: prefill alone takes a while
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"specdec": {"maxTokens": 256, "timeBudgetMs": 30000}}))
    pending = asyncio.ensure_future(  # sent now, not when awaited
        client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, _request(451, 4), msg_id=4242))
    await asyncio.sleep(0.1)  # begun: the cold prompt takes longer than this to complete
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=4242))
    started = asyncio.get_running_loop().time()
    with pytest.raises(JsonRpcRequestCancelled):
        await pending
    assert asyncio.get_running_loop().time() - started < 5  # not the 256 tokens it was asked for
    after = await client.text_document_inline_completion_async(_request(451, 4))
    assert isinstance(after, types.InlineCompletionList)


@pytest.mark.asyncio
async def test_configuration_change_limits_the_completion(client: LanguageClient):
    _open(client)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"specdec": {"maxTokens": 1, "strategy": "ar"}}))
    result = await client.text_document_inline_completion_async(
        _request(6, 4, kind=types.InlineCompletionTriggerKind.Automatic))
    assert result is None or all(len(item.insert_text) <= 24 for item in result.items)  # one token at most


@pytest.mark.asyncio
async def test_a_selected_completion_is_extended_over_its_range(client: LanguageClient):
    """LSP 3.18: with the completion widget showing an item, the inline items must extend that
    item's text and use its range; the engine completes as if the item were already typed."""
    _open(client, text=OPEN_TEXT + "store.pu")
    selected_range = types.Range(start=types.Position(line=6, character=10), end=types.Position(line=6, character=12))
    params = _request(6, 12)
    params.context.selected_completion_info = types.SelectedCompletionInfo(range=selected_range, text="put_item")
    result = await client.text_document_inline_completion_async(params)
    assert isinstance(result, types.InlineCompletionList) and len(result.items) == 1  # "(" at least follows
    for item in result.items:
        assert item.insert_text.startswith("put_item") and len(item.insert_text) > len("put_item")
        assert item.range == selected_range
        assert item.filter_text == "put_item"


async def _logged(client: LanguageClient, fragment: str, seconds: float = 60) -> types.LogMessageParams:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        for message in client.log_messages:
            if fragment in message.message:
                return message
        await asyncio.sleep(0.1)
    raise AssertionError(f"no log message with {fragment!r}: {[m.message for m in client.log_messages]}")


@pytest.mark.asyncio
async def test_models_named_in_the_configuration_are_loaded_and_a_bad_one_is_reported(client: LanguageClient):
    from specdec import default_model_dir

    _open(client)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"specdec": {"target": str(REPO / "no-such-model")}}))
    error = await _logged(client, "not loaded")
    assert error.type == types.MessageType.Error
    assert isinstance(await client.text_document_inline_completion_async(_request(6, 4)), types.InlineCompletionList)
    models = default_model_dir()
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"specdec": {"target": str(models / "target"), "draft": str(models / "draft")}}))
    await _logged(client, "models loaded")
    assert isinstance(await client.text_document_inline_completion_async(_request(6, 4)), types.InlineCompletionList)
