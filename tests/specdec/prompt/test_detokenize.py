"""TextStream: a completion's text token by token, equal to decoding all its tokens each time."""

import random

import pytest
from tokenizers import decoders

from specdec import default_model_dir
from specdec.models.loader import load_model
from specdec.prompt.detokenize import TextStream, token_bytes
from specdec.prompt.fim import token_texts
from tests.specdec.prompt.test_fim import _sentencepiece_tokenizer


@pytest.fixture(scope="module")
def shipped_tokenizer():
    return load_model(default_model_dir() / "target").tokenizer


def _assert_streams_as_decoded(tokenizer, table, sequences) -> None:
    for ids in sequences:
        stream = TextStream(tokenizer, table)
        for k, token in enumerate(ids, 1):
            assert stream.append(token) == tokenizer.decode(ids[:k], skip_special_tokens=False), ids[:k]


def test_byte_level_text_is_its_tokens_bytes_end_to_end(shipped_tokenizer):
    table = token_bytes(shipped_tokenizer, token_texts(shipped_tokenizer))
    assert table is not None
    rng = random.Random(0)
    size = shipped_tokenizer.get_vocab_size()
    # random ids cut characters anywhere and mix in the special tokens; the code has 1-4 byte characters
    # and ids past the tokenizer's vocabulary, which a model's larger embedding can produce
    sequences = [[rng.randrange(size + 8) for _ in range(rng.randrange(1, 30))] for _ in range(150)]
    code = "    return {'k': café}  # 東京 😀\n\tx = [1, 2]\n"
    sequences.append(shipped_tokenizer.encode(code, add_special_tokens=False).ids)
    _assert_streams_as_decoded(shipped_tokenizer, table, sequences)


def test_sentencepiece_is_decoded_whole_and_keeps_its_first_word_rule():
    tokenizer = _sentencepiece_tokenizer()
    assert token_bytes(tokenizer, token_texts(tokenizer)) is None
    ids = tokenizer.encode("return total(rows)\n    pass", add_special_tokens=False).ids
    _assert_streams_as_decoded(tokenizer, None, [ids])


def test_a_byte_level_decoder_that_strips_a_leading_space_is_refused(shipped_tokenizer):
    """Each token alone reads the same after other text, so only whole texts show the strip."""
    stripping = load_model(default_model_dir() / "target").tokenizer
    stripping.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    assert token_bytes(stripping, token_texts(stripping)) is None
    ids = stripping.encode(" x = 1", add_special_tokens=False).ids
    _assert_streams_as_decoded(stripping, None, [ids])
