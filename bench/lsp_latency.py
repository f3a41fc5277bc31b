"""LSP latency: from textDocument/inlineCompletion to its answer, first request and keystroke follow-up.

    python bench/lsp_latency.py [--file FILE] [--points 20] [--out bench/results/lsp_latency.json]

A real `specdec lsp` subprocess over stdio, the embedded models, a real file opened at random
line starts (seeded): the first request at a cursor, then one typed character (didChange) and the
request again, as an editor does on the next keystroke. Medians and p95 of each.
"""

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from specdec_eval.metrics import median, percentile

ROOT = Path(__file__).resolve().parents[1]


async def measure(file: Path, points: int, seed: int) -> dict:
    client = LanguageClient("bench", "1")
    await client.start_io(sys.executable, "-m", "specdec.cli", "lsp", "--repo", str(ROOT))
    capabilities = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities()))
    await client.initialize_async(types.InitializeParams(capabilities=capabilities, root_uri=ROOT.as_uri()))
    client.initialized(types.InitializedParams())
    text, uri = file.read_text(), file.resolve().as_uri()
    lines = text.split("\n")
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    await asyncio.sleep(3)  # let the background index finish
    rng, first, follow, version = random.Random(seed), [], [], 1
    rows = [i for i, line in enumerate(lines) if line.strip()]
    for row in rng.sample(rows, min(points, len(rows))):
        column = len(lines[row]) - len(lines[row].lstrip())
        first.append(await _timed(client, uri, row, column))
        version += 1
        typed = lines[row][column : column + 1] or "x"
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=row, character=column),
                                  end=types.Position(line=row, character=column)), text=typed)]))
        follow.append(await _timed(client, uri, row, column + 1))
        version += 1  # take the character back out, so every point sees the real file
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=row, character=column),
                                  end=types.Position(line=row, character=column + 1)), text="")]))
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {"file": file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else file.name, "points": len(first),
            "first_ms": {"p50": median(first), "p95": percentile(first, 0.95)},
            "follow_up_ms": {"p50": median(follow), "p95": percentile(follow, 0.95)}}


async def _timed(client, uri, row, column) -> float:
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=row, character=column),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))
    started = time.perf_counter()
    await client.text_document_inline_completion_async(params)
    return (time.perf_counter() - started) * 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, default=ROOT / "specdec" / "scheduler.py")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.file, args.points, args.seed))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
