"""Split completions into steps and map each step's end to a completion-token index.

A step is a piece of the completion text between separators (TRL's PRM convention: ``step_separator``, default
``"\\n"``) that holds at least one non-blank character; blank pieces (two separators in a row, a trailing separator)
are not steps. A step's tokens run up to and including its closing separator (TRL's PRM data puts the step label on
the separator's last token). A completion without any separator is one step. The **last step ends at the last
completion token**
(EOS included), so the stop decision shares the reward of the last step.

Mapping characters to tokens must survive tokenizers that merge the separator into a neighbouring token (``".\\n"``),
byte-level pieces, special tokens (EOS ends every finished completion) and decode normalisation.
:func:`char_ends_to_tokens` is linear in the completion length on its two main paths:

1. the special tokens are set aside and the decoded text is re-encoded once with offsets; when that round-trips to
   the remaining ids (the policy sampled the canonical tokenization), the offsets give every token's end;
2. otherwise (a non-canonical tokenization) every token's text is found by decoding it with a few tokens of left
   context, all windows in one batch, and used when the pieces add up to the decoded text;
3. only when neither applies (a decoder whose pieces do not add up, e.g. a character split across bytes inside a
   window) it binary-searches the shortest decoded prefix that covers each step's last character.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Steps:
    """The steps of one completion.

    Attributes:
        texts: step texts (separators excluded).
        ends: completion-token index of each step's last token, non-decreasing (two steps that end inside the same
            merged token share its index; their normalised rewards then add up there).
    """

    texts: list[str]
    ends: list[int]


def split_steps(text: str, separator: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the non-blank steps of ``text``."""
    if not separator:
        raise ValueError("prm_step_separator must be a non-empty string.")
    spans, start = [], 0
    while True:
        cut = text.find(separator, start)
        stop = len(text) if cut < 0 else cut
        if text[start:stop].strip():
            spans.append((start, stop))
        if cut < 0:
            return spans
        start = cut + len(separator)


def _decoded_length(tokenizer, ids: Sequence[int]) -> int:
    return len(tokenizer.decode(list(ids), skip_special_tokens=True))


#: Tokens of left context decoded with each token on path 2 (leading-space and byte-merging decoders need 1-3).
_CONTEXT = 4


def _decode_many(tokenizer, batch: list[list[int]]) -> list[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer decodes the whole batch in Rust
    if backend is not None:
        return backend.decode_batch(batch, skip_special_tokens=True)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in batch]


def _canonical_token_ends(tokenizer, ids: list[int], text: str) -> list[int] | None:
    """Path 1: decoded-text end of every token of ``ids`` from one encode with offsets, or None if it does not
    round-trip. Special tokens produce no text: they end where the previous token ends."""
    special = set(getattr(tokenizer, "all_special_ids", []))
    core = [i for i in ids if i not in special]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(encoded["input_ids"]) != core:
        return None
    core_ends = iter(end for _, end in encoded["offset_mapping"])
    ends, last = [], 0
    for i in ids:
        if i not in special:
            last = next(core_ends)
        ends.append(last)
    return ends


def _windowed_token_ends(tokenizer, ids: list[int], text: str) -> list[int] | None:
    """Path 2: every token's piece of text as decode(context + token) minus decode(context), in one batched decode;
    None unless the pieces add up to ``text``."""
    batch = []
    for k in range(len(ids)):
        left = ids[max(0, k - _CONTEXT) : k]
        batch.append(left)
        batch.append(left + [ids[k]])
    decoded = _decode_many(tokenizer, batch)
    ends, total = [], 0
    for short, long in zip(decoded[0::2], decoded[1::2], strict=True):
        if not long.startswith(short):
            return None
        total += len(long) - len(short)
        ends.append(total)
    if total != len(text):
        return None
    return ends


def _searched_token_ends(tokenizer, ids: list[int], last_chars: Sequence[int]) -> list[int]:
    """Path 3: for each character, the smallest prefix of ``ids`` whose decode covers it (a few decodes per step)."""
    result = []
    lo = 1
    for c in last_chars:  # monotone in c
        hi = len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if _decoded_length(tokenizer, ids[:mid]) > c:
                hi = mid
            else:
                lo = mid + 1
        result.append(lo - 1)
    return result


def char_ends_to_tokens(tokenizer, ids: Sequence[int], text: str, last_chars: Sequence[int]) -> list[int]:
    """For each character index in ``last_chars`` (non-decreasing), the index of the token of ``ids`` that produces
    that character.

    ``text`` must be ``tokenizer.decode(ids, skip_special_tokens=True)``. Linear in ``len(ids)`` unless the tokenizer's
    pieces do not add up to its decode (see the module docstring).
    """
    if not last_chars:
        return []
    ids = list(ids)
    token_ends = _canonical_token_ends(tokenizer, ids, text)
    if token_ends is None:
        token_ends = _windowed_token_ends(tokenizer, ids, text)
    if token_ends is None:
        return _searched_token_ends(tokenizer, ids, last_chars)
    # The first token whose text ends after character c produced it.
    return [min(bisect.bisect_right(token_ends, c), len(ids) - 1) for c in last_chars]


def segment_completion(
    tokenizer,
    ids: Sequence[int],
    *,
    separator: str | None = "\n",
    separator_token_id: int | None = None,
    text: str | None = None,
) -> Steps:
    """Steps of one completion given its token ids (padding removed; EOS may be included).

    With ``separator_token_id`` the completion is cut after each occurrence of that token (the separator belongs to the
    step it closes); otherwise the decoded text is split on ``separator``. Either way blank steps are dropped and the
    last step is extended to the last token.
    """
    ids = list(ids)
    if not ids:
        return Steps([], [])
    if separator_token_id is not None:
        cuts = [i for i, t in enumerate(ids) if t == separator_token_id]
        bounds = cuts if cuts and cuts[-1] == len(ids) - 1 else [*cuts, len(ids) - 1]
        texts, ends, start = [], [], 0
        for end in bounds:
            body = tokenizer.decode(
                [t for t in ids[start : end + 1] if t != separator_token_id], skip_special_tokens=True
            )
            if body.strip():
                texts.append(body)
                ends.append(end)
            start = end + 1
        if ends:
            ends[-1] = len(ids) - 1
        return Steps(texts, ends)
    text = tokenizer.decode(ids, skip_special_tokens=True) if text is None else text
    spans = split_steps(text, separator)
    if not spans:
        return Steps([], [])
    # A step closes with its separator (as in TRL's PRM data, where the step label sits on the separator's last token).
    last_chars = [stop + len(separator) - 1 if text.startswith(separator, stop) else stop - 1 for _, stop in spans]
    ends = char_ends_to_tokens(tokenizer, ids, text, last_chars)
    ends[-1] = len(ids) - 1
    return Steps([text[a:b] for a, b in spans], ends)
