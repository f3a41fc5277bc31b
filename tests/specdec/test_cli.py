"""`specdec complete` with the FIM order chosen on the command line, and refused when the
target's family lacks it."""

import json

from specdec.cli import main as cli_main


def test_fim_mode_flag_is_used_and_checked(tiny_models, tmp_path, capsys):
    source = tmp_path / "f.py"
    source.write_text("def f(x):\n    return x\n")
    models = ["--target", str(tiny_models[0]), "--draft", str(tiny_models[1])]
    for mode in ("psm", "spm"):
        assert cli_main(["complete", str(source), "--line", "2", "--col", "4", "--max-tokens", "3", "--json",
                         "--fim-mode", mode, *models]) == 0
        assert "text" in json.loads(capsys.readouterr().out)
    assert cli_main(["complete", str(source), "--line", "2", "--col", "4", "--fim-mode", "suffix_first", *models]) == 2
    assert "fim mode 'suffix_first'" in capsys.readouterr().err
