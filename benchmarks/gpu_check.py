"""GPU check: step time, plugin share and peak memory of trl.GRPOTrainer and GRPOExtTrainer per family, one GPU.

    python benchmarks/gpu_check.py                   # one GPU, bf16, Qwen2.5-0.5B-sized random model (~6 min, H200)
    python benchmarks/gpu_check.py --tiny            # CPU smoke test of this script (tests/test_benchmarks.py)

The model is built from a config, never downloaded: Qwen2.5-0.5B's sizes (hidden 896, 24 layers, 14 heads, 2 KV
heads, MLP 4864, vocabulary 151,936) in the Llama architecture (transformers 5 replaces any tokenizer saved beside a
``qwen2`` config by its own), random weights, bf16, with a character tokenizer padded to the same vocabulary (random
Unicode characters, so generation and decoding stay real). Batch 64 = 16 prompts x 4 completions of up to 128 tokens,
transformers generation (no vLLM), ``--steps`` optimizer steps per configuration after one warm-up step.

Every configuration of ``benchmarks/overhead.py`` runs in this one process, one after the other: ``trl`` (plain
``GRPOTrainer``) and its beta / num_iterations variants, then ``GRPOExtTrainer`` with every family off, each family
alone and all on. Printed per configuration: the median step time (between consecutive ``on_step_end``), its ratio to
the matching ``trl`` run, ``timing/ext_fraction`` (the share of the step in the plugin's own code, timed in-run) and
peak GPU memory; ``--out FILE.json`` keeps the table.

A GPU machine without network or trl: on a networked machine with the same Python version run
``python benchmarks/gpu_wheels.py WHEELS`` (downloads this project's wheel and those of its dependencies, torch
excluded), copy ``WHEELS`` and this repository over, then
``pip install --no-index --find-links WHEELS -r WHEELS/requirements.txt`` and run this script.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import unicodedata

import torch
from overhead import CONFIGS
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

#: Qwen2.5-0.5B's sizes (its config.json), in the Llama architecture.
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151_936,
    max_position_embeddings=4096,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)


def padded_char_tokenizer(vocab_size: int | None):
    """The test kit's character tokenizer, grown to ``vocab_size`` entries with printable (then private-use) Unicode
    characters."""
    tok = testkit.build_char_tokenizer()
    if vocab_size is None or vocab_size <= len(tok):
        return tok
    extra, code = [], 0x100
    while len(tok) + len(extra) < vocab_size:
        ch = chr(code)
        code += 1
        usable = ch.isprintable() or unicodedata.category(ch) == "Co"  # private-use code points fill the rest
        if usable and not ch.isspace() and not 0xD800 <= ord(ch) <= 0xDFFF:
            extra.append(ch)
    return testkit.build_char_tokenizer(testkit.DEFAULT_CHARS + "".join(extra))


def build_model(path: str, *, tiny: bool) -> str:
    sizes = TINY if tiny else QWEN25_05B
    tok = padded_char_tokenizer(None if tiny else sizes["vocab_size"])
    config = LlamaConfig(
        **{**sizes, "vocab_size": len(tok)},
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32 if tiny else torch.bfloat16)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


class StepClock(TrainerCallback):
    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())


def steps_fn(prompts, completions, steps, **kwargs):
    """A step-reward function for the PRM configuration (cheap, varies with the step length)."""
    return [[(len(s) % 3) / 2 for s in row] for row in steps]


def run_config(name: str, model_path: str, args: argparse.Namespace) -> dict:
    _, overrides, is_trl = CONFIGS[name]
    gpu = torch.cuda.is_available() and not args.tiny
    common = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.batch,
        num_generations=4,
        max_completion_length=args.completion_length,
        max_steps=args.steps + 1,
        learning_rate=1e-6,
        logging_steps=1,
        report_to="none",
        use_cpu=not gpu,
        bf16=gpu,
        seed=0,
        save_strategy="no",
        disable_tqdm=True,
        model_init_kwargs={"dtype": "bfloat16" if gpu else "float32"},
    )
    config_cls, trainer_cls, extra = (GRPOConfig, GRPOTrainer, {}) if is_trl else (GRPOExtConfig, GRPOExtTrainer, {})
    if overrides.get("advantage_estimator") == "prm":
        extra = {"step_reward_funcs": [steps_fn]}
    tokenizer = AutoTokenizer.from_pretrained(model_path)  # the (padded) character tokenizer saved with the model
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=[testkit.digit_fraction_reward],
        args=config_cls(**common, **overrides),
        train_dataset=testkit.arithmetic_dataset(max(1024, args.batch * (args.steps + 2)), seed=0),
        processing_class=tokenizer,
        **extra,
    )
    clock = StepClock()
    trainer.add_callback(clock)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    walls = [b - a for a, b in zip(clock.ends, clock.ends[1:])]  # the first step (warm-up) is left out
    fractions = [h["timing/ext_fraction"] for h in trainer.state.log_history if "timing/ext_fraction" in h][1:]
    result = {
        "step_time_s": statistics.median(walls),
        "ext_fraction": statistics.median(fractions) if fractions else None,
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if gpu else None,
    }
    del trainer
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny fp32 model on the CPU (smoke test)")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per configuration")
    parser.add_argument("--batch", type=int, default=64, help="completions per step (groups of 4)")
    parser.add_argument("--completion_length", type=int, default=128)
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these configurations (and their baselines)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        parser.error("no GPU visible: run with --tiny for the CPU smoke test")
    only = args.only
    names = [n for n in CONFIGS if only is None or n in only or any(CONFIGS[o][0] == n for o in only)]
    model_path = build_model(os.path.join(tempfile.mkdtemp(), "model"), tiny=args.tiny)
    device = "cpu (tiny)" if args.tiny else torch.cuda.get_device_name(0)
    start = time.perf_counter()
    results = {name: run_config(name, model_path, args) for name in names}
    print(
        f"\n{device}; batch {args.batch} ({args.batch // 4} x 4), {args.completion_length} completion tokens, "
        f"{args.steps} timed steps each; torch {torch.__version__}; {time.perf_counter() - start:.0f} s in all"
    )
    print(f"{'config':<24}{'step s':>9}{'vs trl':>8}{'ext frac':>10}{'in-run':>8}{'peak GB':>9}")
    for name in names:
        r, base = results[name], results[CONFIGS[name][0]]
        frac = r["ext_fraction"]
        shown = ("", "") if frac is None else (f"{frac:.3f}", f"{1 / (1 - frac):.3f}")
        peak = "" if r["peak_gpu_gb"] is None else f"{r['peak_gpu_gb']:.1f}"
        ratio = r["step_time_s"] / base["step_time_s"]
        print(f"{name:<24}{r['step_time_s']:>9.3f}{ratio:>8.3f}{shown[0]:>10}{shown[1]:>8}{peak:>9}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "args": vars(args), "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
