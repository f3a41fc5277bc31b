"""Load test: concurrent typing sessions against a real `specdec serve` on loopback.

    python bench/load_server.py --repo REPO [--sessions 16] [--seconds 60] [--port 8123]

Each session types stretches of real files of the repository character by character (one
keystroke every --interval ms on average); every keystroke sends llama.vim's /infill request, and a newer keystroke
abandons (disconnects) the previous request if it is still running, as editors do. Reports
p50/p95 latency of completed requests, 5xx count, and the server's RSS before and after.
Bounded: loopback only, --seconds of load, at most --sessions clients.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def body(text: str, cursor: int, path: str) -> dict:
    line_start = text.rfind("\n", 0, cursor) + 1
    line_end = text.find("\n", cursor)
    line_end = len(text) if line_end < 0 else line_end
    before = text[:line_start].split("\n")[-257:]
    return {"input_prefix": "\n".join(before), "prompt": text[line_start:cursor],
            "input_suffix": text[cursor:line_end] + "\n" + "\n".join(text[line_end + 1 :].split("\n")[:64]),
            "input_extra": [], "n_predict": 32, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90,
            "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 250, "path": path,
            "response_fields": ["content", "timings/predicted_n", "timings/prompt_n", "tokens_cached",
                                "speculation/stop_reason"]}


async def session(client, url, files, deadline, interval, rng, stats):
    """Types stretches of a real file into the document as a user would: the text after the
    stretch stays as it was (the suffix), the text before the cursor grows by one character per
    keystroke, and each keystroke's request replaces the previous one. At the end of each line
    the user pauses to read the suggestion: that request is awaited, never abandoned, and its
    latency is what a user waits for once typing stops."""
    pending = None
    while time.monotonic() < deadline:
        path, text = rng.choice(files)
        start = text.rfind("\n", 0, rng.randrange(0, max(1, len(text) - 400))) + 1
        end = min(len(text), start + rng.randrange(80, 400))
        for typed in range(start + 1, end + 1):
            if time.monotonic() >= deadline:
                break
            if pending is not None and not pending.done():
                pending.cancel()  # the editor moved on: drop the stale request
                stats["abandoned"] += 1
            document = text[:typed] + text[end:]
            pending = asyncio.create_task(request(client, url, body(document, typed, path), stats))
            if text[typed - 1] == "\n" or typed == end:
                stats["paused"] += 1
                await asyncio.gather(pending, return_exceptions=True)
                await asyncio.sleep(rng.uniform(0.3, 1.0))
            else:
                await asyncio.sleep(interval / 1000 * rng.uniform(0.5, 1.5))
    if pending is not None:
        await asyncio.gather(pending, return_exceptions=True)


async def sample_rss(pid: int, deadline: float, every: float) -> list:
    """The server's RSS every `every` seconds during the load: flat once the prompt cache is full."""
    series = []
    while time.monotonic() < deadline:
        series.append(round(rss_mb(pid), 1))
        await asyncio.sleep(every)
    return series


async def request(client, url, payload, stats):
    start = time.perf_counter()
    try:
        r = await client.post(f"{url}/infill", json=payload, timeout=30)
    except asyncio.CancelledError:
        raise
    except httpx.HTTPError:
        stats["errors"] += 1
        return
    stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
    if r.status_code == 200:
        answer = r.json()
        if answer.get("speculation/stop_reason") in ("superseded", "cancelled"):
            stats["superseded"] += 1
            return
        stats["latency"].append((time.perf_counter() - start) * 1000)
        stats["prefilled"].append(answer.get("timings/prompt_n", 0))
        stats["cached"].append(answer.get("tokens_cached", 0))


def start_server(repo: Path, port: int, log_path: Path):
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--repo", str(repo), "--port", str(port)]
    # The server's log goes to a file: an undrained pipe would fill and block the server.
    log_file = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            health = httpx.get(f"{url}/health", timeout=1).json()
            if health["index"]["state"] in ("ready", "failed"):
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError("server did not become ready")


async def run(args) -> dict:
    proc, url = start_server(args.repo, args.port, args.server_log)
    try:
        files = [(p.relative_to(args.repo).as_posix(), p.read_text(errors="replace"))
                 for p in sorted(args.repo.rglob("*.py")) if p.stat().st_size > 3000][:200]
        rng = random.Random(args.seed)
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=4 * args.sessions)) as client:
            for _ in range(3):  # warm-up
                await client.post(f"{url}/infill", json=body(files[0][1], 500, files[0][0]), timeout=60)
            rss_before = rss_mb(proc.pid)
            stats = {"latency": [], "status": {}, "errors": 0, "abandoned": 0, "superseded": 0, "paused": 0, "prefilled": [], "cached": []}
            deadline = time.monotonic() + args.seconds
            rss_series = asyncio.create_task(sample_rss(proc.pid, deadline, 5.0))
            # Each session edits its own files: two sessions typing in one file would supersede each other.
            await asyncio.gather(*(session(client, url, files[i :: args.sessions] or files, deadline, args.interval,
                                           random.Random(rng.random()), stats) for i in range(args.sessions)))
            await asyncio.sleep(1.0)
            rss_after = rss_mb(proc.pid)
            rss_series = await rss_series
        # A fresh client: cancelled requests can leave the load client's pool unusable.
        try:
            metrics = httpx.get(f"{url}/metrics", timeout=30).text
        except httpx.HTTPError as err:
            metrics = f"# metrics unavailable: {err!r}"
        lat = sorted(stats["latency"])
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None  # noqa: E731
        median = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
        gauge = lambda name: next((line.split()[1] for line in metrics.splitlines() if line.startswith(name + " ")), None)  # noqa: E731
        return {"sessions": args.sessions, "seconds": args.seconds, "completed": len(lat), "abandoned": stats["abandoned"],
                "superseded_answers": stats["superseded"], "pauses": stats["paused"],
                "status": stats["status"], "client_errors": stats["errors"],
                "server_5xx": sum(n for s, n in stats["status"].items() if s >= 500),
                "latency_ms_p50": pick(0.5), "latency_ms_p95": pick(0.95), "rss_mb_before": rss_before,
                "rss_mb_after": rss_after, "rss_mb_every_5s": rss_series,
                "prompt_cache_mb_after": float(gauge("specdec_prompt_cache_bytes") or 0) / 2**20,
                # The prompt cache is bounded (LRU); the rest of the process must stay flat.
                "rss_mb_after_minus_prompt_cache": rss_after - float(gauge("specdec_prompt_cache_bytes") or 0) / 2**20, "tau": gauge("specdec_tau"),
                "completed_prefill_tokens_p50": median(stats["prefilled"]),
                "completed_cached_tokens_p50": median(stats["cached"]), "server_alive_after": not metrics.startswith("# metrics unavailable")}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--interval", type=float, default=150, help="ms between keystrokes of one session")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    p.add_argument("--server-log", type=Path, default=Path("load_server.log"), help="the server's stdout and stderr")
    args = p.parse_args()
    args.sessions, args.seconds = min(args.sessions, 64), min(args.seconds, 600)
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["server_5xx"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
