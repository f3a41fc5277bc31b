"""Metrics of completions against the ground truth and of timings."""

from specdec import edit_similarity, levenshtein  # noqa: F401 (the engine's own figures use them too)


def percentile(values, q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values) -> float:
    return percentile(values, 0.5)


def first_line(text: str) -> str:
    """The completion's first line that holds anything (a block's completion may start with a newline)."""
    return text.lstrip("\n").split("\n", 1)[0]


def exact_match(prediction: str, truth: str) -> bool:
    return prediction.strip() == truth.strip()
