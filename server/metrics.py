"""Prometheus text-format metrics, kept in-process (no client library needed)."""

import threading
from collections import Counter

from specdec import EngineMetrics, Stats

LATENCY_BUCKETS_MS = (10, 25, 50, 100, 150, 200, 300, 500, 1000, 2500, 5000)


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = Counter()  # (endpoint, status) -> count
        self.latency = Counter()  # bucket upper bound -> count (cumulative at render)
        self.latency_sum = 0.0
        self.latency_count = 0
        self.accepted = Counter()  # source -> tokens
        self.generated = 0
        self.passes = 0
        self.cached_tokens = 0
        self.prefill_tokens = 0
        self.tree_nodes = 0
        self.experts_woken = 0

    def observe_request(self, endpoint: str, status: int, millis: float) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1
            self.latency_sum += millis
            self.latency_count += 1
            for bound in LATENCY_BUCKETS_MS:
                if millis <= bound:
                    self.latency[bound] += 1
                    break
            else:
                self.latency["+Inf"] += 1

    def observe_completion(self, stats: Stats) -> None:
        with self.lock:
            self.generated += stats.generated_tokens
            self.passes += stats.target_passes
            self.cached_tokens += stats.cached_tokens
            self.prefill_tokens += stats.prefill_tokens
            self.tree_nodes += stats.tree_nodes
            self.experts_woken += stats.experts_woken
            for source, n in stats.accepted_by_source.items():
                self.accepted[source] += n

    def render(self, engine: EngineMetrics) -> str:
        queue_depth, expert_load = engine.queue_depth, engine.expert_load
        prompt_cache = (engine.prompt_cache_entries, engine.prompt_cache_bytes)
        with self.lock:
            lines = ["# TYPE specdec_requests_total counter"]
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'specdec_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines.append("# TYPE specdec_request_latency_ms histogram")
            running = 0
            for bound in LATENCY_BUCKETS_MS:
                running += self.latency[bound]
                lines.append(f'specdec_request_latency_ms_bucket{{le="{bound}"}} {running}')
            lines.append(f'specdec_request_latency_ms_bucket{{le="+Inf"}} {running + self.latency["+Inf"]}')
            lines += [f"specdec_request_latency_ms_sum {self.latency_sum:.3f}",
                      f"specdec_request_latency_ms_count {self.latency_count}",
                      "# TYPE specdec_tau gauge",
                      f"specdec_tau {self.generated / self.passes if self.passes else 0.0:.4f}",
                      "# TYPE specdec_accepted_tokens_total counter"]
            for source, n in sorted(self.accepted.items()):
                lines.append(f'specdec_accepted_tokens_total{{source="{source}"}} {n}')
            lines += ["# TYPE specdec_generated_tokens_total counter", f"specdec_generated_tokens_total {self.generated}",
                      "# TYPE specdec_cached_prompt_tokens_total counter",
                      f"specdec_cached_prompt_tokens_total {self.cached_tokens}",
                      "# TYPE specdec_prefill_tokens_total counter", f"specdec_prefill_tokens_total {self.prefill_tokens}",
                      "# TYPE specdec_tree_nodes_total counter", f"specdec_tree_nodes_total {self.tree_nodes}",
                      "# TYPE specdec_experts_woken_total counter",
                      f"specdec_experts_woken_total {self.experts_woken}",
                      "# TYPE specdec_target_passes_total counter", f"specdec_target_passes_total {self.passes}",
                      "# TYPE specdec_queue_depth gauge", f"specdec_queue_depth {queue_depth}",
                      "# TYPE specdec_prompt_cache_entries gauge", f"specdec_prompt_cache_entries {prompt_cache[0]}",
                      "# TYPE specdec_prompt_cache_bytes gauge", f"specdec_prompt_cache_bytes {prompt_cache[1]}",
                      *_prefetch_lines(engine.prefetch),
                      "# TYPE specdec_expert_tokens_total counter"]
            for layer, row in enumerate(expert_load):
                for expert, n in enumerate(row):
                    lines.append(f'specdec_expert_tokens_total{{layer="{layer}",expert="{expert}"}} {int(n)}')
            return "\n".join(lines) + "\n"


def _prefetch_lines(counts) -> list:
    """Prefetch jobs by outcome, their CPU seconds, and the share of those spent on jobs never used."""
    lines = ["# TYPE specdec_prefetch_total counter"]
    lines += [f'specdec_prefetch_total{{outcome="{name}"}} {getattr(counts, name)}'
              for name in ("started", "served", "joined", "wasted")]
    return lines + ["# TYPE specdec_prefetch_cpu_seconds_total counter",
                    f'specdec_prefetch_cpu_seconds_total{{use="all"}} {counts.cpu_s:.3f}',
                    f'specdec_prefetch_cpu_seconds_total{{use="wasted"}} {counts.wasted_cpu_s:.3f}',
                    "# TYPE specdec_prefetch_wasted_cpu_share gauge",
                    f"specdec_prefetch_wasted_cpu_share {counts.wasted_share:.4f}"]
