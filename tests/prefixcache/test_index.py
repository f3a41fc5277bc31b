"""Building, proposing, updating and saving an index of a tiny real repository."""

import subprocess

import pytest

from prefixcache import Index, IndexFormatError
from prefixcache.cli import main as cli

SERVICE = """import redis

class Cache:
    def __init__(self, url):
        self.redis_client = redis.Redis.from_url(url)

    def touch(self, key, ttl):
        self.redis_client.expire(key, ttl)
        self.redis_client.expire(key, ttl)

    def drop(self, key):
        self.redis_client.delete(key)
        return True
"""
OTHER = """def helper(x):
    value = compute(x)
    return value
"""


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "cache.py").write_text(SERVICE)
    (root / "pkg" / "util.py").write_text(OTHER)
    (root / "other").mkdir()
    (root / "other" / "far.py").write_text("def helper(x):\n    value = far_away(x)\n")
    return root


def texts(candidates):
    return [c.text for c in candidates]


def test_mid_identifier_after_receiver_and_line_start(repo):
    idx = Index.build(repo, workers=1)
    assert "ient.expire(key, ttl)" in texts(idx.propose("    x = self.redis_cl", path="pkg/new.py"))
    assert texts(idx.propose("        self.redis_client.", path="pkg/new.py"))[0] == "expire(key, ttl)"
    # A line start: what followed `def helper(x):` elsewhere; the same directory ranks first.
    top = idx.propose("def helper(x):\n    ", path="pkg/new.py")
    assert top[0].text == "value = compute(x)" and top[0].source == "pkg/util.py"
    assert "value = far_away(x)" in texts(top)


def test_candidates_are_only_the_continuation(repo):
    idx = Index.build(repo, workers=1)
    for c in idx.propose("        self.redis_client.del", path="pkg/cache.py"):
        assert not c.text.startswith("self.redis_client")
    assert texts(idx.propose("        self.redis_client.del"))[0] == "ete(key)"


def test_update_and_remove_take_effect_immediately(repo):
    idx = Index.build(repo, workers=1)
    assert texts(idx.propose("    value = comp"))[0] == "ute(x)"
    idx.update("pkg/util.py", "def helper(x):\n    value = completely_new(x)\n")
    got = texts(idx.propose("    value = comp"))
    assert got[0] == "letely_new(x)" and "ute(x)" not in got
    idx.remove(repo / "pkg" / "util.py")  # an absolute path inside the root is the same file
    assert texts(idx.propose("    value = comp")) == []


def test_save_load_roundtrip_and_compaction(repo, tmp_path):
    idx = Index.build(repo, workers=1)
    idx.update("pkg/new.py", "zebra_stripes = count_stripes(zebra)\n")
    idx.save(tmp_path / "idx")
    loaded = Index.load(tmp_path / "idx")
    assert texts(loaded.propose("zebra_str"))[0] == "ipes = count_stripes(zebra)"
    assert texts(loaded.propose("        self.redis_client.")) == texts(idx.propose("        self.redis_client."))


def test_reindex_skips_unchanged_files(repo, tmp_path):
    out = tmp_path / "idx"
    assert cli(["index", str(repo), "--out", str(out)]) == 0
    idx = Index.load(out)
    (repo / "pkg" / "util.py").write_text("def helper(x):\n    return brand_new(x)\n")
    assert idx.refresh() == {"changed": 1, "removed": 0, "unchanged": 2}
    assert texts(idx.propose("    return brand"))[0] == "_new(x)"


def test_git_work_tree_uses_tracked_files(repo):
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("ignored.py\n")
    (repo / "ignored.py").write_text("secret_value = 1\n")
    idx = Index.build(repo, workers=1)
    assert texts(idx.propose("secret_v")) == []
    assert texts(idx.propose("    value = comp"))[0] == "ute(x)"


def test_walk_honours_gitignore(repo):
    (repo / ".gitignore").write_text("*.log\nbuild/\n")
    (repo / "x.log").write_text("logged_thing = 1\n")
    (repo / "build").mkdir()
    (repo / "build" / "gen.py").write_text("generated_thing = 1\n")
    idx = Index.build(repo, workers=1)
    assert texts(idx.propose("logged_t")) == [] and texts(idx.propose("generated_t")) == []


def test_load_errors_are_clear(repo, tmp_path):
    with pytest.raises(IndexFormatError, match="no index here"):
        Index.load(tmp_path / "missing")
    out = tmp_path / "idx"
    Index.build(repo, workers=1).save(out)
    manifest = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(manifest.replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(IndexFormatError, match="newer"):
        Index.load(out)
    (out / "manifest.json").write_text(manifest)
    data = (out / "units.marisa").read_bytes()
    (out / "units.marisa").write_bytes(data[: len(data) // 2])
    with pytest.raises(IndexFormatError, match="truncated or corrupt"):
        Index.load(out)
    (out / "units.marisa").write_bytes(data)
    (out / "arrays.npz").write_bytes(b"garbage")
    with pytest.raises(IndexFormatError, match="arrays.npz"):
        Index.load(out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="corrupt"):
        Index.load(out)


def test_cli_query_and_errors(repo, tmp_path, capsys):
    out = tmp_path / "idx"
    assert cli(["index", str(repo), "--out", str(out)]) == 0
    assert cli(["query", str(out), "        self.redis_client.", "-k", "2"]) == 0
    assert "expire(key, ttl)" in capsys.readouterr().out
    assert cli(["query", str(tmp_path / "nope"), "x"]) == 2
    assert "error" in capsys.readouterr().err


def test_tombstoned_file_hides_its_own_line_pairs(tmp_path):
    """A pair of common lines that follow each other only in the updated file is gone after the update."""
    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "b.py").write_text("y = 2\nz = 3\nx = 1\n")  # both lines occur elsewhere, the pair does not
    idx = Index.build(tmp_path, workers=1)
    assert "y = 2" in texts(idx.propose("x = 1\n"))
    idx.update("a.py", "x = 1\n")
    assert "y = 2" not in texts(idx.propose("x = 1\n"))


def test_repeated_updates_leave_the_overlay_as_one_update_would():
    """update() applies only the difference from the file's previous version; the result must
    equal the overlay of the last version alone."""
    from prefixcache.extract import extract
    from prefixcache.overlay import Overlay

    versions = ["a = client.get(url)\nb = a.json()\n", "a = client.get(url)\nb = a.text\nc = 1\n",
                "c = 1\nc = 1\nclient.post(url, data)\n"]
    incremental, other = Overlay(), Overlay()
    incremental.add("other.py", extract("other.py", "b = a.text\nz = 2\n"))
    other.add("other.py", extract("other.py", "b = a.text\nz = 2\n"))
    for text in versions:
        incremental.add("m.py", extract("m.py", text))
    other.add("m.py", extract("m.py", versions[-1]))
    assert dict(incremental.units) == dict(other.units)
    assert incremental.sorted_units == other.sorted_units
    assert {p: dict(c) for p, c in incremental.follows.items() if c} == {p: dict(c) for p, c in other.follows.items() if c}
    assert incremental.with_prefix("client.", 8) == other.with_prefix("client.", 8)


def test_parallel_build_equals_serial_build(tmp_path, monkeypatch):
    """Forked workers (the parent indexing files too), and counting in chunks, give exactly the serial tables."""
    from prefixcache import build
    from prefixcache.build import build_tables

    for i in range(140):
        shared = "import os\nvalue = os.path.join(root, name)\n" if i % 3 else ""
        (tmp_path / f"m{i:03d}.py").write_text(f"{shared}def f{i}(x):\n    return x.strip().split({i % 5})\n")
    serial, parallel = build_tables(tmp_path, workers=1), build_tables(tmp_path, workers=2)
    assert serial[0].entries() == parallel[0].entries() and len(serial[0].keys) > 100
    assert serial[1:] == parallel[1:]
    monkeypatch.setattr(build, "CHUNK_OCCURRENCES", 50)
    chunked = build_tables(tmp_path, workers=2)
    assert chunked[0].entries() == serial[0].entries() and chunked[1:] == serial[1:]


def test_compaction_keeps_what_proposals_saw(tmp_path):
    """Folding the overlay (updated and removed files) into a new trie changes no proposal's text."""
    (tmp_path / "a.py").write_text("import os\nroot = os.path.join(base, name)\nvalue = compute(root)\n")
    (tmp_path / "b.py").write_text("import os\nroot = os.path.join(base, name)\nunique_b = only_here(1)\n")
    (tmp_path / "c.py").write_text("gone_unit = removed_file(2)\nimport os\n")
    idx = Index.build(tmp_path, workers=1)
    idx.update("a.py", "import os\nroot = os.path.join(base, name)\nvalue = changed(root)\n")
    idx.remove("c.py")
    queries = ["root = os.p", "value = c", "unique_b = o", "gone_unit = r", "import os\n", "root = os.path.join(base, name)\n"]
    before = [texts(idx.propose(q)) for q in queries]
    idx.compact()
    assert [texts(idx.propose(q)) for q in queries] == before
    assert not any("emoved_file" in t for t in before[3]) and before[1] == ["hanged(root)"]
    assert [f["path"] for f in idx.files] == ["b.py", "a.py"]


def _three_files(tmp_path):
    (tmp_path / "a.py").write_text("alpha = first_call(1)\nshared = common(x)\n")
    (tmp_path / "b.py").write_text("beta = second_call(2)\nshared = common(x)\n")
    (tmp_path / "d.py").write_text("delta = doomed_call(4)\n")
    return Index.build(tmp_path, workers=1)


def test_changes_made_while_compacting_are_kept(tmp_path, monkeypatch):
    """The new static index is built without the index lock; updates and removals that land
    meanwhile must survive the swap exactly as if no compaction had run."""
    from prefixcache import compaction

    operations = [("update", "b.py", "beta = changed_during(2)\n"), ("update", "a.py", "alpha = again_during(1)\n"),
                  ("remove", "d.py", None), ("update", "e.py", "epsilon = brand_new(5)\n")]
    idx, reference = _three_files(tmp_path), _three_files(tmp_path)
    for index in (idx, reference):
        index.update("a.py", "alpha = before_fold(1)\nshared = common(x)\n")
    fold = compaction.fold

    def fold_while_editing(snap):
        folded = fold(snap)
        for op, path, text in operations:  # a concurrent editor, between the snapshot and the swap
            idx.update(path, text) if op == "update" else idx.remove(path)
        return folded

    monkeypatch.setattr(compaction, "fold", fold_while_editing)
    idx.compact()
    for op, path, text in operations:
        reference.update(path, text) if op == "update" else reference.remove(path)
    queries = ["alpha = ", "beta = ", "delta = d", "epsilon = b", "shared = c", "x = second_c", "y = doomed_c"]
    assert [texts(idx.propose(q)) for q in queries] == [texts(reference.propose(q)) for q in queries]
    assert texts(idx.propose("alpha = "))[0] == "again_during(1)" and texts(idx.propose("delta = d")) == []
    assert set(idx.overlay.per_file) == {"a.py", "b.py", "e.py"}  # what changed after the snapshot


def test_a_grown_overlay_compacts_on_a_background_thread(tmp_path, monkeypatch):
    from prefixcache import compaction, index

    idx = _three_files(tmp_path)
    folds = []
    fold = compaction.fold
    monkeypatch.setattr(compaction, "fold", lambda snap: folds.append(1) or fold(snap))
    monkeypatch.setattr(index, "COMPACT_UNITS", 3)
    idx.update("e.py", "epsilon = brand_new(5)\nzeta = more_units(6)\n")
    with idx._compacting:  # the background compaction has finished
        pass
    assert folds and not idx.overlay.per_file and "e.py" in [f["path"] for f in idx.files]
    assert texts(idx.propose("zeta = m"))[0] == "ore_units(6)"
