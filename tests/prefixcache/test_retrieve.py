"""Retrieval: definitions across files, similar code, near-duplicates dropped, the budget kept,
and a context that stays put while the user types on one line."""

import pytest

from prefixcache import Index
from prefixcache.retrieve import SIMILAR_AFTER, SIMILAR_BEFORE, SIMILAR_RANK
from specdec import Engine, load_model
from specdec.prompt.retrieval import REFRESH_LINES, ContextSettings

STORE = '''import redis


class Store:
    """A key-value store over redis."""

    def __init__(self, url):
        self.redis_client = redis.from_url(url)

    def get_item(self, key, default=None):
        value = self.redis_client.get(key)
        return default if value is None else value.decode()

    def put_item(self, key, value):
        self.redis_client.set(key, value)
'''
APP = '''from pkg.store import Store


def main():
    store = Store("redis://localhost")
    store.put_item("a", "1")
    print(store.get_item(
'''
REPORT = "\n".join(f"def report_{i}(rows):\n    total = sum(row.amount for row in rows)\n    return total * {i}\n"
                   for i in range(12))

# A cursor after the first line of a report like pkg/report.py's, below code of its own (a
# neighbourhood of that one line alone would drop every report as a near-duplicate of it).
NEW_REPORT = ("import os\n\nLIMIT = 10\n\n\ndef helper(path):\n    return os.path.join(path, 'x')\n\n\n"
              "def report_99(rows):\n    total = sum(row.amount for row in rows)\n")


@pytest.fixture()
def repo(tmp_path):
    for rel, text in {"pkg/store.py": STORE, "pkg/app.py": APP, "pkg/report.py": REPORT,
                      "pkg/report_copy.py": REPORT.replace("* 3", "* 33")}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_definitions_of_imported_names_are_found_across_files(repo):
    index = Index.build(repo, workers=1)
    chunks = index.retrieve(APP, "", path="pkg/app.py", budget_chars=2000)
    texts = "\n".join(c.text for c in chunks)
    assert "def get_item(self, key, default=None):" in texts and "def put_item(self, key, value):" in texts
    assert all(c.path != "pkg/app.py" for c in chunks)
    kinds = [c.kind for c in chunks]
    assert "definition" in kinds and kinds == sorted(kinds)  # similar code last, nearest the file


def test_a_similar_window_is_cut_to_the_lines_after_its_best_match(repo):
    """A 24-line window fits no 128-token budget; the few lines around its line most like the
    cursor's do, and they hold what comes next."""
    index = Index.build(repo, workers=1)
    chunks = index.retrieve(NEW_REPORT, "", path="pkg/new.py", budget_chars=448, min_similarity=0.1)
    similar = [c for c in chunks if c.kind == "similar"]
    assert similar, [c.kind for c in chunks]
    best = similar[-1]
    assert best.end - best.start == SIMILAR_BEFORE + 1 + SIMILAR_AFTER
    assert "total = sum(row.amount for row in rows)" in best.text
    assert "return total *" in best.text.split("total = sum(row.amount for row in rows)", 1)[1]
    assert chunks[-1] is best  # the most relevant goes last, nearest the file


def test_a_near_duplicate_of_the_neighbourhood_is_not_packed(repo):
    index = Index.build(repo, workers=1)
    before = REPORT[: REPORT.index("def report_7")]
    chunks = index.retrieve(before, REPORT[len(before):], path="pkg/report.py", budget_chars=4000)
    assert all(c.path != "pkg/report_copy.py" for c in chunks), [c.path for c in chunks]


@pytest.mark.parametrize("budget", [0, 60, 200, 4000])
def test_the_budget_is_never_exceeded(repo, budget):
    index = Index.build(repo, workers=1)
    chunks = index.retrieve(APP, "", path="pkg/app.py", budget_chars=budget)
    assert sum(len(c.text) for c in chunks) <= budget


def test_recent_edits_of_other_files_are_offered(repo):
    index = Index.build(repo, workers=1)
    assert index.prepare_retrieval() > 0  # built before the edit, as a running server's is
    index.update("pkg/store.py", STORE + "\n    def delete_item(self, key):\n        self.redis_client.delete(key)\n")
    chunks = index.retrieve("import os\n\n\ndef unrelated():\n    ", "", path="pkg/other.py", budget_chars=4000)
    assert any(c.kind == "recent" and "delete_item" in c.text for c in chunks)


def test_a_cut_that_is_no_edit_is_not_offered_as_recent(repo):
    index = Index.build(repo, workers=1)
    assert index.prepare_retrieval() > 0
    index.update("pkg/store.py", STORE[: STORE.index("    def put_item")], edited=False)
    index.update("pkg/store.py", STORE, edited=False)
    chunks = index.retrieve("import os\n\n\ndef unrelated():\n    ", "", path="pkg/other.py", budget_chars=4000)
    assert not any(c.kind == "recent" for c in chunks)


def test_similar_windows_below_the_floor_stay_out(repo):
    index = Index.build(repo, workers=1)
    loose = index.retrieve(APP, "", path="pkg/new.py", budget_chars=4000, min_similarity=0.0)
    scores = [c.score - SIMILAR_RANK for c in loose if c.kind == "similar"]  # the Jaccard
    assert scores, [c.kind for c in loose]
    floor = (min(scores) + max(scores)) / 2 if min(scores) < max(scores) else max(scores)
    strict = index.retrieve(APP, "", path="pkg/new.py", budget_chars=4000, min_similarity=floor)
    assert all(c.score - SIMILAR_RANK > floor for c in strict if c.kind == "similar")
    assert len([c for c in strict if c.kind == "similar"]) < len(scores)


def test_context_settings_size_and_shape_the_prompt(repo, tiny_models):
    index = Index.build(repo, workers=1)
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), index)
    wide = engine.complete(APP, "\n", max_tokens=2, path="pkg/app.py")
    engine.set_context(ContextSettings(tokens=8))  # room for no chunk
    narrow = engine.complete(APP, "\n", max_tokens=2, path="pkg/app.py")
    assert wide.stats.context_chunks > 0 and narrow.stats.context_chunks == 0 and narrow.stats.retrieval_ms > 0
    engine.set_context(ContextSettings(tokens=0))
    off = engine.complete(APP, "\n", max_tokens=2, path="pkg/app.py")
    assert off.stats.context_chunks == 0 and off.stats.retrieval_ms == 0.0
    with pytest.raises(ValueError, match="tokens"):
        ContextSettings(tokens=-1)


def test_the_prompt_names_the_repository_and_the_file_only_with_context(repo, tiny_models):
    index = Index.build(repo, workers=1)
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), index)
    tokenizer = engine.prompts.tokenizer
    header = tokenizer.encode(f"<|repo_name|>{repo.name}\n", add_special_tokens=False).ids
    file_line = tokenizer.encode("<|file_sep|>pkg/app.py\n", add_special_tokens=False).ids

    def prompt(context: str = "auto") -> list[int]:
        engine.prompt_cache.clear()
        engine.complete(APP, "\n", max_tokens=1, path="pkg/app.py", context=context, strategy="ar")
        return engine.prompt_cache.entries[-1].tokens.tolist()  # the prompt and the token generated

    named, unnamed = prompt(), prompt("none")
    engine.set_context(ContextSettings(repository_format=False))
    bare = prompt()
    assert named[: len(header)] == header and _contains(named, file_line)
    for ids in (unnamed, bare):
        assert ids[: len(header)] != header and not _contains(ids, file_line)


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_context_stays_the_same_while_typing_on_near_the_line_it_was_chosen_for(repo, tiny_models):
    index = Index.build(repo, workers=1)
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), index)
    line = "    value = store.get_item("
    results = [engine.complete(APP + line[:n], "\n", max_tokens=4, path="pkg/app.py", document="app")
               for n in range(10, len(line))]
    assert results[0].stats.context_chunks > 0 and results[0].stats.retrieval_ms > 0
    assert all(r.stats.context_tokens == results[0].stats.context_tokens for r in results)
    assert all(r.stats.retrieval_ms == 0.0 for r in results[1:])  # chosen once for the line
    assert all(r.stats.prefill_tokens <= 8 for r in results[1:])  # the prompt cache stays warm
    typed_on = APP + line + "\n    other = 1\n    "
    near = engine.complete(typed_on, "", max_tokens=4, path="pkg/app.py", document="app")
    assert near.stats.retrieval_ms == 0.0  # two lines typed on: the same context, the cache warm
    far = typed_on + "".join(f"x_{i} = {i}\n    " for i in range(REFRESH_LINES))
    assert engine.complete(far, "", max_tokens=4, path="pkg/app.py", document="app").stats.retrieval_ms > 0
    up = engine.complete(APP, "", max_tokens=4, path="pkg/app.py", document="app")
    assert up.stats.retrieval_ms > 0  # the cursor went back up: chosen again
    off = engine.complete(APP + line, "\n", max_tokens=4, path="pkg/app.py", document="app", context="none")
    assert off.stats.context_chunks == 0


def test_enter_alone_refreshes_no_context_the_next_keystroke_does(repo, tiny_models):
    """Users pause after Enter: the line it completes counts towards a refresh only from the new
    line's first character, so the request they wait on keeps its context and its warm cache."""
    index = Index.build(repo, workers=1)
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), index)
    chosen = APP + "    a = 1\n    "
    assert engine.complete(chosen, "", max_tokens=2, path="pkg/app.py", document="d").stats.retrieval_ms > 0
    typed = chosen + "".join(f"x_{i} = {i}\n    " for i in range(REFRESH_LINES - 1)) + "last = 0"  # its lines: REFRESH_LINES
    assert engine.complete(typed, "", max_tokens=2, path="pkg/app.py", document="d").stats.retrieval_ms == 0.0
    entered = engine.complete(typed + "\n    ", "", max_tokens=2, path="pkg/app.py", document="d")
    assert entered.stats.retrieval_ms == 0.0 and entered.stats.prefill_tokens <= 8
    next_key = engine.complete(typed + "\n    y", "", max_tokens=2, path="pkg/app.py", document="d")
    assert next_key.stats.retrieval_ms > 0  # more than REFRESH_LINES lines typed on: chosen again


def test_a_changed_file_drops_its_old_definitions(repo):
    index = Index.build(repo, workers=1)
    assert index.prepare_retrieval() > 0
    index.update("pkg/store.py", STORE.replace("get_item", "fetch_item"))
    texts = "\n".join(c.text for c in index.retrieve(APP, "", path="pkg/app.py", budget_chars=4000))
    assert "def get_item" not in texts and "def put_item" in texts
    index.remove("pkg/store.py")
    assert all(c.path != "pkg/store.py" for c in index.retrieve(APP, "", path="pkg/app.py", budget_chars=4000))


def test_the_same_context_in_every_process(tmp_path):
    """Ties (definitions of names of one length, similar windows sharing as many words) are
    broken by place, not by the order of a set of strings, which changes from process to process
    with Python's string hashing: a restarted server, or a rerun evaluation, picks the same
    chunks for the same cursor."""
    import json
    import os
    import subprocess
    import sys

    names = ["alpha", "bravo", "delta", "gamma", "kappa", "omega"]
    for name in names:
        (tmp_path / f"{name}_mod.py").write_text(f"def {name}(rows):\n    total = len(rows)\n    return total\n")
    cursor = "def main(rows):\n    " + "\n    ".join(f"x = {name}(rows)" for name in names) + "\n    y = "
    (tmp_path / "main.py").write_text(cursor)
    script = ("import json, sys; from prefixcache import Index; index = Index.build(sys.argv[1], workers=1); "
              "print(json.dumps([(c.path, c.start) for c in index.retrieve(sys.argv[2], '', path='main.py', "
              "budget_chars=150)]))")
    picked = set()
    for seed in ("1", "2", "3", "4"):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path), cursor], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        picked.add(done.stdout)
    assert len(picked) == 1, picked
    assert len(json.loads(picked.pop())) >= 2  # the budget holds some of the tied chunks, not all


def test_imports_resolve_to_the_files_they_name_as_files_come_and_go():
    from prefixcache.retrieve import Retriever, _imported_paths

    retriever = Retriever()
    for path in ("src/pkg/store.py", "pkg/store.py", "pkg/web/__init__.py", "other/restore.py"):
        retriever.update(path, "x = 1\n", edited=False)
    text = "import os\nfrom pkg.store import Store\nfrom .web import app\nimport pkg.web\n"
    assert _imported_paths(text, retriever.paths_by_tail) == {"src/pkg/store.py", "pkg/store.py", "pkg/web/__init__.py"}
    retriever.remove("pkg/store.py")
    retriever.update("src/pkg/store.py", "y = 2\n")  # an edit keeps the file where it was
    assert _imported_paths(text, retriever.paths_by_tail) == {"src/pkg/store.py", "pkg/web/__init__.py"}
    retriever.remove("src/pkg/store.py")
    assert "store.py" not in retriever.paths_by_tail  # nothing left behind for a gone file
