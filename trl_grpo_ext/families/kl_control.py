"""KL-coefficient control (``kl_control``)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from ..adapter.compat import per_token_kl
from ..api import Out
from ..core.diversity import distinct_n_batch
from ..core.kl_control import AdaptiveKLController, DiversityKLController
from ..names import config_error
from .base import BetaControl, GenerationBatch, Host, LossContext, Off
from .interfaces import KL_CONTROLLERS, KLControllerBase

logger = logging.getLogger(__name__)

KL_CONTROLLERS.register("fixed")(Off)


class StepKL:
    """The per-token mean k3 KL to the reference over one optimizer step: each training micro-batch adds its masked
    KL sum, token count and row count (:meth:`add`); at the step's last micro-batch :meth:`add` returns the sums over
    every process (a collective every process reaches, so all decide alike) as ``(kl_mean, rows)``, else None."""

    def __init__(self) -> None:
        self._window: torch.Tensor | None = None

    def add(self, ctx: LossContext, host) -> tuple[float, int] | None:
        kl = per_token_kl(ctx.logps.detach(), ctx.inputs["ref_per_token_logps"])  # (B, T)
        mask = ctx.mask.to(kl.dtype)
        stats = torch.stack([(kl * mask).sum(), mask.sum(), torch.tensor(float(mask.size(0)), device=kl.device)])
        self._window = stats if self._window is None else self._window + stats
        if not host.step_end:
            return None
        kl_sum, tokens, rows = host.collectives.all_sum(self._window.float()).tolist()
        self._window = None
        return (kl_sum / tokens if tokens > 0 else float("nan")), int(rows)


class _BetaControl(KLControllerBase):
    """A KL family member whose ``self.controller`` owns beta: its state is the checkpointed state (the ``set_beta``
    service comes with ``KLControllerBase``)."""

    @dataclass(frozen=True)
    class Args(KLControllerBase.Args):  # the config fields every controller of beta reads
        beta: float
        kl_horizon: float
        kl_beta_min: float
        kl_beta_max: float

    args: Args
    controller: AdaptiveKLController

    @classmethod
    def check_combination(cls, args, members) -> None:
        # (beta > 0 for any member that sets beta: families.registration.check_selection)
        if not args.kl_beta_min <= args.beta <= args.kl_beta_max:
            raise config_error(
                "beta",
                args.beta,
                f"the starting beta must lie in [kl_beta_min, kl_beta_max] = [{args.kl_beta_min}, {args.kl_beta_max}]",
                "move beta inside the clamp or widen the clamp",
            )

    def state_dict(self):
        return self.controller.state_dict()

    def load_state_dict(self, state):
        self.controller.load_state_dict(state)
        if self.controller.value != state["value"]:
            logger.warning(
                "Checkpointed beta %g lies outside this run's [kl_beta_min, kl_beta_max] = [%g, %g]: resuming from %g.",
                state["value"],
                self.controller.beta_min,
                self.controller.beta_max,
                self.controller.value,
            )
        self.beta_control.set_beta(self.controller.value)


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKL(_BetaControl):
    """Ziegler's controller on the global per-token mean k3 KL of each optimizer step.

    Every micro-batch adds its masked KL sum, token count and row count; at the optimizer-step boundary the sums are
    reduced over all processes (so every rank computes the same beta), the controller moves beta, and
    beta (TRL reads it live, in the loss and for reference log-probs) takes the new value for the next
    step. Logs ``kl/beta`` (beta used in the step), ``kl/value``, ``kl/target``.
    """

    @dataclass(frozen=True)
    class Args(_BetaControl.Args):  # the config fields it reads
        kl_target: float

    args: Args

    metrics = ("kl/beta", "kl/value", "kl/target")
    example_config = {"beta": 0.04, "kl_target": 0.01, "kl_horizon": 100}
    docs = "adaptive_kl.md"

    def __init__(self, args: Args, host: Host, *, beta_control: BetaControl):
        super().__init__(args, host, beta_control=beta_control)
        self.controller = AdaptiveKLController(
            args.beta, args.kl_target, args.kl_horizon, beta_min=args.kl_beta_min, beta_max=args.kl_beta_max
        )
        self.beta_control.set_beta(self.controller.value)
        self._step_kl = StepKL()

    def after_loss(self, ctx: LossContext) -> Out[None]:
        if ctx.mode != "train":
            return None
        host = self.host
        measured = self._step_kl.add(ctx, host)
        if measured is None:
            return None
        kl_mean, rows = measured
        used = host.beta
        if kl_mean != kl_mean:
            logger.warning("kl_control: no valid token in this optimizer step; beta stays at %.4g.", used)
        self.beta_control.set_beta(self.controller.update(kl_mean, n_steps=int(rows)))
        return None, {"kl/beta": used, "kl/value": kl_mean, "kl/target": self.controller.target}


@KL_CONTROLLERS.register("diversity")
class DiversityKL(_BetaControl):
    """Beta from diversity: after each generation batch, Distinct-``kl_diversity_n`` of all processes' completions
    moves beta (up while below ``kl_diversity_target``); the new beta applies from the next step. Every process
    gathers the same completions, so all hold the same beta. Logs ``kl/beta``, ``kl/diversity``,
    ``kl/diversity_target``.
    """

    @dataclass(frozen=True)
    class Args(_BetaControl.Args):  # the config fields it reads
        kl_diversity_target: float
        kl_diversity_n: int

    args: Args

    metrics = ("kl/beta", "kl/diversity", "kl/diversity_target")
    example_config = {"beta": 0.04, "kl_horizon": 100}
    docs = "monitoring.md"

    def __init__(self, args: Args, host: Host, *, beta_control: BetaControl):
        super().__init__(args, host, beta_control=beta_control)
        self.controller = DiversityKLController(
            args.beta, args.kl_diversity_target, args.kl_horizon, beta_min=args.kl_beta_min, beta_max=args.kl_beta_max
        )
        self.beta_control.set_beta(self.controller.value)
        self._warned_no_ngrams = False

    def on_generation(self, batch: GenerationBatch) -> Out[None]:
        if batch.mode != "train":
            return None
        ids, mask = batch.global_completions()
        n = self.args.kl_diversity_n
        used = self.host.beta
        if not bool((mask.sum(1) >= n).any()):
            # No completion has an n-gram: Distinct-N is undefined here, not 0 (0 would read as collapse and raise
            # beta). Beta stays; the metric is NaN for this batch.
            if not self._warned_no_ngrams:
                logger.warning(
                    "kl_control='diversity': no completion of this batch has %d tokens, so Distinct-%d is undefined "
                    "and beta is left unchanged. Lower kl_diversity_n or raise max_completion_length.",
                    n,
                    n,
                )
                self._warned_no_ngrams = True
            diversity = math.nan
        else:
            diversity = distinct_n_batch(ids, mask, n)
            self.beta_control.set_beta(self.controller.update(diversity, n_steps=ids.size(0)))
        return None, {"kl/beta": used, "kl/diversity": diversity, "kl/diversity_target": self.controller.target}
