"""Evaluation metrics on hand-checked cases, leakage, divergence flagging, and a tiny end-to-end run."""

import json

from prefixcache import Index
from specdec_eval.__main__ import main as eval_main
from specdec_eval.metrics import edit_similarity, exact_match, levenshtein, percentile
from specdec_eval.points import Point, block_end, sample_points
from specdec_eval.runner import prepare_point, summarize


def test_metrics_hand_checked():
    assert levenshtein("kitten", "sitting") == 3
    assert edit_similarity("kitten", "sitting") == 1 - 3 / 7
    assert edit_similarity("", "") == 1.0 and edit_similarity("abc", "") == 0.0
    assert exact_match(" x = 1\n", "x = 1") and not exact_match("x = 2", "x = 1")
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([5], 0.99) == 5


def test_points_never_include_the_truth_in_the_prompt(tmp_path):
    (tmp_path / "m.py").write_text("".join(f"def f{i}(x):\n    return x * {i} + 1\n" for i in range(20)))
    for p in sample_points(tmp_path, 30, 3):
        text = (tmp_path / p.path).read_text()
        assert p.prefix + p.truth + p.suffix == text and p.truth


def test_block_end_stops_at_dedent():
    text = "def f():\n    a = 1\n    b = 2\nc = 3\n"
    cursor = text.index("a = 1")
    assert text[cursor : block_end(text, cursor, 4)] == "a = 1\n    b = 2"


def _rec(tokens, ms, passes=2, mode="single"):
    return {"tokens": tokens, "text": "".join(map(str, tokens)), "truth": "12", "ms": ms, "decode_ms": ms,
            "passes": passes, "generated": len(tokens), "accepted_by_source": {"bonus": passes}, "mode": mode}


def test_summary_figures_and_divergence_flag():
    records = {"ar": [_rec([1, 2], 10.0, 2), _rec([3], 8.0, 1)],
               "fast": [_rec([1, 2], 5.0, 1), _rec([3], 2.0, 1)],
               "wrong": [_rec([1, 2], 5.0, 1), _rec([4], 4.0, 1)]}
    s = summarize(records)
    assert s["fast"]["speedup_vs_ar"] == 3.0  # median of 2x and 4x
    assert s["fast"]["tau"] == 1.5 and s["ar"]["tau"] == 1.0
    assert s["fast"]["identical_to_ar"] == 1.0 and s["wrong"]["identical_to_ar"] == 0.5
    assert s["ar"]["exact_match"] == 0.5


def test_no_leakage_after_the_cursor(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    start = 1\n    unique_future_line = compute_secret()\n")
    (tmp_path / "b.py").write_text("def g():\n    other = 2\n")
    index = Index.build(tmp_path, workers=1)
    text = (tmp_path / "a.py").read_text()
    cursor = text.index("unique_future")
    point = Point("a.py", text[:cursor], "", text[cursor:], "multi")
    assert [c.text for c in index.propose("    unique_fu")]  # visible before the point is prepared
    prepare_point(index, point)
    for probe in ("    unique_fu", point.prefix, "x = compute_se"):
        assert all("unique_future" not in c.text and "secret" not in c.text for c in index.propose(probe))


def _tiny_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(3):
        (repo / f"m{i}.py").write_text(f"def f{i}(x):\n    value = x + {i}\n    return value * 2\n\n"
                                       f"def g{i}(y):\n    return f{i}(y) + {i}\n")
    return repo


def test_tiny_end_to_end_run(tiny_models, tmp_path):
    repo = _tiny_repo(tmp_path)
    out = tmp_path / "out"
    rc = eval_main(["run", "--repo", str(repo), "--points", "4", "--seed", "1", "--out", str(out),
                    "--target", str(tiny_models[0]), "--draft", str(tiny_models[1]), "--max-tokens", "8"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["strategies"]) == {"ar", "draft", "ngram", "trie", "hybrid"}
    for name, s in results["strategies"].items():
        assert s["identical_to_ar"] == 1.0, name
    assert len(results["expert_load"]["max_over_mean_per_layer"]) == 2
    for plot in ("latency_cdf.png", "tau_hist.png", "speedup_by_length.png", "expert_load.png", "report.md"):
        assert (out / plot).exists()
    assert eval_main(["compare", str(out / "results.json"), str(out / "results.json")]) == 0


def test_always_speculate_run_is_recorded_and_stays_lossless(tiny_models, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    # No line repeats: a history token could then only be another variant's answer replayed
    # (the text's own repeats count as history too).
    (repo / "m.py").write_text("def f(x):\n    value = x + 1\n    return value * 2\n\n"
                               "class Box:\n    size = 3\n\n    def grow(self, by):\n        self.size += by\n"
                               "\n\ndef names(rows):\n    return [row.name for row in rows if row]\n")
    out = tmp_path / "out"
    rc = eval_main(["run", "--repo", str(repo), "--points", "2", "--seed", "0", "--out", str(out), "--strategies", "hybrid",
                    "--target", str(tiny_models[0]), "--draft", str(tiny_models[1]), "--max-tokens", "6", "--always-speculate"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert results["adaptive"] is False and set(results["strategies"]) == {"ar", "hybrid"}
    assert results["strategies"]["hybrid"]["identical_to_ar"] == 1.0
    assert results["strategies"]["hybrid"]["accepted_by_source"]["history"] == 0  # no other variant's answer
    assert "--always-speculate" in (out / "report.md").read_text()


def test_typing_along_mode_times_the_follow_up(tiny_models, tmp_path):
    repo = _tiny_repo(tmp_path)
    out = tmp_path / "out"
    rc = eval_main(["run", "--repo", str(repo), "--points", "6", "--seed", "2", "--out", str(out), "--mode", "multi",
                    "--target", str(tiny_models[0]), "--draft", str(tiny_models[1]), "--max-tokens", "16",
                    "--strategies", "ar,hybrid", "--typing-along", "--always-speculate"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert results["typing_along"] is True
    hybrid = results["strategies"]["hybrid"]
    assert hybrid["points"] >= 3 and hybrid["identical_to_ar"] == 1.0
    assert hybrid["accepted_by_source"]["history"] > 0 and hybrid["tau"] > 1.5


def test_other_drafts_run_interleaved_on_held_out_files(tiny_models, tmp_path):
    import shutil

    from specdec.models.adapted import CARD, target_fingerprint

    repo = _tiny_repo(tmp_path)
    other = tmp_path / "adapted"
    shutil.copytree(tiny_models[1], other)
    (other / CARD).write_text(json.dumps({"target_fingerprint": target_fingerprint(tiny_models[0]),
                                          "held_out_files": ["m1.py", "m2.py", "gone.py"]}))
    out = tmp_path / "out"
    rc = eval_main(["run", "--repo", str(repo), "--points", "4", "--seed", "3", "--out", str(out),
                    "--target", str(tiny_models[0]), "--draft", str(tiny_models[1]), "--max-tokens", "8",
                    "--strategies", "ar,draft,hybrid", "--drafts", f"adapted={other}", "--held-out-of", str(other)])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["strategies"]) == {"ar", "draft", "hybrid", "draft+adapted", "hybrid+adapted"}
    assert all(s["identical_to_ar"] == 1.0 for s in results["strategies"].values())
    rows = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
    assert {r["path"] for r in rows} <= {"m1.py", "m2.py"}
    (other / CARD).write_text(json.dumps({"target_fingerprint": "0" * 64, "held_out_files": ["m1.py"]}))
    assert eval_main(["run", "--repo", str(repo), "--points", "2", "--out", str(out), "--target", str(tiny_models[0]),
                      "--drafts", f"adapted={other}"]) == 2
    assert eval_main(["run", "--repo", str(repo), "--points", "2", "--out", str(out), "--drafts", "bad"]) == 2


def test_context_variants_report_the_retrieval_that_chose_their_context(tiny_models, tmp_path):
    """The timed request reuses the context its point's earlier request retrieved (as typing
    does), so the report's retrieval time is that retrieval's, not the reuse's zero."""
    repo = _tiny_repo(tmp_path)
    out = tmp_path / "out"
    rc = eval_main(["run", "--repo", str(repo), "--points", "4", "--seed", "1", "--out", str(out), "--strategies", "ar",
                    "--context", "auto,none", "--target", str(tiny_models[0]), "--max-tokens", "4"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    auto, none = results["strategies"]["ar"]["context"], results["strategies"]["ar@none"]["context"]
    assert auto["chunks_per_point"] > 0 and auto["retrieval_ms"]["p50"] > 0
    assert none["chunks_per_point"] == 0 and none["retrieval_ms"] is None
    assert "| ar | " in (out / "report.md").read_text().split("## Repository context")[1]
