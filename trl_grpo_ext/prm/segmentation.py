"""Split completions into steps and map each step's end to a completion-token index.

A step is a piece of the completion text between separators (TRL's PRM convention: ``step_separator``, default
``"\\n"``) that holds at least one non-blank character; blank pieces (two separators in a row, a trailing separator)
are not steps. A step's tokens run up to and including its closing separator (TRL's PRM data puts the step label on
the separator's last token). A completion without any separator is one step. The **last step ends at the last
completion token**
(EOS included), so the stop decision shares the reward of the last step.

Mapping characters to tokens must survive tokenizers that merge the separator into a neighbouring token (``".\\n"``),
byte-level pieces and decode normalisation. :func:`step_end_tokens` re-encodes the decoded text with offsets when that
round-trips to the same ids (fast path), and otherwise binary-searches the shortest decoded prefix that covers the
step's last character (a few decodes per step).
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


def char_ends_to_tokens(tokenizer, ids: Sequence[int], text: str, last_chars: Sequence[int]) -> list[int]:
    """For each character index in ``last_chars``, the index of the token of ``ids`` that produces that character.

    ``text`` must be ``tokenizer.decode(ids, skip_special_tokens=True)``.
    """
    if not last_chars:
        return []
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    special = set(getattr(tokenizer, "all_special_ids", []))
    core = [i for i in ids if i not in special]
    if list(encoded["input_ids"]) == core and len(core) == len(ids):
        token_ends = [end for _, end in encoded["offset_mapping"]]
        return [min(bisect.bisect_right(token_ends, c), len(ids) - 1) for c in last_chars]
    result = []
    lo = 1
    for c in last_chars:  # smallest prefix length k whose decode covers character c; monotone in c
        hi = len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if _decoded_length(tokenizer, ids[:mid]) > c:
                hi = mid
            else:
                lo = mid + 1
        result.append(lo - 1)
    return result


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
