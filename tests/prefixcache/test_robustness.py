"""Hostile repositories: nothing crashes, bad files are skipped and counted."""

import os
import subprocess

from prefixcache import Index


def test_symlink_loop_binary_and_invalid_utf8(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "self_link.py").symlink_to(tmp_path / "self_link.py")
    (tmp_path / "blob.py").write_bytes(b"\x00\x01\x02binary" * 100)
    (tmp_path / "latin.py").write_bytes(b"name = caf\xe9_value(x)\n")
    idx = Index.build(tmp_path, workers=1)
    assert idx.summary["skipped"].get("binary") == 1
    assert idx.propose("name = caf")[0].text == "\ufffd_value(x)"


def test_huge_single_line_and_minified_files_are_skipped(tmp_path):
    (tmp_path / "huge.js").write_text("var a=" + "1+" * 2_500_000 + "1;")
    (tmp_path / "min.js").write_text("var b=" + "2+" * 300_000 + "2;")
    (tmp_path / "ok.js").write_text("const x = api.get(y);\n")
    idx = Index.build(tmp_path, workers=1)
    assert idx.summary["skipped"] == {"oversized": 1, "minified or vendored": 1}
    assert idx.propose("api.g")[0].text == "et(y)"


def test_deeply_nested_expression(tmp_path):
    depth = 10_000
    body = "(" * depth + "1" + ")" * depth
    text = "x = " + "\n".join(body[i : i + 80] for i in range(0, len(body), 80)) + "\nfoo.bar(1)\n"
    (tmp_path / "deep.py").write_text(text)
    idx = Index.build(tmp_path, workers=1)
    assert idx.propose("foo.b")[0].text == "ar(1)"


def test_file_deleted_while_indexing(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "gone.py").write_text("gone_value = 1\n")
    (tmp_path / "kept.py").write_text("kept_value = 2\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    os.remove(tmp_path / "gone.py")  # listed by git, missing on disk
    idx = Index.build(tmp_path, workers=1)
    assert idx.summary["skipped"] == {"not a regular file": 1}
    assert idx.propose("kept_v")[0].text == "alue = 2"


def test_parallel_build_equals_serial(tmp_path):
    for i in range(80):
        (tmp_path / f"m{i}.py").write_text(f"value_{i % 7} = compute_{i % 5}(x)\nshared.call({i})\n")
    serial, parallel = Index.build(tmp_path, workers=1), Index.build(tmp_path, workers=2)
    for q in ["value_3 = ", "shared.ca", "x = compute_"]:
        assert [c.text for c in serial.propose(q)] == [c.text for c in parallel.propose(q)]
