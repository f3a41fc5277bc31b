"""The prompt: FIM formats and prompt building, retrieved repository context, tokenizing and detokenizing."""
