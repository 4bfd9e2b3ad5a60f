"""Does AEPO hold the policy's entropy at a chosen target where vanilla GRPO collapses? Both AEPO modes, 3 seeds.

    python benchmarks/aepo_entropy.py --out docs/images                        # lr 5e-3, 100 steps
    python benchmarks/aepo_entropy.py --lr 1e-3 --steps 200 --out docs/images  # a slower collapse

The ``sums`` setting of benchmarks/collapse_setting.py (tiny random Llama, batch 32 = 4 prompts x 8): vanilla GRPO,
then AEPO for each target in three modes: ``reference`` (the defaults: the reference code's rules, a quarter of the
prompt groups regenerated, samples spliced into the batch through the clipped loss, entropy read as ``-mean(logp)``),
``reference-all`` (the same rules, every prompt regenerated) and ``0.1.0`` (``trl_grpo_ext.config.AEPO_0_1_0``: the
whole batch regenerated, a separate REINFORCE term, exact entropy); targets 1.0 and 2.5 nats, seeds 0, 1, 2. For each
run it reports, over the last third of the steps, the entropy AEPO steers on (``aepo/entropy``: the sampled-token
estimate under the reference rules, the exact entropy in 0.1.0 mode) and the exact mean token entropy of the trained
batch (TRL's ``entropy``), and whether the steered value lies within +-20% of the target. Writes
``aepo_entropy_lr{lr}.json`` (every curve) and ``aepo_entropy_lr{lr}.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from collapse_setting import train_collapse_setting

from grpo_lab import testkit
from trl_grpo_ext.config import AEPO_0_1_0

#: reference: the defaults; reference-all: the same rules with every prompt regenerated; 0.1.0: the separate term.
MODES = {"reference": {}, "reference-all": {"aepo_regenerate_fraction": 1.0}, "0.1.0": AEPO_0_1_0}


def run(model_path: str, steps: int, lr: float, seed: int, **extra) -> dict:
    start = time.perf_counter()
    trainer = train_collapse_setting(model_path, steps=steps, lr=lr, seed=seed, **extra)
    history = trainer.state.log_history
    return {
        "entropy": [(h["step"], h["entropy"]) for h in history if "entropy" in h],
        "steered": [(h["step"], h["aepo/entropy"]) for h in history if "aepo/entropy" in h],
        "temperature": [(h["step"], h["aepo/temperature"]) for h in history if "aepo/temperature" in h],
        "samples_used": [(h["step"], h["aepo/samples_used"]) for h in history if "aepo/samples_used" in h],
        "wall_s": time.perf_counter() - start,
    }


def tail_mean(points, tail: int) -> float | None:
    values = [v for s, v in points if s > tail]
    return sum(values) / len(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=float, nargs="+", default=[1.0, 2.5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--out", default="aepo_study")
    args = parser.parse_args()
    model_path = testkit.save_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
    runs: dict[str, dict[int, dict]] = {}
    for seed in args.seeds:
        runs.setdefault("vanilla", {})[seed] = run(model_path, args.steps, args.lr, seed)
        for mode in args.modes:
            for target in args.targets:
                name = f"{mode} target {target}"
                runs.setdefault(name, {})[seed] = run(
                    model_path,
                    args.steps,
                    args.lr,
                    seed,
                    entropy_control="aepo",
                    aepo_target_entropy=target,
                    **MODES[mode],
                )
    tail = args.steps - args.steps // 3
    print(f"lr={args.lr} steps={args.steps} seeds={args.seeds}: means over steps > {tail}")
    print(f"{'run':<22}{'steered (per seed)':>30}{'in +-20%':>10}{'exact entropy (per seed)':>32}{'wall s':>8}")
    summary = {}
    for name, by_seed in runs.items():
        target = None if name == "vanilla" else float(name.rsplit(" ", 1)[1])
        steered = [tail_mean(r["steered"], tail) for r in by_seed.values()]
        exact = [tail_mean(r["entropy"], tail) for r in by_seed.values()]
        inside = None
        if target is not None:
            inside = sum(s is not None and 0.8 * target <= s <= 1.2 * target for s in steered)
        walls = statistics.median(r["wall_s"] for r in by_seed.values())
        summary[name] = {"target": target, "steered": steered, "exact": exact, "inside": inside, "wall_s": walls}
        fmt = lambda xs: " ".join("  -  " if x is None else f"{x:.3f}" for x in xs)  # noqa: E731
        shown_inside = "" if inside is None else f"{inside}/{len(steered)}"
        print(f"{name:<22}{fmt(steered):>30}{shown_inside:>10}{fmt(exact):>32}{walls:>8.0f}")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"aepo_entropy_lr{args.lr:g}")
    with open(stem + ".json", "w") as f:
        json.dump({"args": vars(args), "summary": summary, "runs": runs}, f)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.modes), figsize=(5.5 * len(args.modes), 3.6), squeeze=False, sharey=True)
    for ax, mode in zip(axes[0], args.modes, strict=True):
        for seed, r in runs["vanilla"].items():
            ax.plot(*zip(*r["entropy"], strict=True), color="grey", alpha=0.6, label="vanilla" if seed == 0 else None)
        for i, target in enumerate(args.targets):
            for seed, r in runs[f"{mode} target {target}"].items():
                label = f"target {target}: steered" if seed == args.seeds[0] else None
                ax.plot(*zip(*r["steered"], strict=True), color=f"C{i}", alpha=0.8, label=label)
                label = f"target {target}: exact" if seed == args.seeds[0] else None
                ax.plot(*zip(*r["entropy"], strict=True), color=f"C{i}", ls=":", alpha=0.6, label=label)
            ax.axhspan(0.8 * target, 1.2 * target, color=f"C{i}", alpha=0.1)
        ax.set_title(f"AEPO {mode} (bands: target +-20%)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("mean token entropy (nats)")
    fig.tight_layout()
    path = stem + ".png"
    fig.savefig(path, dpi=110)
    print(path)


if __name__ == "__main__":
    main()
