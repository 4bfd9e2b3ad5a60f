"""Diversity and collapse signals over sets of completions (token id sequences or strings).

Notation: a "sequence" is a list of tokens (ints or strings); a string is taken as its characters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import comb
from typing import NamedTuple


def _ngrams(seq: Sequence, n: int) -> list[tuple]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def _check_n(function: str, name: str, n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{function}: {name} must be an integer >= 1 (an n-gram size), got {n!r}.")


def _check_ids(function: str, ids) -> None:
    """Token ids must be an integer tensor: float ids were cast to integers silently (0.3 -> 0), which gave
    plausible-looking but meaningless Distinct-N."""
    if getattr(ids, "is_floating_point", lambda: False)() or getattr(ids, "is_complex", lambda: False)():
        raise TypeError(
            f"{function}: token ids must be an integer tensor, got dtype {ids.dtype}. Fix: pass the tokenizer's ids "
            "(torch.long), not logits or probabilities."
        )


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
_FUSED_TOKENS = 2**13  # batch_diversity counts all n-gram orders in one pass up to this many tokens per order


def ngram_codes(ids: torch.Tensor, mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash codes of every n-gram window and whether it lies inside the mask. (B, T) -> (B, T-n+1) twice."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    b, t = ids.shape
    if t < n:
        empty = ids.new_zeros((b, 0), dtype=torch.int64)
        return empty, empty.bool()
    ids = ids.long()
    width = t - n + 1
    codes = ids[:, :width] + 1  # (B, T-n+1): the hash of the windows' first tokens
    for k in range(1, n):  # n <= 4 in practice: a loop over the n-gram order, not over tokens
        codes.mul_(_HASH_BASE).add_(ids[:, k : k + width]).add_(1)
    valid = mask.bool().unfold(1, n, 1).all(-1)  # (B, T-n+1)
    return codes, valid


def _run_starts(*columns: torch.Tensor) -> torch.Tensor:
    """Where a run of equal entries starts: the first element, and every element whose tuple of ``columns`` differs
    from the previous one. (M,) bool."""
    first = torch.ones_like(columns[0], dtype=torch.bool)
    if first.numel() > 1:
        changed = columns[0][1:] != columns[0][:-1]
        for column in columns[1:]:
            changed |= column[1:] != column[:-1]
        first[1:] = changed
    return first


class _NgramCounts(NamedTuple):
    """Exact n-gram counts of one padded batch for K n-gram orders, every count an integer (float32 for divisions).

    Shapes: K orders, N rows (completions), P = N / group_size groups.
    """

    row_total: torch.Tensor  # (K, N) valid n-grams of each row
    row_distinct: torch.Tensor  # (K, N) distinct n-grams of each row
    group_total: torch.Tensor  # (K, P) valid n-grams of each group
    group_distinct: torch.Tensor  # (K, P) distinct n-grams of each group
    batch_total: torch.Tensor  # (K,) valid n-grams of the batch
    batch_distinct: torch.Tensor  # (K,) distinct n-grams of the batch
    clipped: torch.Tensor | None  # (K, N) BLEU's clipped matches of each row against the other rows of its group


def _ngram_counts(
    ids: torch.Tensor, mask: torch.Tensor, orders: Sequence[int], group_size: int, *, clipped: bool
) -> _NgramCounts:
    """Every n-gram count the diversity metrics use, for all ``orders`` at once, from one stable sort per order.

    Each order's valid n-gram codes (row-major) are sorted stably, so inside a run of one code the rows ascend, and the
    sorted orders are laid end to end with an (order, row) key. A distinct (order, code, row) triple is then a run
    start in (code, order-row key), a distinct (order, code, group) one a run start in (code, order-group key), a
    distinct (order, code) one in (code, order): no second sort by row or group, and the counting runs once for all
    orders (few operations: the monitor runs this on a thread beside the training step).
    """
    n_rows, n_groups, k_orders = ids.size(0), ids.size(0) // group_size, len(orders)
    device = ids.device
    key_dtype = torch.int32 if k_orders * n_rows < 2**31 else torch.int64  # half the memory traffic of int64 keys
    flats, keys, row_totals = [], [], []
    for k, n in enumerate(orders):  # K <= 4 in practice: a loop over n-gram orders, not over tokens
        codes, valid = ngram_codes(ids, mask, n)  # (N, L) twice
        row_totals.append(valid.sum(1))  # (N,) integers until the end: float32 sums would round above 2^24
        key = torch.arange(k * n_rows, (k + 1) * n_rows, dtype=key_dtype, device=device).unsqueeze(1).expand_as(codes)
        every = bool(valid.all())  # no padding: no boolean indexing
        flat, key = (codes.reshape(-1), key.reshape(-1)) if every else (codes[valid], key[valid])  # (M_k,) row-major
        fits_int32 = n == 1 and flat.numel() and -(2**31) <= int(flat.min()) and int(flat.max()) < 2**31
        if fits_int32:  # unigram codes are token ids + 1: an int32 sort is ~3x faster and gives the same order
            sorted_flat, order = torch.sort(flat.int(), stable=True)
            flats.append(sorted_flat.long())
        else:
            sorted_flat, order = torch.sort(flat, stable=True)
            flats.append(sorted_flat)
        keys.append(key[order])
    row_total = torch.stack(row_totals)  # (K, N)
    flat = torch.cat(flats)  # (M,) sorted within each order's segment
    row_key = torch.cat(keys)  # (M,) k * N + row, ascending inside a run of one code
    group_key = row_key // group_size  # k * P + group (N = P * group_size)
    order_key = row_key // max(n_rows, 1)  # k
    new_code = _run_starts(flat)
    pair_start = new_code | _run_starts(row_key)  # first of each (order, code, row)
    block_start = new_code | _run_starts(group_key)  # first of each (order, code, group)
    batch_start = new_code | _run_starts(order_key)  # first of each (order, code)
    count = torch.zeros(k_orders * (n_rows + n_groups + 1), dtype=torch.long, device=device)
    count.index_add_(0, row_key, pair_start.long())
    count.index_add_(0, group_key + k_orders * n_rows, block_start.long())
    count.index_add_(0, order_key + k_orders * (n_rows + n_groups), batch_start.long())
    row_distinct, group_distinct, batch_distinct = count.float().split(
        [k_orders * n_rows, k_orders * n_groups, k_orders]
    )
    matches = None
    if clipped:
        starts = pair_start.nonzero().squeeze(1)  # (U,) where each distinct (order, code, row) triple's run starts
        counts = torch.diff(starts, append=starts.new_full((1,), flat.numel())).float()  # (U,) its occurrences
        matches = _clipped_matches(row_key[starts], counts, block_start[starts], k_orders * n_rows).view(k_orders, -1)
    return _NgramCounts(
        row_total=row_total.float(),
        row_distinct=row_distinct.view(k_orders, n_rows),
        group_total=row_total.view(k_orders, n_groups, group_size).sum(2).float(),
        group_distinct=group_distinct.view(k_orders, n_groups),
        batch_total=row_total.sum(1).float(),
        batch_distinct=batch_distinct,
        clipped=matches,
    )


def _clipped_matches(
    pair_rows: torch.Tensor, counts: torch.Tensor, block_new: torch.Tensor, n_rows: int
) -> torch.Tensor:
    """BLEU's clipped n-gram matches of each row against the other rows of its group as references (N,).

    Per distinct (code, row) pair in sorted order (U,): ``pair_rows`` its row, ``counts`` its occurrences in the row,
    ``block_new`` whether it starts a (code, group) block. A row's matches for a code are its count clipped at the
    largest count of that code among the other rows of the group (Papineni et al. 2002, modified precision).
    """
    if pair_rows.numel() == 0:
        return torch.zeros(n_rows, device=pair_rows.device)
    block = torch.cumsum(block_new.long(), 0) - 1  # (U,) block of each pair
    n_blocks = int(block[-1]) + 1
    zeros = counts.new_zeros(n_blocks)
    top1 = zeros.scatter_reduce(0, block, counts, "amax")[block]  # (U,) the block's largest count
    at_top = counts == top1
    n_top = zeros.scatter_add(0, block, at_top.float())[block]  # (U,) pairs of the block at that count
    top2 = zeros.scatter_reduce(0, block, torch.where(at_top, 0.0, counts), "amax")[block]  # (U,) next count
    max_other = torch.where(at_top & (n_top < 2), top2, top1)  # (U,) largest count among the other rows
    return counts.new_zeros(n_rows).scatter_add(0, pair_rows, torch.minimum(counts, max_other))


def distinct_n_batch(ids: torch.Tensor, mask: torch.Tensor, n: int, *, group_size: int | None = None) -> float:
    """Distinct-N over a padded batch: distinct n-grams / total n-grams (0.0 without n-grams).

    With ``group_size``, the mean over groups of consecutive ``group_size`` rows of each group's Distinct-N (how
    different the completions of one prompt are from each other).
    """
    _check_n("distinct_n_batch", "n", n)
    _check_ids("distinct_n_batch", ids)
    if group_size is not None:
        _check_groups("distinct_n_batch", ids.size(0), group_size)
    counts = _ngram_counts(ids, mask, [n], group_size or max(ids.size(0), 1), clipped=False)
    return _distinct(counts, 0, grouped=group_size is not None)


def _distinct(counts: _NgramCounts, k: int, *, grouped: bool) -> float:
    """Distinct-N of order ``k`` of ``counts``: over the batch, or the mean over groups with n-grams."""
    if grouped:
        total, distinct = counts.group_total[k], counts.group_distinct[k]  # (P,) twice
        present = total > 0
        return float((distinct[present] / total[present]).mean()) if present.any() else 0.0
    total = counts.batch_total[k]
    return float(counts.batch_distinct[k] / total) if total > 0 else 0.0


def repetition_rates(ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Per row, the fraction of its n-grams that repeat an earlier one of the same row; (B,), 0 without n-grams."""
    _check_n("repetition_rates", "n", n)
    _check_ids("repetition_rates", ids)
    return _repetition(_ngram_counts(ids, mask, [n], max(ids.size(0), 1), clipped=False), 0)


def _repetition(counts: _NgramCounts, k: int) -> torch.Tensor:
    total = counts.row_total[k]  # (N,)
    return torch.where(total > 0, 1.0 - counts.row_distinct[k] / total.clamp(min=1.0), torch.zeros_like(total))


def batch_diversity(
    ids: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    *,
    ngram_sizes: Sequence[int] = (1, 2, 3, 4),
    self_bleu_max_n: int | None = 4,
    repetition_n: int | None = 3,
    unique: bool = True,
) -> dict[str, float | torch.Tensor]:
    """All diversity values of one generation batch, each n-gram order counted once.

    The same values as the single functions: ``distinct_{n}`` (:func:`distinct_n_batch`) and ``distinct_{n}_in_group``
    (with ``group_size``) for n in ``ngram_sizes``; ``self_bleu`` (:func:`self_bleu_batch`, orders 1..max_n) unless
    ``self_bleu_max_n`` is None; ``repetition`` (:func:`repetition_rates`, a (N,) tensor) unless ``repetition_n`` is
    None; ``unique_frac`` (:func:`unique_fraction`) if ``unique``. One stable sort of all orders' n-grams serves
    every metric.
    """
    for n in ngram_sizes:
        _check_n("batch_diversity", "ngram_sizes", n)
    if self_bleu_max_n is not None:
        _check_n("batch_diversity", "self_bleu_max_n", self_bleu_max_n)
    if repetition_n is not None:
        _check_n("batch_diversity", "repetition_n", repetition_n)
    _check_groups("batch_diversity", ids.size(0), group_size)
    _check_ids("batch_diversity", ids)
    # a completion alone in its group has no reference: self-BLEU 0.0, as self_bleu_batch gives
    with_bleu = self_bleu_max_n is not None and ids.size(0) > 0 and group_size > 1
    bleu_orders = range(1, self_bleu_max_n + 1) if self_bleu_max_n is not None and with_bleu else ()
    orders = sorted({*ngram_sizes, *bleu_orders, *([repetition_n] if repetition_n is not None else [])})
    out: dict[str, float | torch.Tensor] = {}
    # Small batches count all orders in one pass (fewer operations); large ones one order at a time (arrays that fit
    # in cache): the same counts either way.
    per_pass = max(1, _FUSED_TOKENS // max(ids.numel(), 1))
    passes = [orders[i : i + per_pass] for i in range(0, len(orders), per_pass)]
    order_counts = []
    for chunk in passes:
        counts = _ngram_counts(ids, mask, chunk, group_size, clipped=any(n in bleu_orders for n in chunk))
        order_counts += [(counts, k) for k in range(len(chunk))]
    log_precision = torch.zeros(ids.size(0), device=ids.device)
    for n, (counts, k) in zip(orders, order_counts, strict=True):
        if n in ngram_sizes:
            out[f"distinct_{n}"] = _distinct(counts, k, grouped=False)
            out[f"distinct_{n}_in_group"] = _distinct(counts, k, grouped=True)
        if n == repetition_n:
            out["repetition"] = _repetition(counts, k)
        if n in bleu_orders:
            log_precision = log_precision + _log_precision(counts, k, n)
    if self_bleu_max_n is not None:
        out["self_bleu"] = _self_bleu(mask, log_precision, group_size, self_bleu_max_n) if bleu_orders else 0.0
    if unique:
        out["unique_frac"] = unique_fraction(ids, mask, group_size)
    return out


def unique_fraction(ids: torch.Tensor, mask: torch.Tensor, group_size: int) -> float:
    """Mean over groups of (distinct completions / completions): 1/G when a group collapsed to one answer; 0.0 for an
    empty batch."""
    _check_groups("unique_fraction", ids.size(0), group_size)
    _check_ids("unique_fraction", ids)
    if ids.size(0) == 0:
        return 0.0
    lengths = mask.long().sum(1)
    powers = torch.cumprod(torch.full((ids.size(1),), _HASH_BASE, dtype=torch.int64, device=ids.device), 0)
    whole = ((ids.long() + 1) * mask.long() * powers).sum(1) * _HASH_BASE + lengths  # 64-bit hash of each row
    groups = torch.arange(ids.size(0), device=ids.device) // group_size
    whole, order = torch.sort(whole, stable=True)  # equal hashes keep their row order, so groups ascend in a run
    groups = groups[order]
    distinct = torch.bincount(groups[_run_starts(whole, groups)], minlength=ids.size(0) // group_size).float()
    return float((distinct / group_size).mean())


def _log_precision(counts: _NgramCounts, k: int, n: int) -> torch.Tensor:
    """log of BLEU's modified precision of order ``k`` (n-grams of ``n``) per row (N,): add-one smoothed for n > 1
    (Lin & Och 2004)."""
    if counts.clipped is None:
        raise ValueError("_log_precision needs n-gram counts made with clipped=True (BLEU's clipped matches).")
    total, clipped = counts.row_total[k], counts.clipped[k]
    if n == 1:
        precision = torch.where(total > 0, clipped / total.clamp(min=1.0), torch.zeros_like(total))
    else:
        precision = (clipped + 1.0) / (total + 1.0)
    return torch.log(precision.clamp(min=1e-9))


def self_bleu_batch(ids: torch.Tensor, mask: torch.Tensor, group_size: int, *, max_n: int = 4) -> float:
    """Mean self-BLEU within groups (Zhu et al. 2018, "Texygen"): BLEU of each completion against the other
    completions of its group as references; high = the group says the same thing.

    BLEU (Papineni et al. 2002) with clipped n-gram precisions for n = 1..max_n, add-one smoothing for n > 1 (Lin &
    Och 2004) and the brevity penalty against the closest reference length. Vectorised with sorts and scatters.
    """
    _check_n("self_bleu_batch", "max_n", max_n)
    _check_groups("self_bleu_batch", ids.size(0), group_size)
    _check_ids("self_bleu_batch", ids)
    n_rows = ids.size(0)
    if n_rows == 0 or group_size < 2:  # a completion alone in its group has no reference: 0.0, as self_bleu gives
        return 0.0
    counts = _ngram_counts(ids, mask, range(1, max_n + 1), group_size, clipped=True)
    log_precision = torch.zeros(n_rows, device=ids.device)
    for k in range(max_n):
        log_precision = log_precision + _log_precision(counts, k, k + 1)
    return _self_bleu(mask, log_precision, group_size, max_n)


def _self_bleu(mask: torch.Tensor, log_precision: torch.Tensor, group_size: int, max_n: int) -> float:
    """Mean BLEU of the rows with tokens, from their summed log precisions (N,) and the brevity penalty against the
    closest reference length of the group (ties: the shorter)."""
    lengths = mask.long().sum(1)  # (N,)
    grouped = lengths.view(-1, group_size).float()  # (P, G)
    gap = (grouped.unsqueeze(2) - grouped.unsqueeze(1)).abs()  # (P, G, G)
    gap = gap + torch.eye(group_size, device=mask.device) * 1e9 + grouped.unsqueeze(1) * 1e-6  # ties: shorter ref
    ref_len = torch.gather(grouped, 1, gap.argmin(dim=2)).view(-1)  # (N,)
    cand = lengths.float()
    brevity = torch.where(cand < ref_len, torch.exp(1.0 - ref_len / cand.clamp(min=1.0)), torch.ones_like(cand))
    bleu = brevity * torch.exp(log_precision / max_n)
    scored = lengths > 0
    return float(bleu[scored].mean()) if scored.any() else 0.0


def prompt_information(ids: torch.Tensor, mask: torch.Tensor, group_size: int, *, n: int = 2) -> float:
    """How much a batch's completions say about their prompts: the mutual information I(X; P), in nats, between an
    n-gram X drawn from the batch's valid n-grams and the group (prompt) P it came from.

    I(X; P) = H(X) - H(X | P), entropies of the n-gram counts over the batch and within each group (groups weighted
    by their n-gram counts); 0 <= I <= log(groups). A run that learns its task raises it (each prompt's completions
    agree on their own answer: H(X | P) falls); a reward hack that pays for what does not depend on the prompt lowers
    it, by filling completions with the same text whatever the prompt (a keyword, a template: the shared n-grams
    dilute it) or by answering different prompts alike (H(X) falls). It is the detector's "prompt information"
    signal (:func:`trl_grpo_ext.core.hack_detection.drift_alarm`, docs/monitoring.md). 0.0 for a batch without n-grams.

    Shapes: ``ids``, ``mask`` (N, T), N a multiple of ``group_size``, consecutive rows a group.
    """
    _check_n("prompt_information", "n", n)
    _check_groups("prompt_information", ids.size(0), group_size)
    _check_ids("prompt_information", ids)
    codes, valid = ngram_codes(ids, mask, n)  # (N, W) twice
    groups = (torch.arange(ids.size(0), device=ids.device) // group_size).unsqueeze(1).expand_as(codes)  # (N, W)
    codes, groups = codes[valid], groups[valid]  # (M,)
    total = codes.numel()
    if total == 0:
        return 0.0

    def entropy_sum(counts: torch.Tensor) -> torch.Tensor:  # sum c log c over the counts
        counts = counts.double()
        return (counts * counts.log()).sum()

    _, code_counts = torch.unique(codes, return_counts=True)  # (distinct n-grams,)
    _, joint_counts = torch.unique(torch.stack([groups, codes]), dim=1, return_counts=True)  # (distinct pairs,)
    group_counts = torch.bincount(groups)  # (P,)
    # H(X) = log M - sum c log c / M; H(X|P) = sum_g (M_g/M) H_g = (sum_g M_g log M_g - sum c_gx log c_gx) / M
    h_x = math.log(total) - float(entropy_sum(code_counts)) / total
    h_x_given_p = (float(entropy_sum(group_counts[group_counts > 0])) - float(entropy_sum(joint_counts))) / total
    return max(h_x - h_x_given_p, 0.0)
