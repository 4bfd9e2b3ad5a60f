"""``refill: dynamic_sampling``: refill the groups without signal with new ones (DAPO / Polaris)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..api import Out, Rollout, Splice
from ..core.sample_filter import nonzero_std
from ..names import config_error
from .base import GenerationBatch, Host, Off, RolloutService
from .interfaces import REFILLS, RefillBase, RefillUpdate

logger = logging.getLogger(__name__)


REFILLS.register("none")(Off)


@REFILLS.register("dynamic_sampling")
class DynamicSampling(RefillBase):
    """Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, sec. 3.2) with refill.

    A prompt group whose scorable rewards are all equal has advantage 0 on every sample: no policy gradient. After
    TRL scored a training generation batch, each process counts its groups without signal, draws that many new
    prompts from ``train_dataset`` (uniformly, a generator seeded per process and step; from a streaming dataset, the
    stream's next rows of this process's share), generates and scores a group for each through TRL's own
    ``_generate`` and reward functions (the rollout mechanism AEPO's regeneration uses,
    :mod:`trl_grpo_ext.adapter.rollouts`), and puts the new groups that have signal in place of those without, with the
    advantages the configured estimator gives them (``RolloutService.group_advantages``: GRPO's group-normalised ones
    with ``scale_rewards`` and ``advantage_std`` as configured, over the new groups; PKPO's weights). It repeats until
    no process has a group without signal or ``dynamic_sampling_max_rounds`` rounds ran.

    Every process runs the same number of generation rounds with the same number of prompts (the largest need of any
    process; a process needing fewer keeps the extra groups unused): generation and the log-prob forwards are
    collectives under FSDP / ZeRO-3. The batch keeps its shape everywhere.

    Groups still without signal after the last round: ``dynamic_sampling_fill="filter"`` (DAPO) masks them out of the
    loss, as ``sample_filter="nonzero_std"`` does (the loss is over the kept rows, ``pf_rescale``);
    ``"replace"`` (Polaris) fills them with copies of this process's groups with signal (the batch's own or new ones),
    and masks them only where the process has none.

    The trainer writes the new groups into TRL's batch at once (:class:`~trl_grpo_ext.api.RefillUpdate`): the
    members after it (the advantage weighting, a sample filter choosing among the refilled groups' samples, the
    collapse monitor's audits) read the batch as it trains. Training batches only: evaluation is left as generated.

    Logs ``dynamic/rounds`` (generation rounds this batch), ``dynamic/signal_frac_before`` and
    ``dynamic/signal_frac_after`` (fraction of groups with signal, all processes), ``dynamic/refilled_groups`` (new
    groups put in), ``dynamic/duplicated_groups`` (copies, ``"replace"``), ``dynamic/extra_gen_time`` (seconds of the
    extra generation and scoring on this process) and ``dynamic/kept_frac`` (rows that train).
    """

    @dataclass(frozen=True)
    class Args(RefillBase.Args):  # the config fields it reads
        dynamic_sampling_max_rounds: int
        dynamic_sampling_fill: str
        temperature: float

    args: Args

    metrics: ClassVar[tuple[str, ...]] = (
        "dynamic/rounds",
        "dynamic/signal_frac_before",
        "dynamic/signal_frac_after",
        "dynamic/refilled_groups",
        "dynamic/duplicated_groups",
        "dynamic/extra_gen_time",
        "dynamic/kept_frac",
    )
    example_config = {"dynamic_sampling_max_rounds": 2}
    docs = "dynamic_sampling.md"

    @classmethod
    def check_combination(cls, args, members) -> None:
        estimator = members["advantage_estimator"]
        if not estimator.gives_group_advantages:
            raise config_error(
                "advantage_estimator",
                args.advantage_estimator,
                f"refill={args.refill!r} gives the new groups advantages from their outcome rewards, and "
                f"{estimator.__name__} cannot (PRM advantages need step rewards)",
                "use advantage_estimator='grpo' or 'pass_at_k', or refill='none' with sample_filter='nonzero_std' "
                "(masks the groups without signal, no refill)",
            )
        super().check_combination(args, members)  # every refill's rules (RefillBase)

    def __init__(self, args: Args, host: Host, *, rollouts: RolloutService):
        super().__init__(args, host)
        self.rollouts = rollouts
        if args.dynamic_sampling_max_rounds:
            # refuses, naming the fix, a train_dataset that is missing or empty
            rollouts.draw_prompts(0, torch.Generator())

    def on_generation(self, batch: GenerationBatch) -> Out[RefillUpdate | None]:
        if batch.mode != "train":
            return None  # evaluation batches are scored as generated
        args, host = self.args, self.host
        rollouts = self.rollouts
        group = batch.group_size
        local_rows = len(batch.prompts)
        if local_rows % group:
            raise ValueError(
                f"refill='dynamic_sampling' refills whole prompt groups, but this process holds {local_rows} "
                f"rows of groups of {group}. Fix: make per_device_train_batch_size x steps_per_generation a multiple "
                "of num_generations."
            )
        start = time.perf_counter()
        device = batch.rewards.device
        rank = batch.process_slice.start // local_rows
        local_groups = local_rows // group
        # (P,) whether each group of every process has signal: its scorable rewards differ (nonzero_std's rule)
        signal = nonzero_std(batch.rewards.view(-1, group), None)[:, 0]  # (no generator: it draws nothing)
        empty = (~signal[rank * local_groups : (rank + 1) * local_groups]).nonzero().flatten().tolist()  # own groups
        # new groups with signal: (rollout of G rows, (G,) rewards, (G, F) rewards per function, G dataset rows)
        found: list[tuple[Rollout, torch.Tensor, torch.Tensor, list[dict]]] = []
        generator = host.generator("dynamic_sampling", per_rank=True, device="cpu")
        rounds = 0
        for _ in range(args.dynamic_sampling_max_rounds):
            # every process generates as many groups as the neediest one (generation and scoring are collectives)
            count = int(host.gather(torch.tensor([float(len(empty) - len(found))], device=device)).max())
            if count <= 0:
                break
            rounds += 1
            rows = [row for row in rollouts.draw_prompts(count, generator) for _ in range(group)]
            prompts = [row["prompt"] for row in rows]
            rollout = rollouts.regenerate(prompts, temperature=args.temperature)
            # (processes x count x G,) and (processes x count x G, F)
            rewards, per_func = rollouts.score_rows(rows, prompts, rollout.completions, rollout.completion_ids)
            width = count * group
            own = rewards[rank * width : (rank + 1) * width].view(count, group)  # (count, G)
            own_per_func = per_func[rank * width : (rank + 1) * width]  # (count x G, F)
            for j, has_signal in enumerate(nonzero_std(own, None)[:, 0].tolist()):
                if has_signal and len(found) < len(empty):
                    take = list(range(j * group, (j + 1) * group))
                    found.append((rollout.select(take), own[j], own_per_func[take], [rows[i] for i in take]))
        refill = empty[: len(found)]  # the groups the new ones replace
        remaining = empty[len(found) :]  # still without signal
        copies: list[tuple[int, int]] = []
        if args.dynamic_sampling_fill == "replace" and remaining:
            # Copies are written before the new samples, so only the batch's own groups with signal are sources.
            sources = [g for g in range(local_groups) if g not in empty]
            for i, target in enumerate(remaining if sources else []):
                copies += [(sources[i % len(sources)] * group + k, target * group + k) for k in range(group)]
            remaining = remaining if not sources else []
        keep = torch.ones(local_groups, group, dtype=torch.bool, device=device)  # (p, G)
        keep[remaining] = False
        keep = keep.view(-1)  # (B,)
        all_keep = host.gather(keep)  # (N,)
        counts = torch.tensor([[float(len(refill)), float(len(copies) // group), float(len(remaining))]], device=device)
        refilled, duplicated, unfilled = host.gather(counts).sum(0).tolist()
        splice = None
        if refilled or duplicated:  # the same decision on every process: each runs the splice's forwards
            advantages = torch.zeros(0, device=device)  # a process with nothing new splices no row
            if found:  # (len(found) x G,) the configured estimator's advantages of the new groups
                advantages = rollouts.group_advantages(torch.cat([f[1] for f in found]).float(), group)
            splice = Splice(
                Rollout.concat([f[0] for f in found]),
                rows=[g * group + k for g in refill for k in range(group)],
                advantages=advantages,
                copies=copies,
            )
        groups = signal.numel()
        metrics = {
            "dynamic/rounds": rounds,
            "dynamic/signal_frac_before": float(signal.float().mean()),
            "dynamic/signal_frac_after": 1.0 - unfilled / max(groups, 1),
            "dynamic/refilled_groups": refilled,
            "dynamic/duplicated_groups": duplicated,
            "dynamic/extra_gen_time": time.perf_counter() - start,
            "dynamic/kept_frac": float(all_keep.float().mean()),
        }
        if not all_keep.any():
            logger.warning(
                "refill='dynamic_sampling': no group of this generation batch has signal after %d round(s) "
                "(step %d): it trains with zero loss. Raise dynamic_sampling_max_rounds or num_generations.",
                rounds,
                host.global_step,
            )
        functions = batch.rewards_per_func.size(1)
        update = RefillUpdate(
            splice=splice,
            keep=None if bool(all_keep.all()) else all_keep,
            inputs=[row for f in found for row in f[3]],
            rewards_per_func=torch.cat([f[2] for f in found]) if found else torch.zeros(0, functions, device=device),
        )
        return update, metrics
