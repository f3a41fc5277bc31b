"""Stop rules: single line, dedent, repeats, the suffix and stop strings."""

from specdec.decode.stops import rules_for


def test_single_line_stops_at_newline():
    rules = rules_for("x = foo(", ")\nnext()\n", "auto")
    assert rules.single_line and rules.cut("a, b\nc")[:2] == (4, "newline")


def test_multi_line_stops_at_dedent_and_repeats():
    rules = rules_for("def f():\n    ", "\n", "auto")
    assert not rules.single_line
    assert rules.cut("a = 1\n    b = 2\nc = 3\n")[:2] == (len("a = 1\n    b = 2"), "dedent")
    assert rules.cut("y = 0\n    y = 0\n    z")[:2] == (None, None)  # the first line lacks its indentation: no repeat
    text = "self.b = 0\nself.b = 0\n"
    assert rules_for("", "", "multi").cut(text)[:2] == (len("self.b = 0"), "repeat")


def test_a_dedent_is_decided_by_the_first_character_of_the_shorter_line():
    rules = rules_for("class P:\n    def f(self):\n        self.", "", "multi")
    assert rules.cut("y = y\n\n    ")[:2] == (None, None)  # the indentation may still grow
    assert rules.cut("y = y\n\n        ")[:2] == (None, None)
    assert rules.cut("y = y\n\n    d")[:2] == (len("y = y\n"), "dedent")  # no need to wait for the line's end
    assert rules.cut("y = y\n        z")[:2] == (None, None)


def test_stop_at_repeated_suffix_and_stop_strings():
    rules = rules_for("def f():\n    ", "\n    return x\n", "multi")
    assert rules.cut("y = 1\n    return x\n")[:2] == (5, "suffix")
    single = rules_for("call(", "arg)\n", "auto")
    assert single.cut("arg)")[1] == "suffix"
    assert rules_for("", "", "multi", stop=["END"]).cut("abcEND") == (3, "word", "END")


def test_stop_outcome_names_the_string_that_matched():
    rules = rules_for("", "", "multi", stop=["never", "}", "};"])
    assert rules.cut("a = {1};\nb") == (len("a = {1"), "word", "};")  # the longest at the earliest place
    assert rules_for("", "", "multi", stop=["x", "END"]).cut("abcEND...x") == (3, "word", "END")
