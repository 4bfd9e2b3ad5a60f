"""Diversity and collapse signals over sets of completions (token id sequences or strings).

Notation: a "sequence" is a list of tokens (ints or strings); a string is taken as its characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def _ngrams(seq: Sequence, n: int) -> list[tuple]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def _check_n(function: str, name: str, n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{function}: {name} must be an integer >= 1 (an n-gram size), got {n!r}.")


def _check_groups(function: str, rows: int, group_size) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{function}: group_size must be an integer >= 1, got {group_size!r}.")
    if rows % group_size:
        raise ValueError(
            f"{function}: {rows} rows do not split into groups of group_size={group_size}; pass whole groups "
            "(consecutive rows of one prompt)."
        )


def distinct_n(sequences: Sequence[Sequence], n: int) -> float:
    """Distinct-N (Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models"):
    distinct n-grams over all sequences / total n-grams over all sequences; 0.0 when there is no n-gram."""
    _check_n("distinct_n", "n", n)
    total, seen = 0, set()
    for seq in sequences:
        grams = _ngrams(seq, n)
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


def repetition_rate(sequence: Sequence, n: int) -> float:
    """Fraction of the n-grams of one sequence that repeat an earlier n-gram of it (loops score near 1)."""
    _check_n("repetition_rate", "n", n)
    grams = _ngrams(sequence, n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def self_bleu(sequences: Sequence[Sequence], *, max_n: int = 4) -> float:
    """Self-BLEU of one set of completions: mean BLEU of each against all the others.

    Sequences of any hashable tokens (token ids, words) or strings (taken as their characters). See
    :func:`self_bleu_batch` for the definition; this is its single-group form.
    """
    _check_n("self_bleu", "max_n", max_n)
    vocab: dict = {}
    sequences = [[vocab.setdefault(token, len(vocab)) for token in s] for s in sequences]
    if len(sequences) < 2:
        return 0.0
    width = max(1, max(len(s) for s in sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, : len(seq)] = 1
    return self_bleu_batch(ids, mask, len(sequences), max_n=max_n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (Codex, eq. 1): ``1 - C(n - c, k) / C(n, k)`` for c correct of n samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


# ---------------------------------------------------------------------------------------------------------------------
# Vectorised versions over a padded batch of token ids: what the callbacks run on every generation batch.
#
# n-grams are identified by a 64-bit polynomial hash of their token ids (wrapping int64 arithmetic): two different
# n-grams collide with probability ~ M^2 / 2^64 for M n-grams (< 1e-7 at a million), far below metric noise.
import torch  # noqa: E402

_HASH_BASE = 1_000_003


def ngram_codes(ids: torch.Tensor, mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash codes of every n-gram window and whether it lies inside the mask. (B, T) -> (B, T-n+1) twice."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    b, t = ids.shape
    if t < n:
        empty = ids.new_zeros((b, 0), dtype=torch.int64)
        return empty, empty.bool()
    windows = ids.long().unfold(1, n, 1)  # (B, T-n+1, n)
    codes = torch.zeros(windows.shape[:2], dtype=torch.int64, device=ids.device)
    for k in range(n):  # n <= 4 in practice: a loop over the n-gram order, not over tokens
        codes = codes * _HASH_BASE + windows[..., k] + 1
    valid = mask.bool().unfold(1, n, 1).all(-1)  # (B, T-n+1)
    return codes, valid


def _sorted_pairs(keys: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort (key, code) pairs by key then code (two stable sorts)."""
    order = torch.sort(codes, stable=True).indices
    keys, codes = keys[order], codes[order]
    order = torch.sort(keys, stable=True).indices
    return keys[order], codes[order]


def _new_pair(keys: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = (keys[1:] != keys[:-1]) | (codes[1:] != codes[:-1])
    return first


def distinct_n_batch(ids: torch.Tensor, mask: torch.Tensor, n: int, *, group_size: int | None = None) -> float:
    """Distinct-N over a padded batch: distinct n-grams / total n-grams (0.0 without n-grams).

    With ``group_size``, the mean over groups of consecutive ``group_size`` rows of each group's Distinct-N (how
    different the completions of one prompt are from each other).
    """
    _check_n("distinct_n_batch", "n", n)
    if group_size is not None:
        _check_groups("distinct_n_batch", ids.size(0), group_size)
    codes, valid = ngram_codes(ids, mask, n)
    rows = torch.arange(ids.size(0), device=ids.device).unsqueeze(1).expand_as(codes)
    keys = rows[valid] // group_size if group_size else torch.zeros_like(rows[valid])
    flat = codes[valid]
    if flat.numel() == 0:
        return 0.0
    keys, flat = _sorted_pairs(keys, flat)
    distinct = torch.bincount(keys[_new_pair(keys, flat)], minlength=int(keys.max()) + 1).float()
    total = torch.bincount(keys, minlength=int(keys.max()) + 1).float()
    present = total > 0
    return float((distinct[present] / total[present]).mean())


def repetition_rates(ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Per row, the fraction of its n-grams that repeat an earlier one of the same row; (B,), 0 without n-grams."""
    _check_n("repetition_rates", "n", n)
    codes, valid = ngram_codes(ids, mask, n)
    rows = torch.arange(ids.size(0), device=ids.device).unsqueeze(1).expand_as(codes)[valid]
    flat = codes[valid]
    out = torch.zeros(ids.size(0), device=ids.device)
    if flat.numel() == 0:
        return out
    rows, flat = _sorted_pairs(rows, flat)
    distinct = torch.bincount(rows[_new_pair(rows, flat)], minlength=ids.size(0)).float()
    total = torch.bincount(rows, minlength=ids.size(0)).float()
    return torch.where(total > 0, 1.0 - distinct / total.clamp(min=1.0), out)


def unique_fraction(ids: torch.Tensor, mask: torch.Tensor, group_size: int) -> float:
    """Mean over groups of (distinct completions / completions): 1/G when a group collapsed to one answer; 0.0 for an
    empty batch."""
    _check_groups("unique_fraction", ids.size(0), group_size)
    if ids.size(0) == 0:
        return 0.0
    lengths = mask.long().sum(1)
    powers = torch.cumprod(torch.full((ids.size(1),), _HASH_BASE, dtype=torch.int64, device=ids.device), 0)
    whole = ((ids.long() + 1) * mask.long() * powers).sum(1) * _HASH_BASE + lengths  # 64-bit hash of each row
    groups = torch.arange(ids.size(0), device=ids.device) // group_size
    groups, whole = _sorted_pairs(groups, whole)
    distinct = torch.bincount(groups[_new_pair(groups, whole)]).float()
    return float((distinct / group_size).mean())


def self_bleu_batch(ids: torch.Tensor, mask: torch.Tensor, group_size: int, *, max_n: int = 4) -> float:
    """Mean self-BLEU within groups (Zhu et al. 2018, "Texygen"): BLEU of each completion against the other
    completions of its group as references; high = the group says the same thing.

    BLEU (Papineni et al. 2002) with clipped n-gram precisions for n = 1..max_n, add-one smoothing for n > 1 (Lin &
    Och 2004) and the brevity penalty against the closest reference length. Vectorised with sorts and scatters.
    """
    _check_n("self_bleu_batch", "max_n", max_n)
    _check_groups("self_bleu_batch", ids.size(0), group_size)
    n_rows = ids.size(0)
    if n_rows == 0:
        return 0.0
    lengths = mask.long().sum(1)  # (N,)
    log_precision = torch.zeros(n_rows, device=ids.device)
    member = torch.arange(n_rows, device=ids.device)
    for n in range(1, max_n + 1):
        codes, valid = ngram_codes(ids, mask, n)
        rows = member.unsqueeze(1).expand_as(codes)[valid]
        flat = codes[valid]
        total = torch.bincount(rows, minlength=n_rows).float()
        clipped = torch.zeros(n_rows, device=ids.device)
        if flat.numel():
            groups = rows // group_size
            # Unique (group, code, row) triples with their counts; rows arrive ascending, stable sorts keep that.
            rows_s, flat_s, groups_s = rows, flat, groups
            order = torch.sort(flat_s, stable=True).indices
            rows_s, flat_s, groups_s = rows_s[order], flat_s[order], groups_s[order]
            order = torch.sort(groups_s, stable=True).indices
            rows_s, flat_s, groups_s = rows_s[order], flat_s[order], groups_s[order]
            new_triple = _new_pair(groups_s * n_rows + rows_s, flat_s)
            triple_id = torch.cumsum(new_triple.long(), 0) - 1
            counts = torch.bincount(triple_id).float()  # (U,)
            t_rows, t_codes, t_groups = rows_s[new_triple], flat_s[new_triple], groups_s[new_triple]
            block_new = _new_pair(t_groups, t_codes)  # same (group, code) -> one block
            block = torch.cumsum(block_new.long(), 0) - 1
            n_blocks = int(block.max()) + 1
            top1 = torch.zeros(n_blocks, device=ids.device).scatter_reduce(0, block, counts, "amax")
            at_top = (counts == top1[block]).float()
            n_top = torch.zeros(n_blocks, device=ids.device).scatter_add(0, block, at_top)
            below = torch.where(counts < top1[block], counts, torch.zeros_like(counts))
            top2 = torch.zeros(n_blocks, device=ids.device).scatter_reduce(0, block, below, "amax")
            mine_is_top = (counts == top1[block]) & (n_top[block] < 2)
            max_other = torch.where(mine_is_top, top2[block], top1[block])
            clipped = torch.zeros(n_rows, device=ids.device).scatter_add(0, t_rows, torch.minimum(counts, max_other))
        if n == 1:
            precision = torch.where(total > 0, clipped / total.clamp(min=1.0), torch.zeros_like(total))
        else:
            precision = (clipped + 1.0) / (total + 1.0)
        log_precision = log_precision + torch.log(precision.clamp(min=1e-9))
    grouped = lengths.view(-1, group_size).float()  # (P, G)
    gap = (grouped.unsqueeze(2) - grouped.unsqueeze(1)).abs()  # (P, G, G)
    gap = gap + torch.eye(group_size, device=ids.device) * 1e9 + grouped.unsqueeze(1) * 1e-6  # ties: shorter ref
    ref_len = torch.gather(grouped, 1, gap.argmin(dim=2)).view(-1)  # (N,)
    cand = lengths.float()
    brevity = torch.where(cand < ref_len, torch.exp(1.0 - ref_len / cand.clamp(min=1.0)), torch.ones_like(cand))
    bleu = brevity * torch.exp(log_precision / max_n)
    scored = lengths > 0
    return float(bleu[scored].mean()) if scored.any() else 0.0
