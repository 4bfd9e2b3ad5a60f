"""Speed of the diversity metrics on a full generation batch, against one plain tensor pass over the same data.

    python benchmarks/diversity_speed.py --completions 1024 --tokens 1024

Median of 5 repeats per function on random token ids (vocabulary 50k, every token valid). The "plain pass" is one
``torch.sort`` of the batch's int64 codes: the cost floor of any exact distinct count. The last row is what the
collapse monitor runs per generation batch (every metric, one sort per n-gram order), on the full batch and on one
right-padded to random lengths (about half the tokens valid, as in a real batch).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trl_grpo_ext.core import batch_diversity, distinct_n_batch, repetition_rates, self_bleu_batch, unique_fraction


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--completions", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50_000, (args.completions, args.tokens), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)
    lengths = torch.randint(0, args.tokens + 1, (args.completions,), generator=gen)
    padded = torch.arange(args.tokens).unsqueeze(0) < lengths.unsqueeze(1)  # right padding, half the tokens valid
    g = args.group_size
    rows = [
        ("plain pass: sort of B*T int64", lambda: torch.sort(ids.view(-1))),
        ("distinct_2 (batch)", lambda: distinct_n_batch(ids, mask, 2)),
        (
            "distinct_1..4 (batch + in group)",
            lambda: [distinct_n_batch(ids, mask, n, group_size=gs) for n in (1, 2, 3, 4) for gs in (None, g)],
        ),
        ("repetition (3-grams)", lambda: repetition_rates(ids, mask, 3)),
        ("unique fraction", lambda: unique_fraction(ids, mask, g)),
        ("self-BLEU (n<=4, in group)", lambda: self_bleu_batch(ids, mask, g)),
        ("all of the above (batch_diversity)", lambda: batch_diversity(ids, mask, g)),
        ("the same, right-padded (half valid)", lambda: batch_diversity(ids, padded, g)),
    ]
    print(f"{args.completions} completions x {args.tokens} tokens, torch threads {torch.get_num_threads()}")
    base = None
    for name, fn in rows:
        seconds = timed(fn, args.repeats)
        base = base or seconds
        print(f"{name:<36}{seconds * 1000:>9.1f} ms{seconds / base:>8.1f}x plain pass")


if __name__ == "__main__":
    main()
