"""Where a truth's first line stands, and whether retrieval carries it, on a tiny real index."""

import json

from bench.retrieval_reach import classify, main, reach
from prefixcache import Index
from specdec_eval.points import Point

HANDLERS = '''import json


def load_settings(path):
    with open(path) as handle:
        settings = json.load(handle)
    settings.setdefault("timeout_seconds", 30)
    return settings
'''
CLIENT = '''import json


def read_config(path):
    with open(path) as handle:
        config = json.load(handle)
'''


def _repo(tmp_path):
    (tmp_path / "app").mkdir(parents=True)
    (tmp_path / "app" / "handlers.py").write_text(HANDLERS)
    (tmp_path / "app" / "client.py").write_text(CLIENT + '    settings.setdefault("timeout_seconds", 30)\n')
    return tmp_path


def _point(truth: str) -> Point:
    """A cursor before client.py's last line, whose text is `truth` (the file is prefix + truth + suffix)."""
    return Point(path="app/client.py", prefix=CLIENT + "    ", suffix="\n", truth=truth, mode="single")


def test_a_line_is_classed_by_where_it_stands():
    texts = {"app/handlers.py": HANDLERS, "app/client.py": CLIENT}
    assert classify('settings.setdefault("timeout_seconds", 30)', _point("x"), texts) == "only_elsewhere"
    assert classify("config = json.load(handle)", _point("x"), texts) == "in_file"
    assert classify("return x", _point("x"), texts) == "short"
    assert classify("raise ValueError(path)", _point("x"), texts) == "nowhere"


def test_retrieval_carries_a_line_only_another_file_holds(tmp_path):
    index = Index.build(_repo(tmp_path), workers=1)
    point = _point('settings.setdefault("timeout_seconds", 30)')
    found = reach(index, [point], budgets=[0, 128], min_similarity=0.2)
    assert found["classes"] == {"only_elsewhere": 1}
    assert found["budgets"]["0"]["found"] == 0 and found["budgets"]["128"]["found"] == 1
    assert index.retriever.texts["app/client.py"][-2].endswith('settings.setdefault("timeout_seconds", 30)')  # restored


def test_the_command_writes_its_figures_and_refuses_bad_budgets(tmp_path, capsys):
    out = tmp_path / "reach.json"
    assert main(["--repo", str(_repo(tmp_path / "repo")), "--points", "3", "--budgets", "64", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["points"] == 3 and set(written["budgets"]) == {"64"}
    try:
        main(["--repo", str(tmp_path), "--budgets", "many"])
    except SystemExit as exit_:
        assert exit_.code == 2
    assert "--budgets" in capsys.readouterr().err
