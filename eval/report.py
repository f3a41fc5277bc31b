"""report.md and PNG plots from a results.json and its per-point records."""

from contextlib import contextmanager
from pathlib import Path

from specdec import PLAIN


def write_markdown(results: dict, out: Path, command: str) -> None:
    rows = ["| strategy | tau | speedup vs ar | tokens/s | p50 ms | p95 ms | p99 ms | exact | edit sim | identical to ar | accepted (trie/draft/ngram/history/bonus) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in results["strategies"].items():
        a = s["accepted_by_source"]
        tau = f"{s['tau']:.2f}" if s["tau"] else "-"
        rows.append(f"| {name} | {tau} | {s['speedup_vs_ar']:.2f}x | {s['tokens_per_s']:.0f} | "
                    f"{s['latency_ms']['p50']:.0f} | {s['latency_ms']['p95']:.0f} | {s['latency_ms']['p99']:.0f} | "
                    f"{s['exact_match']:.2f} | {s['edit_similarity']:.2f} | {s['identical_to_ar']:.2f} | "
                    f"{a.get('trie', 0)}/{a.get('draft', 0)}/{a.get('ngram', 0)}/{a.get('history', 0)}/{a.get('bonus', 0)} |")
    passes = ["", "## Per target pass", "",
              "| strategy | tree nodes | share the draft drafted for | distinct experts woken (all layers) |",
              "| --- | --- | --- | --- |"]
    for name, s in results["strategies"].items():
        if s.get("per_pass"):
            p = s["per_pass"]
            passes.append(f"| {name} | {p['tree_nodes']:.1f} | {p.get('drafted', 0.0):.2f} | {p['experts_woken']:.1f} |")
    modes = ["", "## By mode", "", "| strategy | mode | points | tau | speedup | p50 ms | p95 ms |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in results["strategies"].items():
        for mode, m in s.get("by_mode", {}).items():
            modes.append(f"| {name} | {mode} | {m['points']} | {m['tau']:.2f} | {m['speedup_vs_ar']:.2f}x | "
                         f"{m['latency_ms']['p50']:.0f} | {m['latency_ms']['p95']:.0f} |")
    contexts = ["", "## Repository context", "",
                "| variant | chunks per point | tokens per point | retrieval p50 ms | p95 ms | first line exact | "
                "first line similarity | first request p50 ms | p95 ms |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    compared = any("@" in name for name in results["strategies"])  # a run with and without context
    for name, s in results["strategies"].items():
        if s.get("context") and (compared or s["context"]["chunks_per_point"]):
            contexts.append(_context_row(name, s))
    if len(contexts) == 5:
        contexts = []
    load = results.get("expert_load", {}).get("max_over_mean_per_layer", [])
    text = [f"# Evaluation: {results['repo']}", "", f"`{command}`", "",
            f"{results['points']} points, seed {results['seed']}, target `{results['target']}`, draft `{results['draft']}`, "
            f"machine: {results.get('machine', '')}",
            "" if results.get("adaptive", True) else "Speculating at every step (--always-speculate), whatever it costs.",
            "Typing along (--typing-along): each point is the follow-up after typing a suggestion's first 3 characters."
            if results.get("typing_along") else "",
            "", *rows, *passes, *modes, *contexts, "",
            f"Expert load (max/mean tokens per expert, by layer): {', '.join(f'{x:.2f}' for x in load)}", "",
            "Plots: latency_cdf.png, tau_hist.png, speedup_by_length.png, expert_load.png", ""]
    (out / "report.md").write_text("\n".join(text))


def write_plots(results: dict, records: dict, out: Path) -> None:
    with _figure(out / "latency_cdf.png", "Latency CDF", "latency (ms)", "fraction of completions") as ax:
        for name, rows in records.items():
            ms = sorted(r["ms"] for r in rows)
            ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], label=name)
        ax.set_xscale("log")
        ax.legend(fontsize=7)

    with _figure(out / "tau_hist.png", "tau histogram", "tau (tokens per target pass) per completion") as ax:
        for name, rows in records.items():
            taus = [r["generated"] / r["passes"] for r in rows if r["passes"]]
            if taus and name != PLAIN:
                ax.hist(taus, bins=20, alpha=0.5, label=name)
        ax.legend(fontsize=7)

    with _figure(out / "speedup_by_length.png", "Speedup by completion length", "completion length (tokens)",
                 "speedup vs ar") as ax:
        reference = records[PLAIN]
        for name, rows in records.items():
            if name == PLAIN:
                continue
            xs = [a["generated"] for a in reference]
            ys = [a["ms"] / r["ms"] if r["ms"] else 0 for a, r in zip(reference, rows, strict=True)]
            ax.scatter(xs, ys, s=8, alpha=0.5, label=name)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend(fontsize=7)

    load = results.get("expert_load", {}).get("tokens_per_expert", [])
    if load:
        with _figure(out / "expert_load.png", "Expert load", "expert", "MoE layer") as ax:
            image = ax.imshow(load, aspect="auto", cmap="viridis")
            ax.figure.colorbar(image, label="tokens routed")


@contextmanager
def _figure(path: Path, title: str, xlabel: str, ylabel: str | None = None):
    """One 6x4 plot: the body draws on the axes; titled, labelled and saved here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        yield ax
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        if ylabel:
            ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _context_row(name: str, s: dict) -> str:
    c, line = s["context"], s.get("first_line") or {}
    cells = [f"{c['chunks_per_point']:.1f}", f"{c['tokens_per_point']:.0f}", *_p50_p95(c.get("retrieval_ms"), 2),
             f"{line.get('exact_match', 0):.3f}", f"{line.get('edit_similarity', 0):.3f}",
             *_p50_p95(c.get("first_request_ms"), 0)]
    return f"| {name} | {' | '.join(cells)} |"


def _p50_p95(timing: dict | None, digits: int) -> list[str]:
    return [f"{timing['p50']:.{digits}f}", f"{timing['p95']:.{digits}f}"] if timing else ["-", "-"]
