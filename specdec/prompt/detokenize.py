"""The text of a completion as its tokens arrive, equal to decoding them all at every token.

A completion's stop rules read its whole text after every token, and decoding the whole token
list again at each one grows with the completion and runs while the tokenizer's tables are
cold after the model's step. A byte-level BPE's text is the
UTF-8 of its tokens' bytes put end to end (a broken sequence reads U+FFFD), so the bytes of each
token are looked up once per tokenizer and the text is their concatenation, decoded in C.

Whether a tokenizer's decoding is that concatenation is checked once, against the tokenizer
itself: every token, and every prefix of a sample's tokens (it starts with a space, which some
decoders strip, and its characters span one to four bytes, so prefixes cut inside them). A
tokenizer that fails (sentencepiece drops the space of a text's first word, other decoders
fuse or strip) decodes its whole list at every token, as before.
"""

_SAMPLE = " def f(x):\n    return {'a': [x, 1.5]}  # été, 東京, 😀🎉\n\tpass\n"


def token_bytes(tokenizer, texts: list[str]) -> list[bytes] | None:
    """Each token id's bytes, when the tokenizer's decoding is their concatenation; else None.
    texts: each token's text as the tokenizer decodes it after other text (fim.token_texts, a
    decode of the whole vocabulary the prompt builder makes anyway), which a concatenating
    decoder gives as the text of the token's bytes."""
    names = [""] * len(texts)
    for name, i in tokenizer.get_vocab(with_added_tokens=True).items():
        if i < len(names):
            names[i] = name
    table = [_token_bytes(name) for name in names]
    if any(t.decode("utf-8", "replace") != text for t, text in zip(table, texts, strict=True)):
        return None
    ids = tokenizer.encode(_SAMPLE, add_special_tokens=False).ids
    prefixes = tokenizer.decode_batch([ids[:k] for k in range(1, len(ids) + 1)], skip_special_tokens=False)
    joined = b""
    for token, text in zip(ids, prefixes, strict=True):
        joined += table[token]
        if joined.decode("utf-8", "replace") != text:
            return None
    return table


class TextStream:
    """tokenizer.decode(tokens, skip_special_tokens=False) of a growing list of tokens.
    table: token_bytes(tokenizer), or None to decode the whole list at every token."""

    def __init__(self, tokenizer, table: list[bytes] | None):
        self.tokenizer, self.table = tokenizer, table
        self.tokens: list[int] = []
        self.bytes = bytearray()

    def append(self, token: int) -> str:
        """Add a token; the text of all the tokens so far."""
        self.tokens.append(token)
        if self.table is None:
            return self.tokenizer.decode(self.tokens, skip_special_tokens=False)
        if token < len(self.table):  # a model's vocabulary may outgrow its tokenizer's: decode skips those
            self.bytes += self.table[token]
        return self.bytes.decode("utf-8", "replace")


def _byte_alphabet() -> dict:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stands_for, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            stands_for[byte] = chr(byte)
        else:
            stands_for[byte] = chr(256 + extra)
            extra += 1
    return stands_for


_ALPHABET = _byte_alphabet()
_TO_BYTES = str.maketrans({char: chr(byte) for byte, char in _ALPHABET.items()})  # then latin-1: one byte a char
_OUTSIDE = str.maketrans(dict.fromkeys(_ALPHABET.values()))  # deletes the alphabet: what is left lies outside


def _token_bytes(token: str) -> bytes:
    """A token's bytes; a token with a character outside the alphabet (an added token's text)
    keeps its own UTF-8, as the tokenizer's byte-level decoder does."""
    if token.translate(_OUTSIDE):
        return token.encode("utf-8")
    return token.translate(_TO_BYTES).encode("latin-1")
