"""The prompt's pieces tokenized once: every token and offset must be what tokenizing whole gives."""

import random
from pathlib import Path

import pytest

from specdec import default_model_dir
from specdec.models.loader import load_model
from specdec.prompt.fim import PromptBuilder
from specdec.prompt.tokencache import TokenCache

SOURCES = sorted((Path(__file__).resolve().parents[3] / "specdec").rglob("*.py"))


@pytest.fixture(scope="module")
def shipped_tokenizer():
    return load_model(default_model_dir() / "draft").tokenizer


def _whole(tokenizer, text):
    encoding = tokenizer.encode(text, add_special_tokens=False)
    return tuple(encoding.ids), tuple(encoding.offsets)


def test_text_before_the_cursor_is_tokenized_as_whole_at_every_cursor(shipped_tokenizer):
    """The shipped tokenizer always splits before a newline after a visible character, so the
    lines above the cursor come from the cache; at random cursors in real files (mid-word,
    after indentation, on blank lines), ids and offsets equal the whole text's."""
    cache = TokenCache(shipped_tokenizer)
    assert cache.splits_before_newlines
    rng = random.Random(5)
    for path in SOURCES[:12]:
        text = path.read_text()
        for cursor in [rng.randrange(len(text)) for _ in range(12)] + [len(text)]:
            assert cache.encode_before_cursor(text[:cursor]) == _whole(shipped_tokenizer, text[:cursor]), (path, cursor)


def test_typing_a_line_reuses_the_lines_above_and_stays_exact(shipped_tokenizer):
    cache = TokenCache(shipped_tokenizer)
    text = SOURCES[0].read_text()
    start = text.index("\n", len(text) // 2) + 1
    line_end = text.index("\n", start)
    for cursor in range(start, line_end + 3):  # through the line's end and into the next line
        assert cache.encode_before_cursor(text[:cursor]) == _whole(shipped_tokenizer, text[:cursor])
    held = len(cache._held)
    assert held <= 4  # the lines above were tokenized once, not once a keystroke


def _joining_tokenizer():
    """A byte-level BPE whose pre-tokenizer joins punctuation to the newlines after it, as
    Qwen2's and Llama 3's do: `):\\n` is one piece, so text cannot be split before a newline."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    pattern = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([p.read_text() for p in SOURCES[:3]], trainer=trainer)
    return tokenizer


def test_a_tokenizer_that_joins_newlines_is_tokenized_whole():
    tokenizer = _joining_tokenizer()
    cache = TokenCache(tokenizer)
    assert not cache.splits_before_newlines
    text = SOURCES[1].read_text()
    for cursor in (len(text) // 3, len(text) // 2, len(text)):
        assert cache.encode_before_cursor(text[:cursor]) == _whole(tokenizer, text[:cursor])


def test_the_cache_holds_at_most_its_token_budget(shipped_tokenizer):
    cache = TokenCache(shipped_tokenizer, max_tokens=2000)
    texts = [p.read_text()[:3000] for p in SOURCES[:10]]
    for text in texts:
        assert cache.encode(text) == _whole(shipped_tokenizer, text)
        assert cache._tokens == sum(len(ids) for ids, _ in cache._held.values()) <= 2000
    assert texts[-1] in cache._held and texts[0] not in cache._held  # the least recently used went first


def test_prompts_built_keystroke_by_keystroke_equal_prompts_built_cold(shipped_tokenizer):
    """A builder that has seen the earlier keystrokes (suffix, chunks and lines above remembered)
    builds exactly the prompt a fresh builder builds, through cuts of a long file and healing."""
    warm = PromptBuilder(shipped_tokenizer, "spm", max_tokens=512)
    text = SOURCES[2].read_text()
    extra = [("util.py", SOURCES[3].read_text()[:800]), ("models.py", SOURCES[4].read_text()[:600])]
    rng = random.Random(9)
    for start in (len(text) // 4, len(text) // 2):
        for cursor in range(start, start + 40, 3):
            prefix, suffix = text[:cursor], text[cursor:]
            cold = PromptBuilder(shipped_tokenizer, "spm", max_tokens=512)
            chunks = extra if rng.random() < 0.7 else extra[:1]
            assert warm.build(prefix, suffix, chunks, reserve=128) == cold.build(prefix, suffix, chunks, reserve=128)


def test_the_head_of_a_text_is_the_first_tokens_of_the_whole(shipped_tokenizer):
    cache = TokenCache(shipped_tokenizer)
    text = "".join(p.read_text() for p in SOURCES[:4])
    whole = _whole(shipped_tokenizer, text)
    for at_least in (1, 500, 2999, len(text) // 2):
        ids, offsets = cache.encode_head(text, at_least)
        assert offsets[-1][1] >= at_least - 1 and len(ids) < len(whole[0])
        assert (ids, offsets) == (whole[0][: len(ids)], whole[1][: len(ids)]), at_least
    assert cache.encode_head(text[:400], 1000) is None  # nothing to cut
    assert TokenCache(_joining_tokenizer()).encode_head(text, 500) is None


@pytest.mark.parametrize("mode", ["spm", "psm"])
def test_a_long_suffix_is_tokenized_only_as_far_as_the_prompt_can_use(shipped_tokenizer, monkeypatch, mode):
    """Prompts equal those of a builder that tokenizes the whole suffix, at cursors near a long
    file's top, and the rest of the file is never tokenized."""
    text = "".join(p.read_text() for p in SOURCES[:6])
    cut = PromptBuilder(shipped_tokenizer, mode, max_tokens=512)
    whole = PromptBuilder(shipped_tokenizer, mode, max_tokens=512)
    monkeypatch.setattr(whole.pieces, "encode_head", lambda text, at_least: None)
    extra = [("util.py", SOURCES[7].read_text()[:700])]
    for cursor in (0, 7, 1500, 4000, len(text) - 2500, len(text) - 300):
        prefix, suffix = text[:cursor], text[cursor:]
        for reserve in (0, 128):
            assert cut.build(prefix, suffix, extra, reserve=reserve) == whole.build(prefix, suffix, extra, reserve=reserve)
    assert all(len(held) < len(text) // 2 for held in cut.pieces._held)
