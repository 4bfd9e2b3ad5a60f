"""Does GRPO with PRM advantages move a policy toward correct steps? A side-by-side study on the offline task.

    python benchmarks/prm_step_accuracy.py --steps 250 --lr 1e-4

1. SFT warm start (TRL SFTTrainer) of a tiny random Llama on the multi-step arithmetic solutions, cached.
2. Greedy step accuracy and answer accuracy on 128 held-out problems.
3. GRPO runs from that start, same seed and budget: outcome advantages (``grpo``), PRM advantages from the rule-based
   step reward (``prm``), and PRM mixed with the outcome advantage (``prm+outcome``, ``prm_outcome_coef=1``).
4. The same measurements after each run, printed as a table.

Step accuracy = fraction of generated steps that the rule-based step reward scores 1 (on-path, right arithmetic, or
the answer at its place). CPU, a few minutes.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer, testkit
from trl_grpo_ext.prm import segment_completion


def warm_start(cache: str, epochs: float, seed: int) -> str:
    path = os.path.join(cache, f"sft-e{epochs}-s{seed}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tok = testkit.build_char_tokenizer()
    torch.manual_seed(seed)
    model = testkit.build_tiny_model(tok, hidden_size=128, num_layers=4, seed=seed)
    rows = testkit.multistep_dataset(4000, seed=seed, ops="+")
    data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["solution"] + tok.eos_token} for r in rows])
    args = SFTConfig(
        output_dir=os.path.join(cache, "sft-tmp"),
        num_train_epochs=epochs,
        learning_rate=3e-3,
        per_device_train_batch_size=64,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=seed,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    trainer.save_model(path)
    tok.save_pretrained(path)
    return path


@torch.no_grad()
def evaluate(model, tok, problems) -> dict[str, float]:
    model.eval()
    enc = tok([r["prompt"] for r in problems], return_tensors="pt", padding=True)
    out = model.generate(
        **enc, max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    completions = out[:, enc["input_ids"].shape[1] :]
    steps = [segment_completion(tok, [i for i in row if i != tok.pad_token_id]).texts for row in completions.tolist()]
    answers = [r["answer"] for r in problems]
    scores = [
        x for row in testkit.arithmetic_step_reward([r["prompt"] for r in problems], None, steps, answers) for x in row
    ]
    texts = tok.batch_decode(completions, skip_special_tokens=True)
    return {
        "step_acc": sum(scores) / max(len(scores), 1),
        "answer_acc": sum(testkit.final_answer_reward(texts, answer=answers)) / len(texts),
        "steps_per_completion": len(scores) / len(texts),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--sft_epochs", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "trl_grpo_ext_prm_study"))
    parser.add_argument("--runs", nargs="+", default=["grpo", "prm", "prm+outcome"])
    args = parser.parse_args()

    tok = testkit.build_char_tokenizer()
    start = warm_start(args.cache, args.sft_epochs, args.seed)
    heldout = testkit.multistep_dataset(128, seed=10_000 + args.seed, ops="+")
    rows = [("sft start", evaluate(AutoModelForCausalLM.from_pretrained(start), tok, heldout))]
    for run in args.runs:
        config = GRPOExtConfig(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=64,
            num_generations=8,
            max_completion_length=20,
            max_steps=args.steps,
            learning_rate=args.lr,
            temperature=args.temperature,
            logging_steps=10,
            report_to="none",
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            save_strategy="no",
            disable_tqdm=True,
            advantage_estimator="grpo" if run == "grpo" else "prm",
            prm_outcome_coef=1.0 if run == "prm+outcome" else 0.0,
        )
        kwargs = {} if run == "grpo" else {"step_reward_funcs": [testkit.arithmetic_step_reward]}
        trainer = GRPOExtTrainer(
            model=start,
            reward_funcs=[testkit.final_answer_reward],
            args=config,
            train_dataset=testkit.multistep_dataset(20_000, seed=1 + args.seed, ops="+"),
            processing_class=tok,
            **kwargs,
        )
        trainer.train()
        rows.append((run, evaluate(trainer.model, tok, heldout)))
    print(f"\nsteps={args.steps} lr={args.lr} T={args.temperature} seed={args.seed}, 128 held-out problems, greedy")
    print(f"{'run':<14}{'step_acc':>10}{'answer_acc':>12}{'steps/compl':>13}")
    for name, m in rows:
        print(f"{name:<14}{m['step_acc']:>10.3f}{m['answer_acc']:>12.3f}{m['steps_per_completion']:>13.2f}")


if __name__ == "__main__":
    main()
