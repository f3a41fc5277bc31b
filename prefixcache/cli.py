"""prefixcache index REPO --out DIR | prefixcache query DIR "text" [--path FILE] [-k 8]"""

import argparse
import json
import sys
import time
from pathlib import Path

from prefixcache.index import Index
from prefixcache.store import IndexFormatError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="prefixcache", description="Index a repository and query its prefix cache.")
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="index a repository into DIR")
    index.add_argument("repo", type=Path)
    index.add_argument("--out", type=Path, required=True)
    index.add_argument("--exclude", action="append", default=[], help="glob of paths or directories to skip (repeatable)")
    index.add_argument("--workers", type=int, default=None)
    index.add_argument("--rebuild", action="store_true", help="ignore an existing index in --out")
    query = sub.add_parser("query", help="print the continuations proposed for some text before the cursor")
    query.add_argument("index", type=Path)
    query.add_argument("text", help="text before the cursor (\\n for newlines)")
    query.add_argument("--path", default=None, help="repository-relative path of the file being edited")
    query.add_argument("-k", type=int, default=8)
    query.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        return _index(args) if args.command == "index" else _query(args)
    except (IndexFormatError, FileNotFoundError, ValueError) as err:
        print(f"prefixcache: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prefixcache: interrupted; the existing index (if any) is untouched", file=sys.stderr)
        return 130


def _index(args) -> int:
    started = time.perf_counter()
    idx = None
    if not args.rebuild and (args.out / "manifest.json").exists():
        try:
            idx = Index.load(args.out)
        except IndexFormatError as err:
            print(f"prefixcache: rebuilding ({err})", file=sys.stderr)
        if idx is not None and idx.root != args.repo.resolve():
            idx = None
    if idx is not None:
        changes = idx.refresh()
        print(f"re-indexed: {changes['changed']} changed, {changes['removed']} removed, "
              f"{changes['unchanged']} unchanged files", file=sys.stderr)
    else:
        idx = Index.build(args.repo, workers=args.workers, progress=True, exclude=args.exclude)
    idx.save(args.out)
    s = idx.summary
    size = sum(p.stat().st_size for p in args.out.iterdir())
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(s.get("skipped", {}).items())) or "none"
    print(f"indexed {s.get('indexed')} of {s.get('listed')} files ({s.get('source_chars', 0) / 1e6:.1f} M chars), "
          f"skipped: {skipped}; {len(idx.static.trie)} units, {size / 1e6:.2f} MB on disk, "
          f"{time.perf_counter() - started:.2f} s -> {args.out}", file=sys.stderr)
    return 0


def _query(args) -> int:
    idx = Index.load(args.index)
    text = args.text.replace("\\n", "\n")
    candidates = idx.propose(text, path=args.path, k=args.k)
    if args.json:
        print(json.dumps([{"text": c.text, "score": round(c.score, 3), "source": c.source} for c in candidates]))
    else:
        for c in candidates:
            print(f"{c.score:7.2f}  {c.text!r}  ({c.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
