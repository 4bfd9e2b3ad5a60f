"""Shared fixtures: one tiny random model saved once per session, a factory for tiny trainers."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: tests/vllm_tier/ runs in the vLLM venv only (tests/vllm_tier/make_venv.sh makes it; tests/test_vllm_tier.py runs
#: the tier there).
collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["vllm_tier"]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from grpo_lab import testkit

    return testkit.save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tokenizer():
    from grpo_lab import testkit

    return testkit.build_char_tokenizer()


@pytest.fixture(scope="session")
def train_dataset():
    from grpo_lab import testkit

    return testkit.arithmetic_dataset(256, seed=0)


TINY_ARGS = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=4,
    max_steps=3,
    learning_rate=1e-2,
    logging_steps=1,
    report_to="none",
    use_cpu=True,
    bf16=False,
    seed=0,
    save_strategy="no",
    disable_tqdm=True,
)


@pytest.fixture
def make_trainer(tiny_model_path, tokenizer, train_dataset, tmp_path):
    """Build a tiny trainer: ``make_trainer(cls, config_cls, reward_funcs, trainer_kwargs, **config_fields)``."""
    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    def factory(cls=GRPOExtTrainer, config_cls=GRPOExtConfig, reward_funcs=None, trainer_kwargs=None, **overrides):
        kwargs = {**TINY_ARGS, "output_dir": str(tmp_path / "out"), **overrides}
        args = config_cls(**kwargs)
        trainer_kwargs = {"train_dataset": train_dataset, "processing_class": tokenizer, **(trainer_kwargs or {})}
        return cls(
            model=tiny_model_path,
            reward_funcs=reward_funcs or [testkit.exact_match_reward, testkit.digit_fraction_reward],
            args=args,
            **trainer_kwargs,
        )

    return factory


def last_logs(trainer) -> list[dict]:
    """Per-step log entries (without the final train summary)."""
    return [h for h in trainer.state.log_history if "loss" in h]


def scored_batch(trainer, dataset, num_prompts: int = 2, mode: str = "train"):
    """One scored generation batch (TRL's ``_generate_and_score_completions`` output) outside ``train()``."""
    trainer.model.train(mode == "train")
    trainer.current_gradient_accumulation_steps = 1
    group = trainer.num_generations
    rows = [dataset[i] for i in range(num_prompts) for _ in range(group)]
    return trainer._generate_and_score_completions(rows)


def random_advantage_batch(trainer, dataset, seed=0):
    """A scored training batch whose advantages are replaced by seeded normal noise (every token carries signal)."""
    out = scored_batch(trainer, dataset)
    gen = torch.Generator().manual_seed(seed)
    out["advantages"] = torch.randn(out["advantages"].shape, generator=gen)
    return out


def assert_masked_equals_removed(trainer, out) -> None:
    """The loss and gradient of a generation batch ``out`` whose rows are masked (``KEEP_KEY``, ``tool_mask``, the
    recounted ``num_items_in_batch``, the per-sequence rescale) equal those of the batch with the masked rows removed,
    KL term included."""
    from trl_grpo_ext.api import KEEP_KEY

    keep = out[KEEP_KEY]
    assert out["num_items_in_batch"] == (out["completion_mask"] * out["tool_mask"]).sum()
    out["ref_per_token_logps"] = out["ref_per_token_logps"] + 0.2  # a KL term that is not 0
    masked_loss = trainer._compute_loss(trainer.model, out)
    masked_loss.backward()
    masked_grads = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.model.zero_grad()
    removed = {
        k: (v[keep] if torch.is_tensor(v) and v.dim() > 0 else v)
        for k, v in out.items()
        if k not in (KEEP_KEY, "tool_mask")
    }
    removed_loss = trainer._compute_loss(trainer.model, removed)
    removed_loss.backward()
    torch.testing.assert_close(masked_loss, removed_loss)
    for a, p in zip(masked_grads, trainer.model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)


def aggregate_single_process(trainer, per_token, inputs, loss_type, *, training=True, accumulation=1):
    """``aggregate_like_loss_type`` for one micro-batch on one process."""
    from trl_grpo_ext.adapter.compat import aggregate_like_loss_type

    return aggregate_like_loss_type(
        per_token,
        inputs["completion_mask"],
        loss_type=loss_type,
        training=training,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=trainer.args.steps_per_generation,
        num_processes=1,
        max_completion_length=trainer.max_completion_length,
        num_items_in_batch=inputs["num_items_in_batch"],
    )


class LogpProbe:
    """Keeps the differentiable log-probs of the last loss call (``.logps.grad`` after backward), as the policy forward
    gave them before any member acted, and the loss context after the members acted (``.ctx``)."""

    def __init__(self):
        self.logps = self.ctx = None

    def install(self, trainer):
        forward = trainer.ext_on_policy_forward

        def probed(logps, entropies, batch):
            logps.retain_grad()
            self.logps = logps
            out, self.ctx = forward(logps, entropies, batch)
            return out, self.ctx

        trainer.ext_on_policy_forward = probed
        return self


def free_port() -> int:
    """A free TCP port on localhost, for torchrun's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def policy_logps(trainer, out):
    """Per-token log-probs of ``out``'s completions under the trainer's policy, through TRL's own method."""
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([out["prompt_ids"], out["completion_ids"]], 1),
        torch.cat([out["prompt_mask"], out["completion_mask"]], 1),
        out["completion_ids"].size(1),
    )
    return logps


def run_pytest_in_venv(python, args: list[str], *, required_by: str, missing: str, timeout: int, skips: bool) -> str:
    """Run ``python -m pytest -q ARGS`` (another venv's interpreter) from the repository root, offline, without this
    process's PYTHONPATH / VIRTUAL_ENV; the test fails on any failure (and on a skip unless ``skips``) and returns the
    summary line. Without that interpreter the test is skipped with ``missing`` (how to make the venv), or fails when
    the environment variable ``required_by`` is 1 (CI sets it)."""
    from pathlib import Path

    if not Path(python).exists():
        if os.environ.get(required_by) == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    root = Path(__file__).resolve().parents[1]
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{' '.join(args)} in {python} ran past {timeout} s: {str(error.stdout)[-3000:]}")
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in summary and " failed" not in summary and (skips or "skipped" not in summary), summary
    return summary


HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.fixture(scope="session")
def deepspeed_ops():
    """DeepSpeed JIT-compiles its CPU communication op on first use (about a minute, then cached under
    ``TORCH_EXTENSIONS_DIR``): built here once, outside any timed multi-process run."""
    if not HAS_DEEPSPEED:
        pytest.skip("DeepSpeed is not installed: pip install -e '.[test,deepspeed]' (CI does)")
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


#: Test modules that run whole training jobs, launchers or process pools throughout (the rest of the slow tier is found
#: by fixture below).
SLOW_MODULES = {
    "test_compat_matrix",
    "test_distributed",
    "test_launch_configs",
    "test_recipe",
    "test_sharded",
    "test_parity",
}
#: A test that builds a tiny model (and usually trains it) uses one of these fixtures.
TRAINING_FIXTURES = {"make_trainer", "tiny_model_path", "env"}


def pytest_collection_modifyitems(config, items):
    """Two tiers: ``python -m pytest -q`` runs everything (CI, the README); ``-m "not slow"`` leaves out what trains a
    model, launches processes or starts pools, for the edit loop. The rule is mechanical (by module and fixture), so a
    new training test lands in the slow tier without anyone remembering to mark it. Tiny-trainer tests marked
    ``fast`` stay in the edit loop (the TRL contract and parity tests, the member contract, one run of every family
    member): the fast tier catches a broken trainer, within 90 s on 2 cores."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if item.get_closest_marker("fast") is not None:
            continue
        if module in SLOW_MODULES or TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
