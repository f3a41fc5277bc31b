"""Each listed language is parsed with its real grammar and yields its call chains as units."""

import pytest

from prefixcache import Index
from prefixcache.extract import extract

SNIPPETS = {
    "a.py": ("def f(self):\n    x = self.client.get(url, timeout=3)\n", ["self.client.get(url, timeout=3)", "client.get(url, timeout=3)", "get(url, timeout=3)"]),
    "a.js": ("function f() {\n  const r = this.client.fetch(url);\n}\n", ["this.client.fetch(url)", "client.fetch(url)"]),
    "a.ts": ("function f(): void {\n  let r: number = api.users.count(q);\n}\n", ["api.users.count(q)", "users.count(q)"]),
    "a.tsx": ("const A = () => { const v = props.items.map(fn); return <div/>; };\n", ["props.items.map(fn)"]),
    "a.go": ("package m\nfunc f() {\n\tx := client.Conn.Query(ctx)\n}\n", ["client.Conn.Query(ctx)", "Conn.Query(ctx)"]),
    "a.rs": ("fn f() {\n    let v = self.pool.get(key);\n}\n", ["self.pool.get(key)", "pool.get(key)"]),
    "a.java": ("class A { void f() { int n = this.repo.findAll(q); } }\n", ["this.repo.findAll(q)", "repo.findAll(q)"]),
    "a.c": ("int f(void) {\n    int n = ctx->ops.read(buf);\n}\n", ["ctx->ops.read(buf)", "read(buf)"]),
    "a.cpp": ("int f() {\n    auto n = std::max(a, b);\n}\n", ["std::max(a, b)"]),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_grammar_parses_and_extracts_units(name):
    text, expected = SNIPPETS[name]
    found = extract(name, text)
    assert found.parsed, f"{name} fell back to lines"
    for unit in expected:
        assert unit in found.units, (unit, sorted(found.units))


def test_text_files_use_the_line_fallback():
    found = extract("notes.txt", "alpha beta\ngamma\n")
    assert not found.parsed
    assert found.units["alpha beta"] == 1 and found.follows[("alpha beta", "gamma")] == 1


def test_strings_are_not_units():
    found = extract("s.py", 'x = """\n  foo.bar(baz)\n"""\n')
    assert "bar(baz)" not in found.units


def test_proposals_in_every_language(tmp_path):
    for name, (text, _) in SNIPPETS.items():
        (tmp_path / name).write_text(text)
    idx = Index.build(tmp_path, workers=1)
    assert [c.text for c in idx.propose("  const q = this.client.fe", path="b.js")][0].startswith("tch(url)")
    assert idx.propose("    y := client.Conn.Qu", path="b.go")[0].text == "ery(ctx)"
    assert idx.propose("  let w = self.po", path="b.rs")[0].text == "ol.get(key)"
