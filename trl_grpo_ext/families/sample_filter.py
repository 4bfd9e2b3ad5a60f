"""PF-PPO sample filtering (``sample_filter``): masks rows out of the loss, keeps TRL's batching intact."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..api import Out
from ..core.sample_filter import SAMPLE_FILTER_STRATEGIES, Strategy, pf_keep_mask
from ..names import MemberContractError
from .base import GenerationBatch, Host, Off
from .interfaces import SAMPLE_FILTERS, FilterUpdate, SampleFilterBase

logger = logging.getLogger(__name__)


class PolicyFilter(SampleFilterBase):
    """Keeps the rows a PF-PPO strategy picks, per prompt group, after advantages were computed on the full group. Each
    strategy's member is a subclass whose :attr:`select` is the strategy function (:func:`register_strategy` makes it:
    the built-in ones of :data:`~trl_grpo_ext.core.sample_filter.SAMPLE_FILTER_STRATEGIES`, and yours).

    Rows are masked, not removed (TRL splits the generation batch into equal chunks and gathers per-row metrics): the
    trainer multiplies the keep flags into ``tool_mask`` (the loss mask slot TRL already honours), recounts
    ``num_items_in_batch`` over kept tokens, and for per-sequence loss types rescales the loss by rows / kept rows of
    each micro-batch (``pf_rescale``: :meth:`~trl_grpo_ext.trainer.GRPOExtTrainer.ext_loss_context`).
    """

    @dataclass(frozen=True)
    class Args(SampleFilterBase.Args):  # the config fields it reads
        sample_filter: str
        pf_filter_eval: bool

    args: Args

    metrics: ClassVar[tuple[str, ...]] = (
        "filter/kept_frac",
        "filter/kept_reward_mean",
        "filter/groups_kept_frac",
        "filter/all_filtered",
    )
    optional_metrics: ClassVar[tuple[str, ...]] = ("filter/dropped_reward_mean",)  # when a row was dropped
    docs = "pf_ppo.md"
    #: the strategy, (P, G) rewards, generator -> (P, G) keep mask, as a staticmethod (register_strategy sets it)
    select: ClassVar[staticmethod[[torch.Tensor, torch.Generator | None], torch.Tensor]]

    @classmethod
    def check_registration(cls, *, family: str, name: str) -> None:
        super().check_registration(family=family, name=name)
        if not callable(getattr(cls, "select", None)):
            raise MemberContractError(
                f"{family}={name!r}: {cls.__name__} applies a strategy and has none. Fix: register the strategy "
                f"function itself, @register_strategy({name!r}) (trl_grpo_ext.families.sample_filter), which builds "
                "its PolicyFilter."
            )

    def __init__(self, args: Args, host: Host):
        super().__init__(args, host)
        self.strategy = args.sample_filter  # the switch's value, for messages

    def on_generation(self, batch: GenerationBatch) -> Out[FilterUpdate | None]:
        if batch.mode == "eval" and not self.args.pf_filter_eval:
            return None  # eval_loss over every completion, comparable with GRPOTrainer
        host = self.host
        generator = host.generator("sample_filter", per_rank=False, device=batch.rewards.device)
        scores = batch.rewards if batch.rank_scores is None else batch.rank_scores
        keep = pf_keep_mask(scores, batch.group_size, strategy=type(self).select, generator=generator)  # (N,)
        if not keep.any():
            logger.warning(
                "sample_filter=%r dropped every completion of this generation batch (step %d): it trains with zero "
                "loss (Adam momentum still moves the weights). Frequent with 'nonzero_std' when every group gets the "
                "same reward; consider another strategy or more num_generations.",
                self.strategy,
                host.global_step,
            )
        return FilterUpdate(keep=keep), keep_metrics(keep, batch.rewards, batch.group_size)


def keep_metrics(keep: torch.Tensor, rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """The ``filter/*`` metrics of (N,) ``keep`` flags over (N,) rewards (NaN: unscorable, counted as 0)."""
    rewards = torch.nan_to_num(rewards, nan=0.0)
    metrics = {
        "filter/kept_frac": keep.float().mean().item(),
        "filter/kept_reward_mean": rewards[keep].mean().item() if keep.any() else 0.0,
        "filter/groups_kept_frac": keep.view(-1, group_size).any(dim=1).float().mean().item(),
        "filter/all_filtered": float(not keep.any()),
    }
    if (~keep).any():
        metrics["filter/dropped_reward_mean"] = rewards[~keep].mean().item()
    return metrics


def register_strategy(name: str):
    """Register a PF-PPO strategy ``(P, G) rewards, generator -> (P, G) keep mask`` as ``sample_filter=name``: its
    member, a :class:`PolicyFilter` applying it, goes in the family's registry (the one registry of the switch's
    names; a name it holds already is refused). Returns the function unchanged."""

    def decorator(fn: Strategy) -> Strategy:
        if not callable(fn):
            raise TypeError(
                f"register_strategy({name!r}) decorates a function (P, G) rewards, generator -> (P, G) bool keep "
                f"mask, got {type(fn).__name__}."
            )
        _register(name, fn, module=fn.__module__)
        return fn

    return decorator


def _register(name: str, fn: Strategy, *, module: str) -> None:
    doc = f"``sample_filter: {name}``: :class:`PolicyFilter` with the strategy {fn.__module__}.{fn.__qualname__}."
    namespace = {"select": staticmethod(fn), "__module__": module, "__doc__": doc}
    SAMPLE_FILTERS.register(name)(type("PolicyFilter", (PolicyFilter,), namespace))  # named like its base in reports


SAMPLE_FILTERS.register("none")(Off)
for _name, _strategy in SAMPLE_FILTER_STRATEGIES.items():
    _register(_name, _strategy, module=__name__)
