"""Stop rules and prompt assembly (FIM order, context chunks, token healing)."""

from specdec.fim import PromptBuilder
from specdec.stops import rules_for


def test_single_line_stops_at_newline():
    rules = rules_for("x = foo(", ")\nnext()\n", "auto")
    assert rules.single_line and rules.cut("a, b\nc") == (4, "newline")


def test_multi_line_stops_at_dedent_and_repeats():
    rules = rules_for("def f():\n    ", "\n", "auto")
    assert not rules.single_line
    assert rules.cut("a = 1\n    b = 2\nc = 3\n") == (len("a = 1\n    b = 2"), "dedent")
    assert rules.cut("y = 0\n    y = 0\n    z") == (None, None)  # the first line lacks its indentation: no repeat
    text = "self.b = 0\nself.b = 0\n"
    assert rules_for("", "", "multi").cut(text) == (len("self.b = 0"), "repeat")


def test_stop_at_repeated_suffix_and_stop_strings():
    rules = rules_for("def f():\n    ", "\n    return x\n", "multi")
    assert rules.cut("y = 1\n    return x\n") == (5, "suffix")
    single = rules_for("call(", "arg)\n", "auto")
    assert single.cut("arg)")[1] == "suffix"
    assert rules_for("", "", "multi", stop=["END"]).cut("abcEND") == (3, "word")


def test_prompt_orders_and_healing(tiny_models):
    from specdec import load_model

    tok = load_model(tiny_models[0]).tokenizer
    builder = PromptBuilder(tok, "spm")
    spm = builder.build("def f():\n    return va", "\nprint(1)\n", extra=[("util.py", "x = 1\n")])
    sp = builder.special
    assert spm.ids[0] == sp["<|file_sep|>"]
    body = spm.ids[spm.ids.index(sp["<|fim_prefix|>"]):]
    assert body[:2] == [sp["<|fim_prefix|>"], sp["<|fim_suffix|>"]] and sp["<|fim_middle|>"] in body
    assert "va".endswith(spm.healed_text) and spm.healed_text
    assert all(builder.vocab_text[i].startswith(spm.healed_text) for i in spm.allowed_first)
    indent = builder.build("class A:\n    x = 1\n    ", "")
    assert indent.healed_text.endswith("    ") and indent.healed_text.startswith("\n")
    psm = PromptBuilder(tok, "psm").build("a = ", "\nb = 2\n")
    assert psm.ids[0] == sp["<|fim_prefix|>"] and psm.ids[-1] == sp["<|fim_middle|>"]
