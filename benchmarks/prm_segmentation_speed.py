"""Speed of PRM step segmentation at real completion lengths, with the EOS every finished completion ends in.

    python benchmarks/prm_segmentation_speed.py

A byte-level BPE tokenizer trained offline on worked solutions (merges like ``".\\n"``), completions of 1k / 4k / 16k
tokens ending in EOS, one step per line (about 8 tokens a step). "canonical": the ids the tokenizer itself produces;
"per character": a non-canonical tokenization (one token per character, as a policy may sample). ``segment_completion``
is what PRM advantages pay per completion per batch; "prefix search" is the previous fallback (a binary search of
decoded prefixes per step, which every completion with an EOS took), timed only where it finishes in seconds.
Median of 5 repeats (1 for the prefix search).
"""

from __future__ import annotations

import argparse

from diversity_speed import timed

from grpo_lab import testkit
from trl_grpo_ext.prm.segmentation import _searched_token_ends, segment_completion, split_steps

CORPUS = [
    "Let x = 3.\nThen 2x = 6.\nSo the answer is 6.\n",
    "First, 4+5=9.\nNext, 9*2=18.\n\nAnswer: 18\n",
    "We add.\nWe subtract.\nDone.\n",
] * 40


def completion(tok, tokens: int, canonical: bool) -> list[int]:
    text = "".join(CORPUS)
    while True:
        ids = (
            tok(text, add_special_tokens=False)["input_ids"]
            if canonical
            else [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]
        )
        if len(ids) >= tokens:
            return [*ids[: tokens - 1], tok.eos_token_id]
        text = text * 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--search_up_to", type=int, default=4096, help="time the prefix search up to this length")
    args = parser.parse_args()
    tok = testkit.build_bpe_tokenizer(CORPUS, vocab_size=320)
    print(f"{'tokens':>7} {'ids':>13} {'steps':>6} {'segment ms':>11} {'prefix search ms':>17}")
    for canonical in (True, False):
        for n in args.tokens:
            ids = completion(tok, n, canonical)
            text = tok.decode(ids, skip_special_tokens=True)
            steps = segment_completion(tok, ids)
            ms = 1e3 * timed(lambda ids=ids: segment_completion(tok, ids), 5)
            search = ""
            if n <= args.search_up_to:
                last_chars = [stop - 1 for _, stop in split_steps(text, "\n")]
                seconds = timed(lambda ids=ids, last_chars=last_chars: _searched_token_ends(tok, ids, last_chars), 1)
                search = f"{1e3 * seconds:.0f}"
            kind = "canonical" if canonical else "per character"
            print(f"{n:>7} {kind:>13} {len(steps.texts):>6} {ms:>11.1f} {search:>17}", flush=True)


if __name__ == "__main__":
    main()
