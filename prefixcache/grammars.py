"""Tree-sitter grammars by file extension; the one place that knows where grammars come from.

We use tree-sitter-language-pack 0.13.0: it bundles compiled grammars for every language we
index and works with tree-sitter 0.26. tree-sitter-languages needs tree-sitter 0.21.3 (too old
for the Query/QueryCursor API used here), and language-pack 1.x downloads grammars at run time,
which fails on machines without network access.
"""

from functools import cache

import tree_sitter as ts
import tree_sitter_language_pack as pack

LANGUAGE_BY_EXTENSION = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
}

# Node types whose start is where a unit of code begins (an expression a user types anew):
# calls, member/attribute access chains, constructor calls, paths.
_UNIT_NODES = {
    "python": ["call", "attribute"],
    "javascript": ["call_expression", "member_expression", "new_expression"],
    "typescript": ["call_expression", "member_expression", "new_expression"],
    "tsx": ["call_expression", "member_expression", "new_expression"],
    "go": ["call_expression", "selector_expression"],
    "rust": ["call_expression", "field_expression", "scoped_identifier", "macro_invocation"],
    "java": ["method_invocation", "field_access", "object_creation_expression"],
    "c": ["call_expression", "field_expression"],
    "cpp": ["call_expression", "field_expression", "qualified_identifier"],
}
# Node types whose text is never a source of units (the trie proposes code, not prose). Only
# ones that can span lines matter (extract skips the rows they start on): Python's comments
# cannot, and capturing them cost a sixth of the query's time.
_OPAQUE_NODES = {
    "python": ["string"],
    "javascript": ["string", "template_string", "comment"],
    "typescript": ["string", "template_string", "comment"],
    "tsx": ["string", "template_string", "comment"],
    "go": ["interpreted_string_literal", "raw_string_literal", "comment"],
    "rust": ["string_literal", "raw_string_literal", "line_comment", "block_comment"],
    "java": ["string_literal", "line_comment", "block_comment"],
    "c": ["string_literal", "comment"],
    "cpp": ["string_literal", "raw_string_literal", "comment"],
}


def language_for(path: str) -> str | None:
    """The grammar name for a path, or None for the line-based fallback."""
    dot = path.rfind(".")
    return LANGUAGE_BY_EXTENSION.get(path[dot:].lower()) if dot >= 0 else None


@cache
def parser(language: str) -> ts.Parser:
    return pack.get_parser(language)


@cache
def unit_query(language: str) -> ts.Query:
    """Captures @unit for unit starts and @opaque for strings and comments."""
    units = " ".join(f"({t})" for t in _UNIT_NODES[language])
    opaque = " ".join(f"({t})" for t in _OPAQUE_NODES[language])
    return ts.Query(pack.get_language(language), f"[{units}] @unit [{opaque}] @opaque")


def captures(language: str, root) -> dict:
    return ts.QueryCursor(unit_query(language)).captures(root)
