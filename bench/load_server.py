"""Load test: concurrent typing sessions against a real `specdec serve` on loopback.

    python bench/load_server.py --repo REPO [--client vim|vscode|cancel] [--sessions 16] [--seconds 60]

Each session types stretches of real files of the repository character by character (one
keystroke every --interval ms on average) and sends llama.vim's /infill body on each keystroke,
under one of three client behaviours (see session()). At each line end the user pauses; the
pause wait, from that keystroke to the answer for exactly that text, is what the report's
p50/p95/p99 are of, next to what the answer held (empty answers, tokens, stop reasons).
It also reports completions per second, answers shed as busy or capped, 5xx, tau under load,
/health probed once a second, and the server's RSS, threads and file descriptors sampled every
--sample-every seconds (a soak: --sessions 4 --seconds 600). Bounded: loopback only, at most
--sessions clients for --seconds.
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
    return _status_field(pid, "VmRSS") / 1024


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def process_sample(pid: int) -> dict:
    """RSS, threads and open file descriptors of the server: flat over a soak, or something leaks."""
    return {"rss_mb": round(rss_mb(pid), 1), "threads": _status_field(pid, "Threads"),
            "fds": len(list(Path(f"/proc/{pid}/fd").iterdir()))}


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
                                "speculation/stop_reason", "speculation/tokens_cap", "timings/prompt_ms",
                                "timings/predicted_ms"]}


async def session(client, url, files, deadline, interval, rng, stats, behaviour: str = "cancel"):
    """Types stretches of a real file into the document as a user would: the text after the
    stretch stays as it was (the suffix), the text before the cursor grows by one character per
    keystroke. At the end of each line the user pauses to read the suggestion; the pause wait,
    what the user waits for, runs from that keystroke to the answer for exactly that text.

    behaviour: "cancel" abandons the request in flight on every keystroke (disconnects);
    "vim" (llama.vim) keeps one request in flight, never cancels it, and a keystroke during it
    arms a 100 ms retry that sends the newest text once the request is done; "vscode"
    (llama.vscode) keeps one request in flight and sends the newest text as soon as it is done."""
    typist = Typist(client, url, stats, behaviour)
    while time.monotonic() < deadline:
        path, text = rng.choice(files)
        start = text.rfind("\n", 0, rng.randrange(0, max(1, len(text) - 400))) + 1
        end = min(len(text), start + rng.randrange(80, 400))
        for typed in range(start + 1, end + 1):
            if time.monotonic() >= deadline:
                break
            payload = body(text[:typed] + text[end:], typed, path)
            if text[typed - 1] == "\n" or typed == end:
                stats["paused"] += 1
                await typist.pause(payload)
                await asyncio.sleep(rng.uniform(0.3, 1.0))
            else:
                typist.keystroke(payload)
                await asyncio.sleep(interval / 1000 * rng.uniform(0.5, 1.5))
    await typist.drain()


class Typist:
    """One editor's requests under one of the client behaviours."""

    def __init__(self, client, url, stats, behaviour: str):
        self.client, self.url, self.stats, self.behaviour = client, url, stats, behaviour
        self.in_flight: asyncio.Task | None = None
        self.latest = None  # the newest text not yet sent (vim, vscode)

    def keystroke(self, payload) -> None:
        if self.behaviour == "cancel":
            if self.in_flight is not None and not self.in_flight.done():
                self.in_flight.cancel()  # the editor moved on: drop the stale request
                self.stats["abandoned"] += 1
            self.in_flight = asyncio.create_task(request(self.client, self.url, payload, self.stats))
        elif self.in_flight is None or self.in_flight.done():
            self.in_flight = asyncio.create_task(self._send_then_newest(payload))
        else:
            self.latest = payload  # sent when the request in flight is done

    async def _send_then_newest(self, payload) -> None:
        while payload is not None:
            await request(self.client, self.url, payload, self.stats)
            payload, self.latest = self.latest, None
            if payload is not None and self.behaviour == "vim":
                await asyncio.sleep(0.1)  # llama.vim's retry timer
                payload, self.latest = self.latest or payload, None

    async def pause(self, payload) -> None:
        """The user stops at a line end: the wait until the answer for this very text."""
        started = time.perf_counter()
        if self.behaviour == "cancel":
            self.keystroke(payload)
        else:
            if self.in_flight is not None and not self.in_flight.done():
                self.latest = None  # the stale request runs on; this text goes after it
                await asyncio.gather(self.in_flight, return_exceptions=True)
                if self.behaviour == "vim":
                    await asyncio.sleep(0.1)
            self.in_flight = asyncio.create_task(request(self.client, self.url, payload, self.stats))
        answer = (await asyncio.gather(self.in_flight, return_exceptions=True))[0]
        self.stats["pause_wait"].append((time.perf_counter() - started) * 1000)
        # What the user got at the pause: a short wait for an empty answer is no suggestion.
        answer = answer if isinstance(answer, dict) else {}
        self.stats["pause_tokens"].append(answer.get("timings/predicted_n", 0))
        # The server's own split of the wait: queued and prefilling (prompt_ms runs from its
        # arrival), then decoding; the rest is the client's wait for an older request and HTTP.
        self.stats["pause_server"].append((answer.get("timings/prompt_ms", 0.0), answer.get("timings/predicted_ms", 0.0),
                                           answer.get("timings/prompt_n", 0)))
        reason, reasons = answer.get("speculation/stop_reason", "none"), self.stats["pause_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1

    async def drain(self) -> None:
        if self.in_flight is not None:
            await asyncio.gather(self.in_flight, return_exceptions=True)


async def probe_health(url: str, deadline: float) -> list:
    """/health's latency once a second during the load, from its own connection."""
    times = []
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                await client.get(f"{url}/health", timeout=10)
                times.append(round((time.perf_counter() - start) * 1000, 1))
            except httpx.HTTPError:
                times.append(10_000.0)
            await asyncio.sleep(1.0)
    return times


async def sample_process(pid: int, deadline: float, every: float, url: str | None = None) -> list:
    """The server's RSS, threads and descriptors every `every` seconds during the load, and the
    prompt cache's bytes (bounded by its cap: the rest of the RSS must stay flat)."""
    series = []
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            sample = process_sample(pid)
            if url is not None:
                try:
                    metrics = (await client.get(f"{url}/metrics", timeout=10)).text
                    sample["prompt_cache_mb"] = round(float(gauge(metrics, "specdec_prompt_cache_bytes") or 0) / 2**20, 1)
                except httpx.HTTPError:
                    pass
            series.append(sample)
            await asyncio.sleep(every)
    return series


def gauge(metrics: str, name: str) -> str | None:
    """One gauge's value as /metrics writes it (None when absent)."""
    return next((line.split()[1] for line in metrics.splitlines() if line.startswith(name + " ")), None)


async def request(client, url, payload, stats):
    start = time.perf_counter()
    try:
        r = await client.post(f"{url}/infill", json=payload, timeout=30)
    except asyncio.CancelledError:
        raise
    except httpx.HTTPError as error:
        stats["errors"][type(error).__name__] = stats["errors"].get(type(error).__name__, 0) + 1
        return
    stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
    if r.status_code != 200:
        return None
    answer = r.json()
    reason = answer.get("speculation/stop_reason")
    if reason in ("superseded", "cancelled"):
        stats["superseded"] += 1
        return answer
    if reason == "busy":
        stats["busy"] += 1
        return answer
    stats["latency"].append((time.perf_counter() - start) * 1000)
    stats["prefilled"].append(answer.get("timings/prompt_n", 0))
    stats["cached"].append(answer.get("tokens_cached", 0))
    stats["capped"] += bool(answer.get("speculation/tokens_cap"))
    return answer


def start_server(repo: Path, port: int, log_path: Path, extra_args=()):
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--repo", str(repo), "--port", str(port), *extra_args]
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
    extra = ([] if args.prefetch else ["--no-prefetch"]) + (["--fim-mode", args.fim_mode] if args.fim_mode else [])
    extra += [] if args.context_tokens is None else ["--context-tokens", str(args.context_tokens)]
    proc, url = start_server(args.repo, args.port, args.server_log, extra)
    try:
        files = [(p.relative_to(args.repo).as_posix(), p.read_text(errors="replace"))
                 for p in sorted(args.repo.rglob("*.py")) if p.stat().st_size > 3000][:200]
        rng = random.Random(args.seed)
        # No cap on connections, as editors (curl, fetch) open one per request: a request cancelled
        # while its connection is being made can keep its pool slot (httpcore), and a capped
        # pool then runs out and stalls the next request for the whole timeout.
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
            for _ in range(3):  # warm-up
                await client.post(f"{url}/infill", json=body(files[0][1], 500, files[0][0]), timeout=60)
            rss_before = rss_mb(proc.pid)
            stats = {"latency": [], "pause_wait": [], "status": {}, "errors": {}, "abandoned": 0, "superseded": 0,
                     "paused": 0, "prefilled": [], "cached": [], "health_ms": [], "busy": 0, "capped": 0,
                     "pause_tokens": [], "pause_reasons": {}, "pause_server": []}
            deadline = time.monotonic() + args.seconds
            health = asyncio.create_task(probe_health(url, deadline))
            samples = asyncio.create_task(sample_process(proc.pid, deadline, args.sample_every, url))
            # Each session edits its own files: two sessions typing in one file would supersede each other.
            await asyncio.gather(*(session(client, url, files[i :: args.sessions] or files, deadline, args.interval,
                                           random.Random(rng.random()), stats, args.client)
                                   for i in range(args.sessions)))
            stats["health_ms"] = await health
            await asyncio.sleep(1.0)
            rss_after = rss_mb(proc.pid)
            samples = await samples
            after = process_sample(proc.pid)
            queue_after = httpx.get(f"{url}/health", timeout=10).json().get("queue_depth")
        # A fresh client: cancelled requests can leave the load client's pool unusable.
        try:
            metrics = httpx.get(f"{url}/metrics", timeout=30).text
        except httpx.HTTPError as err:
            metrics = f"# metrics unavailable: {err!r}"
        lat, waits = sorted(stats["latency"]), sorted(stats["pause_wait"])
        pick = lambda q, xs=lat: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None  # noqa: E731
        median = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
        cache_mb = float(gauge(metrics, "specdec_prompt_cache_bytes") or 0) / 2**20
        return {"client": args.client, "sessions": args.sessions, "seconds": args.seconds, "prefetch": args.prefetch,
                "fim_mode": args.fim_mode, "context_tokens": args.context_tokens,
                "pause_wait_ms": {"p50": pick(0.5, waits), "p95": pick(0.95, waits), "p99": pick(0.99, waits),
                                  "count": len(waits)},
                "completions_per_s": round(len(lat) / args.seconds, 2),
                "health_ms_max": max(stats["health_ms"], default=None),
                "completed": len(lat), "abandoned": stats["abandoned"], "busy_answers": stats["busy"],
                "capped_answers": stats["capped"],
                "pause_server_ms": {part: {"p50": pick(0.5, xs), "p95": pick(0.95, xs)}
                                    for part, xs in (("queued_and_prefill", sorted(a for a, _, _ in stats["pause_server"])),
                                                     ("decode", sorted(b for _, b, _ in stats["pause_server"])))},
                # The slowest pauses: [wait, queued and prefill, decode, prompt tokens prefilled] (ms).
                "slowest_pauses": sorted(([round(w), round(a), round(b), n] for w, (a, b, n)
                                          in zip(stats["pause_wait"], stats["pause_server"], strict=True)), reverse=True)[:8],
                "pause_answers": {"empty": sum(n == 0 for n in stats["pause_tokens"]),
                                  "tokens_p50": median(stats["pause_tokens"]), "stop_reasons": stats["pause_reasons"]},
                "superseded_answers": stats["superseded"], "pauses": stats["paused"],
                "status": stats["status"], "client_errors": stats["errors"],
                "server_5xx": sum(n for s, n in stats["status"].items() if s >= 500),
                "latency_ms_p50": pick(0.5), "latency_ms_p95": pick(0.95), "rss_mb_before": rss_before,
                "rss_mb_after": rss_after, "process_every_sample": samples, "process_after": after,
                "queue_depth_after": queue_after,
                "prompt_cache_mb_after": cache_mb,
                # The prompt cache is bounded (LRU); the rest of the process must stay flat.
                "rss_mb_after_minus_prompt_cache": rss_after - cache_mb, "tau": gauge(metrics, "specdec_tau"),
                "prefetch_metrics": prefetch_metrics(metrics),
                "completed_prefill_tokens_p50": median(stats["prefilled"]),
                "completed_cached_tokens_p50": median(stats["cached"]), "server_alive_after": not metrics.startswith("# metrics unavailable")}
    finally:
        stop_server(proc)


def stop_server(proc) -> None:
    """Ctrl-C, as a user stops it; killed if it has not exited 20 s later."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def prefetch_metrics(metrics: str) -> dict:
    """The specdec_prefetch_* lines of /metrics, {name with labels: value}."""
    return {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
            if line.startswith("specdec_prefetch")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--interval", type=float, default=150, help="ms between keystrokes of one session")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client", choices=("vim", "vscode", "cancel"), default="cancel",
                   help="how the editor treats a request in flight (see session())")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS/threads/fds samples")
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false", help="serve with --no-prefetch")
    p.add_argument("--fim-mode", choices=("psm", "spm"), help="serve with this FIM order (default: the model's)")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="serve with this many prompt tokens of retrieved context (0: none; default: the server's)")
    p.add_argument("--json", type=Path)
    p.add_argument("--server-log", type=Path, default=Path("load_server.log"), help="the server's stdout and stderr")
    args = p.parse_args()
    args.sessions, args.seconds = min(args.sessions, 64), min(args.seconds, 1800)
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["server_5xx"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
