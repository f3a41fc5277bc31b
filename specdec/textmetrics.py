"""How close a completion is to the text it should have been: edit distance and similarity."""


def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def edit_similarity(prediction: str, truth: str) -> float:
    """1 - Levenshtein distance / the longer length (1.0 for two empty strings)."""
    longest = max(len(prediction), len(truth))
    return 1.0 if longest == 0 else 1.0 - levenshtein(prediction, truth) / longest
