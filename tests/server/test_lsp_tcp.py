"""`specdec lsp --tcp HOST:PORT` as a real subprocess, driven by a plain JSON-RPC client over a
socket: the same protocol as over stdio, and a clean exit after shutdown and exit."""

import json
import socket
import subprocess
import sys
import time

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class JsonRpc:
    def __init__(self, sock):
        self.stream = sock.makefile("rwb")

    def write(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.stream.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.stream.flush()

    def send(self, method, params=None) -> None:
        self.write({"method": method, "params": params})

    def receive(self) -> dict:
        length = None
        while line := self.stream.readline().strip():
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return json.loads(self.stream.read(length))

    def request(self, id_, method, params) -> dict:
        self.write({"id": id_, "method": method, "params": params})
        while True:
            message = self.receive()
            if "method" in message and "id" in message:  # the server asks (work-done progress): agree
                self.write({"id": message["id"], "result": None})
            elif message.get("id") == id_:
                return message


@pytest.fixture
def tcp_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "lsp", "--tcp", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise AssertionError(f"lsp --tcp did not listen: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.2)
    yield proc, JsonRpc(sock)
    sock.close()
    if proc.poll() is None:
        proc.kill()


def test_lsp_over_tcp_completes_and_exits_cleanly(tcp_server):
    proc, rpc = tcp_server
    init = rpc.request(1, "initialize", {"processId": None, "rootUri": None,
                                         "capabilities": {"textDocument": {"inlineCompletion": {}}}})
    assert "inlineCompletionProvider" in init["result"]["capabilities"]
    rpc.send("initialized", {})
    uri = "file:///tmp/specdec-tcp-test.py"
    rpc.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                       "text": "def add(a, b):\n    return "}})
    answer = rpc.request(2, "textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 11}, "context": {"triggerKind": 1}})
    items = answer["result"]["items"]
    assert items and items[0]["insertText"]
    assert items[0]["range"]["start"] == {"line": 1, "character": 11}
    outside = rpc.request(3, "textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 40}, "context": {"triggerKind": 1}})
    assert outside["error"]["code"] == -32602  # invalid params, and the server goes on
    assert rpc.request(4, "shutdown", None)["result"] is None
    rpc.send("exit")
    assert proc.wait(timeout=30) == 0


def test_a_malformed_address_is_a_cli_error():
    done = subprocess.run([sys.executable, "-m", "specdec.cli", "lsp", "--tcp", "localhost"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "expected HOST:PORT" in done.stderr
