"""Diversity and collapse signals over sets of completions (token id sequences or strings).

Notation: a "sequence" is a list of tokens (ints or strings); a string is taken as its characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def _ngrams(seq: Sequence, n: int) -> list[tuple]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def distinct_n(sequences: Sequence[Sequence], n: int) -> float:
    """Distinct-N (Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models"):
    distinct n-grams over all sequences / total n-grams over all sequences; 0.0 when there is no n-gram."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    total, seen = 0, set()
    for seq in sequences:
        grams = _ngrams(seq, n)
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


def repetition_rate(sequence: Sequence, n: int) -> float:
    """Fraction of the n-grams of one sequence that repeat an earlier n-gram of it (loops score near 1)."""
    grams = _ngrams(sequence, n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (Codex, eq. 1): ``1 - C(n - c, k) / C(n, k)`` for c correct of n samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
