"""Members that break their family's interface: mypy must refuse each (tests/test_typing.py; nothing here runs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_grpo_ext.families import ADVANTAGE_ESTIMATORS, SAMPLE_FILTERS, Extension, GenerationBatch, LossContext
from trl_grpo_ext.families.interfaces import AdvantageUpdate, FilterUpdate, KLControllerBase, Out


class WrongHooks(Extension):
    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> list[int]:  # a mask, not a list
        return []

    def extra_loss(self, ctx: LossContext) -> float:  # a tensor, not a float
        return 0.0


@ADVANTAGE_ESTIMATORS.register("keeps_rows")  # an estimator returning a filter's output
class KeepsRows(Extension):
    def on_generation(self, batch: GenerationBatch) -> FilterUpdate | None:
        return None


@SAMPLE_FILTERS.register("writes_advantages")  # a filter returning advantages
class WritesAdvantages(Extension):
    def on_generation(self, batch: GenerationBatch) -> AdvantageUpdate | None:
        return None


class MisreadsTheConfig(Extension):
    @dataclass(frozen=True)
    class Args(Extension.Args):
        clip_cov_ratio: float
        token_clip: str

    args: Args

    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        if self.args.clip_cov_ration > 0:  # misspelt: no such field
            return None
        if self.args.beta > 0:  # a real config field the member does not declare
            return None
        return ctx.logps.sum() * (self.args.clip_cov_ratio + self.args.token_clip)  # a str added to a number


class MisusesTheHost(Extension):
    def after_loss(self, ctx: LossContext) -> None:
        # a hook returns its metrics ((None, metrics) here); the Host has no log. And misspelt: it has global_step
        self.host.log("train", "x/steps", self.host.global_steps)
        self.host.beta = 0.1  # beta is set through the beta_control service, not the host
        self.host.save_checkpoint()  # a service no member reaches through the host


class MisusesAService(KLControllerBase):
    def after_loss(self, ctx: LossContext) -> None:
        self.beta_control.set_beta("0.1")  # a string where beta is a float
        self.beta_control.drop_ratio_clip()  # another service's method


class WritesItsLossContext(Extension):
    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor | None:
        ctx.selected = logps > 0  # the context is frozen: a selection is returned
        ctx.inputs["advantages"] = logps  # read-only: advantages are reshaped by returning them (shape_advantages)
        return None


class WritesItsBatch(Extension):
    def on_generation(self, batch: GenerationBatch) -> None:
        batch.keep = None  # the batch is frozen: kept rows are returned (FilterUpdate)
        batch.output["advantages"] = batch.rewards  # read-only: advantages are returned (AdvantageUpdate)


class ReturnsAWordForAMetric(Extension):
    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor]:
        return logps, {"words/frac": "half"}  # a metric is a number
