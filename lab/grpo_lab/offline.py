"""The lab's offline tasks, made known to the library by name: their rewards in ``trl_grpo_ext.rewards``' registries
(named by the recipe's configs: ``exact_answer``, ``length_proxy``, ``tolerant_audit``, ...) and the multi-step sums
as ``dataset_name="synthetic"`` (``trl_grpo_ext.data.OFFLINE_DATASETS``). The library imports nothing of the lab;
``recipes/math_grpo.py`` calls :func:`register` (a user's own tasks register the same way)."""

from __future__ import annotations

from . import testbed, testkit
from .testbeds import audit, forks, length_bias

#: reward name -> the lab's function (TRL's reward signature)
REWARDS = {
    "exact_answer": testbed.answer_reward,
    "forks_right": forks.gold_reward,
    "length_proxy": length_bias.proxy_reward,
    "tolerant_audit": audit.tolerant_audit,
    "final_answer": testkit.final_answer_reward,
    "exact_match": testkit.exact_match_reward,
    "digit_fraction": testkit.digit_fraction_reward,
}
#: step reward name -> the lab's function (one list of floats per completion)
STEP_REWARDS = {"arithmetic_steps": testkit.arithmetic_step_reward}


def synthetic(n: int | None, *, split: str, seed: int, num_ops: int):
    """The multi-step sums in recipe format (``prompt``, ``solution``): ``n`` rows (20,000 by default), disjoint
    seeds per split so that held-out problems are drawn independently of the training stream."""
    split_seed = {"train": seed + 1, "test": 10_000 + seed}.get(split, seed + 2)
    return testkit.multistep_dataset(n or 20_000, seed=split_seed, num_ops=num_ops, ops="+")


def register() -> None:
    """Register the lab's rewards and the ``"synthetic"`` dataset in the library's registries (again: a no-op)."""
    from trl_grpo_ext.data import OFFLINE_DATASETS
    from trl_grpo_ext.rewards import REWARD_FUNCS, STEP_REWARD_FUNCS

    for registry, table in ((REWARD_FUNCS, REWARDS), (STEP_REWARD_FUNCS, STEP_REWARDS)):
        for name, func in table.items():
            if name not in registry:
                registry.register(name)(func)
    if "synthetic" not in OFFLINE_DATASETS:
        OFFLINE_DATASETS.register("synthetic")(synthetic)


__all__ = ["REWARDS", "STEP_REWARDS", "register", "synthetic"]
