"""Does AEPO hold the policy's entropy at a chosen target where vanilla GRPO collapses?

    python benchmarks/aepo_entropy.py --targets 1.0 2.5 --out docs/images

The collapsing setting of benchmarks/collapse_demo.py (tiny random Llama, lr 3e-2): vanilla GRPO, then AEPO with each
target. Prints the mean token entropy over the last third of the run for each and writes ``aepo_entropy.png``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from collapse_setting import train_collapse_setting

from trl_grpo_ext import testkit


def run(model_path: str, steps: int, lr: float, seed: int, **extra):
    trainer = train_collapse_setting(model_path, steps=steps, lr=lr, seed=seed, **extra)
    return [(h["step"], h["entropy"]) for h in trainer.state.log_history if "entropy" in h]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=float, nargs="+", default=[1.0, 2.5])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-2)
    parser.add_argument("--coef", type=float, default=1.0)
    parser.add_argument("--max_samples", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="aepo_study")
    args = parser.parse_args()
    model_path = testkit.save_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
    curves = {"vanilla": run(model_path, args.steps, args.lr, args.seed)}
    for target in args.targets:
        curves[f"AEPO target {target}"] = run(
            model_path,
            args.steps,
            args.lr,
            args.seed,
            entropy_control="aepo",
            aepo_target_entropy=target,
            aepo_coef=args.coef,
            aepo_max_samples=args.max_samples,
        )
    tail = args.steps - args.steps // 3
    print(f"lr={args.lr} steps={args.steps} seed={args.seed}: mean entropy over steps > {tail}")
    for name, points in curves.items():
        values = [e for s, e in points if s > tail]
        print(f"{name:>18}: {sum(values) / len(values):.3f}  (start {points[0][1]:.3f})")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in curves.items():
        ax.plot([s for s, _ in points], [e for _, e in points], label=name)
    for target in args.targets:
        ax.axhspan(0.8 * target, 1.2 * target, alpha=0.12)
    ax.set_xlabel("step")
    ax.set_ylabel("mean token entropy")
    ax.set_title(f"AEPO vs vanilla GRPO (lr {args.lr}); bands: target +-20%")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "aepo_entropy.png")
    fig.savefig(path, dpi=110)
    print(path)


if __name__ == "__main__":
    main()
