"""prefixcache: a repository's code indexed with tree-sitter into a marisa trie, proposing continuations at the cursor."""

from prefixcache.index import Index
from prefixcache.propose import Candidate
from prefixcache.retrieve import Chunk
from prefixcache.store import IndexFormatError

__all__ = ["Index", "Candidate", "Chunk", "IndexFormatError"]
