"""Repeats: the tail of a text looked up in the repository's other files."""

from prefixcache import Index
from prefixcache.repeats import GRAM, Repeats, gram_hash

ROUTES = '''def install(app):
    app.router.add_route("/health", health_check, methods=["GET"])
    app.router.add_route("/ready", ready_check, methods=["GET"])
    app.router.add_route("/metrics", metrics_view, methods=["GET"])
'''
VIEWS = '''def install(app):
    app.router.add_route("/login", login_view, methods=["POST"])
'''


def test_the_tail_is_found_in_another_file_with_what_followed_it():
    repeats = Repeats({"routes.py": ROUTES, "views.py": VIEWS})
    found = repeats.continuations('def setup(app):\n    app.router.add_route("/metrics", metrics_view', "app.py")
    assert found[0].startswith(', methods=["GET"])\n')


def test_continuations_are_ranked_by_how_often_their_line_follows():
    texts = {"a.py": "r = f(value, flag=False)\n", "b.py": "r = f(value, flag=True)\nr = f(value, flag=True)\n"}
    found = Repeats(texts).continuations("x = f(value, flag=", "c.py")
    assert [f.split("\n", 1)[0] for f in found] == ["True)", "False)"]


def test_the_longest_tail_wins_over_a_more_frequent_shorter_one():
    texts = {"a.py": "total = compute(x, y)\n" * 3, "b.py": "result = unique_name(x, y) + 1\n"}
    found = Repeats(texts).continuations("answer = unique_name(x, y)", "c.py")
    assert found[0].startswith(" + 1\n")


def test_the_file_asked_about_is_left_to_the_history():
    repeats = Repeats({"routes.py": ROUTES})
    assert repeats.continuations('    app.router.add_route("/metrics", metrics_view', "routes.py") == []


def test_a_changed_file_is_searched_in_its_new_text_and_again_in_the_array_once_restored():
    repeats = Repeats({"routes.py": ROUTES, "views.py": VIEWS})
    query = '    app.router.add_route("/login", login_view'
    assert repeats.continuations(query, "app.py")[0].startswith(', methods=["POST"])')
    repeats.update("views.py", VIEWS.replace('"POST"', '"PUT"'))
    assert repeats.continuations(query, "app.py")[0].startswith(', methods=["PUT"])')
    assert "views.py" in repeats.changed
    repeats.update("views.py", VIEWS)
    assert "views.py" not in repeats.changed
    assert repeats.continuations(query, "app.py")[0].startswith(', methods=["POST"])')
    repeats.update("views.py", None)
    assert repeats.continuations(query, "app.py") == []


def test_a_continuation_stops_at_its_files_end_and_text_outside_ascii_keeps_its_bytes():
    repeats = Repeats({"a.py": 'greeting = "héllo wörld, the_end', "b.py": "tail_of_b = 1\n"})
    assert repeats.continuations('print("héllo wörld', "c.py") == [", the_end"]


def test_indentation_alone_and_short_texts_propose_nothing():
    repeats = Repeats({"a.py": "def f():\n" + " " * 16 + "return 1\n"})
    assert repeats.continuations("x = 1\n" + " " * 16, "c.py") == []
    assert repeats.continuations("f()", "c.py") == []
    assert Repeats({}).continuations("something long enough", None) == []


def test_files_past_the_byte_budget_are_left_out():
    repeats = Repeats({"a.py": "alpha_value = compute_alpha()\n", "b.py": "beta_value = compute_beta()\n"},
                      max_bytes=40)
    assert repeats.paths == ["a.py"]
    assert repeats.continuations("x = compute_beta(", "c.py") == []


def test_the_array_hash_is_the_lookup_hash():
    repeats = Repeats({"a.py": "abcdefghijklmnop"})
    corpus = repeats.corpus
    assert all(int(repeats.sorted[list(repeats.order).index(p)]) == gram_hash(corpus[p:p + GRAM])
               for p in range(len(corpus) - GRAM + 1))


def test_the_index_keeps_its_repeats_in_step_with_updates(tmp_path):
    (tmp_path / "routes.py").write_text(ROUTES)
    (tmp_path / "app.py").write_text("import routes\n")
    index = Index.build(tmp_path)
    query = '    app.router.add_route("/metrics", metrics_view'
    assert index.repeats_of(query, tmp_path / "app.py")[0].startswith(', methods=["GET"])')
    index.update("routes.py", ROUTES.replace("metrics_view, methods", "metrics_view, name"))
    assert index.repeats_of(query, "app.py")[0].startswith(', name=["GET"])')
    assert index.repeats_of(query, "routes.py") == []
