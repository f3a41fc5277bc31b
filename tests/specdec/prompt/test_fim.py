"""FIM prompts: each family's format and order, healing, and a layout that stays put while the user types."""

from specdec.prompt.fim import PromptBuilder


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
    assert spm.healing.left == spm.healed_text
    assert all(_spells_or_begins(builder.vocab_text[i], spm.healed_text) for i in spm.healing.allowed.tolist())
    indent = builder.build("class A:\n    x = 1\n    ", "")
    assert indent.healed_text.endswith("    ") and indent.healed_text.startswith("\n")
    psm = PromptBuilder(tok, "psm").build("a = ", "\nb = 2\n")
    assert psm.ids[0] == sp["<|fim_prefix|>"] and psm.ids[-1] == sp["<|fim_middle|>"]


def test_typing_past_the_budget_keeps_the_prompt_cache_valid(tiny_models):
    """A prefix longer than the budget is cut at an anchor line sized by the lines above the
    cursor's: typing one line character by character (its words merging and splitting into
    tokens) changes only the prompt's tail, whatever budget the cut falls against."""
    from specdec import load_model

    builder = PromptBuilder(load_model(tiny_models[0]).tokenizer, "spm", max_tokens=256)
    lines = [f"    value_{i} = compute(item_{i}, scale={i % 7})" for i in range(120)]
    text = "\n".join(lines) + "\n"
    typed_line = "    result = combine(value_1, value_2)\n"
    suffix = "\nreturn result\n"
    for budget in range(200, 264, 7):
        builder.max_tokens = budget
        previous, changed_early = None, 0
        for n in range(1, len(typed_line)):
            prompt = builder.build(text + typed_line[:n], suffix)
            assert prompt.truncated and len(prompt.ids) <= budget
            if previous is not None:
                common = next((i for i, (a, b) in enumerate(zip(previous, prompt.ids, strict=False)) if a != b),
                              min(len(previous), len(prompt.ids)))
                changed_early += min(len(previous), len(prompt.ids)) - common > 8
            previous = prompt.ids
        assert changed_early == 0, budget


def test_context_chunks_stay_while_a_short_prefix_grows(tiny_models):
    """The context takes the room the prefix leaves, sized in steps: typing into a short file
    must not drop a chunk at the prompt's front keystroke by keystroke."""
    from specdec import load_model

    builder = PromptBuilder(load_model(tiny_models[0]).tokenizer, "spm", max_tokens=512)
    extra = [(f"mod_{i}.py", f"def helper_{i}(x):\n    return x * {i} + offset_{i}\n" * 3) for i in range(12)]
    text = "\n".join(f"value_{i} = compute({i})" for i in range(20)) + "\n"
    typed_line = "result = combine(" + ", ".join(f"value_{i}" for i in range(12)) + ")"
    counts = {builder.build(text + typed_line[:n], "\n", extra).context_chunks for n in range(1, len(typed_line))}
    assert len(counts) == 1 and counts.pop() > 0


def test_enter_keeps_the_prompt_and_the_cut_moves_seldom(tiny_models):
    """Users pause after Enter and wait: typing real code (blank lines and all) into a prefix
    too long for the prompt, the Enter keystroke must prefill only what it added, and the cut
    (a prefill of the whole prefix) must move seldom as lines are typed."""
    from specdec import load_model
    from tests.helpers import STDLIB

    builder = PromptBuilder(load_model(tiny_models[0]).tokenizer, "spm", max_tokens=512)
    lines = (STDLIB / "argparse.py").read_text().split("\n")[:420]
    suffix = "\n" + "\n".join(lines[400:420])
    fed_at_enter, cut_moves, previous = [], 0, None
    for row in range(150, 400):
        before = "\n".join(lines[:row]) + "\n" + lines[row]  # the line typed, the cursor at its end
        typed = builder.build(before, suffix)
        entered = builder.build(before + "\n", suffix)
        assert typed.truncated and entered.truncated
        fed_at_enter.append(len(entered.ids) - _common(typed.ids, entered.ids))
        if previous is not None:  # the line's first keystroke, and its Enter
            cut_moves += len(typed.ids) - _common(previous, typed.ids) > 100
        cut_moves += fed_at_enter[-1] > 100
        previous = entered.ids
    assert max(fed_at_enter) <= 32, fed_at_enter  # the newline, and the healed word given back
    assert cut_moves <= 48, cut_moves  # 53 when blank lines, a few lines apart in code, were anchors too


def _common(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_window_sliding_by_whole_lines_keeps_the_cut(tiny_models):
    """llama.vim sends the last 256 lines: its window drops a line at the front per new line."""
    from specdec import load_model

    builder = PromptBuilder(load_model(tiny_models[0]).tokenizer, "spm", max_tokens=256)
    lines = [f"    value_{i} = compute(item_{i}, scale={i % 7})" for i in range(120)]
    full = builder.build("\n".join(lines) + "\n    x = ", "")
    slid = builder.build("\n".join(lines[1:]) + "\n    x = ", "")
    assert full.ids == slid.ids


def test_healing_takes_back_the_whole_word_being_typed():
    """`retu` tokenizes as `ret`+`u`: healing only `u` would leave `ret` in the prompt, a split the
    model never saw before `return`; the whole word goes, and `return` may start the completion."""
    from specdec import default_model_dir, load_model

    builder = PromptBuilder(load_model(default_model_dir() / "draft").tokenizer, "spm")
    pieces = [builder.vocab_text[i] for i in builder.encode("x = 1\n        retu")]
    assert pieces[-2:] == ["ret", "u"]  # the premise: the word spans two tokens
    prompt = builder.build("x = 1\n        retu", "")
    assert prompt.healed_text == "retu"
    assert "return" in {builder.vocab_text[i] for i in prompt.healing.allowed.tolist()}
    assert builder.build("value = get_field_na", "").healed_text.endswith("na")  # no single token covers it all
    assert builder.build("x = self.", "").healed_text == "."


def _spells_or_begins(token_text: str, healed: str) -> bool:
    """A token healing may allow: it spells the healed text and goes on, or spells its first part."""
    return token_text.startswith(healed) or (bool(token_text) and healed.startswith(token_text))


def _family_tokenizer(specials, split: str | None = None):
    """A small byte-level BPE (stdlib text) that carries one family's special tokens; split: the
    family's pre-tokenizer expression (default: GPT-2's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.helpers import CORPUS_FILES, STDLIB

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([(STDLIB / f).read_text() for f in CORPUS_FILES[:2]], trainer=trainer)
    return tokenizer


FAMILIES = {  # name: (special tokens, the family's default prompt for prefix P, suffix S, a context chunk)
    "qwen": (["<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>",
              "<|file_sep|>"], "<|repo_name|>demo\n<|file_sep|>util.py\nx = 1\n<|file_sep|>area.py\n"
                                "<|fim_prefix|><|fim_suffix|>{S}<|fim_middle|>{P}"),
    "starcoder": (["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<repo_name>",
                   "<file_sep>"], "<file_sep>util.py\nx = 1\n<fim_prefix>{P}<fim_suffix>{S}<fim_middle>"),
    "deepseek": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>"],
                 "# util.py\nx = 1\n<｜fim▁begin｜>{P}<｜fim▁hole｜>{S}<｜fim▁end｜>"),
    "codestral": (["<s>", "</s>", "[INST]", "[/INST]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]"],
                  "# util.py\nx = 1\n[SUFFIX]{S}[PREFIX]{P}"),
}


def test_each_familys_prompt_is_its_documented_string():
    prefix, suffix = "def area(r):\n    return 3.14 * r", "\n\nprint(area(2))\n"
    for name, (specials, documented) in FAMILIES.items():
        tokenizer = _family_tokenizer(specials)
        builder = PromptBuilder(tokenizer, None)
        assert builder.format.name == name
        prompt = builder.build(prefix, suffix, extra=[("util.py", "x = 1")], heal=False, repo="demo", path="area.py")
        expected = tokenizer.encode(documented.format(P=prefix, S=suffix), add_special_tokens=False).ids
        assert prompt.ids == expected, name
        eot = {"qwen": "<|endoftext|>", "starcoder": "<|endoftext|>", "deepseek": "<｜end▁of▁sentence｜>",
               "codestral": "</s>"}[name]
        assert tokenizer.token_to_id(eot) in builder.stop_ids
    starcoder = PromptBuilder(_family_tokenizer(FAMILIES["starcoder"][0]), None)
    assert {starcoder.special[t] for t in ("<fim_pad>", "<file_sep>")} <= starcoder.stop_ids


def test_healing_an_indentation_lets_the_next_word_take_its_space():
    """Qwen's split joins an indentation's last space to the next word (`\n`, 7 spaces, ` return`).
    Healing the indentation as one token (8 spaces) made that split unreachable, and the model
    indented again or wrote nothing: the healed text may now be spelled over several tokens, and
    the `\n` that every continuation splits off stays in the prompt."""
    from specdec.models.gguf_tokenizer import SPLITS

    builder = PromptBuilder(_family_tokenizer(FAMILIES["qwen"][0], SPLITS["qwen2"]), "spm")
    prefix = "x = 1\n        "
    natural = builder.encode(prefix + "return")
    assert [builder.vocab_text[i] for i in natural[-3:]] == ["\n", "       ", " return"]  # the premise
    prompt = builder.build(prefix, "")
    assert prompt.healed_text == "        " and builder.vocab_text[prompt.ids[-1]] == "\n"
    healing = prompt.healing
    for token in natural[-2:]:  # 7 spaces, then ` return`: each allowed in its turn
        assert healing.allows(token) and token in healing.allowed.tolist()
        healing = healing.after(token)
    assert healing is None  # all spelled: the completion goes on freely
    assert not prompt.healing.allows(builder.encode("x")[0])  # the indentation cannot be dropped
    deeper = builder.encode(" " * 11)
    assert len(deeper) == 1 and prompt.healing.allows(deeper[0])  # nor a deeper one refused
    assert builder.build("x = 1\n", "").healing is None  # a bare newline splits alike before anything


def test_fim_orders_and_refusals():
    import pytest

    from specdec.prompt.fim import PromptError

    qwen = _family_tokenizer(FAMILIES["qwen"][0])
    spm = PromptBuilder(qwen, "spm").build("a = ", "\nb = 2\n", heal=False)
    assert spm.ids == qwen.encode("<|fim_prefix|><|fim_suffix|>\nb = 2\n<|fim_middle|>a = ").ids
    with pytest.raises(PromptError, match="deepseek format has psm"):
        PromptBuilder(_family_tokenizer(FAMILIES["deepseek"][0]), "spm")
    with pytest.raises(PromptError, match="none of the FIM formats"):
        PromptBuilder(_family_tokenizer(["<|endoftext|>"]), None)


def _sentencepiece_tokenizer(prepend: str = "first"):
    """A small Metaspace BPE, as CodeLlama's sentencepiece tokenizer splits text, with its FIM tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.helpers import CORPUS_FILES, STDLIB

    tokenizer = Tokenizer(models.BPE(byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend)
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend)
    specials = ["<s>", "</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=list("☺"))
    tokenizer.train_from_iterator([(STDLIB / f).read_text() for f in CORPUS_FILES[:2]], trainer=trainer)
    return tokenizer


def test_codellama_prompts_follow_metas_reference_format():
    """<s>▁<PRE> {prefix}▁<SUF>{suffix}▁<MID> (and SPM <s>▁<PRE>▁<SUF>{suffix}▁<MID> {prefix}): the
    prefix keeps the space sentencepiece puts before a text's first word, the suffix does not."""
    tokenizer = _sentencepiece_tokenizer()
    bare = _sentencepiece_tokenizer("never")  # the same merges, no space put first
    bare.model = tokenizer.model
    ids = {t: tokenizer.token_to_id(t) for t in ("<s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>")}
    prefix, suffix = "def total(rows):\n    return ", "sum(rows)\n\nprint(total([1]))\n"
    psm = PromptBuilder(tokenizer, None)
    assert psm.format.name == "codellama" and psm.fim_mode == "psm" and ids["▁<EOT>"] in psm.stop_ids
    expected_suffix = bare.encode(suffix, add_special_tokens=False).ids
    assert expected_suffix != tokenizer.encode(suffix, add_special_tokens=False).ids  # the premise
    assert psm.build(prefix, suffix, heal=False).ids == [
        ids["<s>"], ids["▁<PRE>"], *tokenizer.encode(prefix, add_special_tokens=False).ids, ids["▁<SUF>"],
        *expected_suffix, ids["▁<MID>"]]
    spm = PromptBuilder(tokenizer, "spm").build(prefix, suffix, heal=False).ids
    assert spm == [ids["<s>"], ids["▁<PRE>"], ids["▁<SUF>"], *expected_suffix, ids["▁<MID>"],
                   *tokenizer.encode(prefix, add_special_tokens=False).ids]
    with_context = PromptBuilder(tokenizer, None).build(prefix, suffix, extra=[("util.py", "x = 1")], heal=False).ids
    assert with_context[0] == ids["<s>"] and tokenizer.decode(with_context[1:12]).startswith("# util.py")


def test_healing_with_sentencepiece_tokens_keeps_the_space_before_the_word():
    """A sentencepiece decoder drops the space of a text's first word (`▁return` alone decodes to
    `return`): healing must spell the tokens it takes out as they read after other text, or the
    prompt loses the space before the word being typed and the completion doubles or drops it."""
    tokenizer = _sentencepiece_tokenizer()
    builder = PromptBuilder(tokenizer, "psm")
    prefix = "def total(rows):\n    retu"
    prompt = builder.build(prefix, "", heal=True)
    assert prompt.healed_text.endswith("retu")
    kept = prompt.ids[2 : prompt.ids.index(tokenizer.token_to_id("▁<SUF>"))]  # after <s> ▁<PRE>
    assert tokenizer.decode(kept) + prompt.healed_text == prefix
    allowed = prompt.healing.allowed.tolist()
    assert allowed and all(_spells_or_begins(builder.vocab_text[i], prompt.healed_text) for i in allowed)
    assert tokenizer.token_to_id("▁return") is None or tokenizer.token_to_id("▁return") in allowed
