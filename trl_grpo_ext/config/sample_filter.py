"""The config section of two families: sample filtering (PF-PPO, arXiv 2409.06957) and refilling (DAPO's dynamic
sampling, arXiv 2503.14476)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .section import ConfigSection, _fail, bounds, family_switch


@dataclass
class SampleFilterConfig(ConfigSection):
    r"""
    > Sample filtering (PF-PPO, arXiv 2409.06957) and refilling (DAPO, arXiv 2503.14476)

        sample_filter (`str`, *optional*, defaults to `"none"`):
            Which completions of each prompt group train: `"best_of_n"`, `"best_random"`, `"best_worst"`,
            `"nonzero_std"` (drop groups whose rewards are all equal), or `"none"`. Filtered rows are masked out of the
            loss; advantages are still computed over the full group. With a `refill`, it chooses among the refilled
            groups' samples.
        refill (`str`, *optional*, defaults to `"none"`):
            `"dynamic_sampling"` (DAPO): replace the groups whose rewards are all equal by new groups with signal,
            generated from `train_dataset`, before the advantage weighting, the sample filter and the monitor read the
            batch; or `"none"`.
        pf_rescale (`bool`, *optional*, defaults to `True`):
            For loss types that average per sequence (`grpo`, `sapo`, `luspo`, `dr_grpo`), rescale each micro-batch so
            the loss equals the loss over its kept rows alone (kept by the sample filter and the refill), instead of
            being diluted by the masked ones.
        pf_filter_eval (`bool`, *optional*, defaults to `False`):
            Also filter evaluation batches. Off by default, so `eval_loss` is computed on every completion and stays
            comparable with a `GRPOTrainer` run.
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `3`):
            With `refill="dynamic_sampling"`: at most this many extra generation rounds per generation batch,
            each generating as many new prompt groups as the process with most groups without signal still needs
            (0: no refill, the groups are only masked, as `"nonzero_std"`).
        dynamic_sampling_fill (`str`, *optional*, defaults to `"filter"`):
            What the groups still without signal after the last round become: `"filter"` (DAPO) masks them out of
            the loss; `"replace"` (Polaris) fills them with copies of this process's groups with signal.
    """

    switches = ("sample_filter", "refill")

    #: Finite but absurd values refused: field -> (lowest, highest, why, example) (config.section.bounds).
    field_bounds = {
        "dynamic_sampling_max_rounds": bounds(
            0,
            100,
            "each round generates up to a batch of new groups; beyond 100 a step can run for hours on a task "
            "the policy has solved",
            "dynamic_sampling_max_rounds=3",
        ),
    }

    sample_filter: str = family_switch(
        "sample_filter",
        default="none",
        help="PF-PPO filtering per prompt group: 'best_of_n', 'best_random', 'best_worst', 'nonzero_std', or "
        "'none'. Filtered completions are masked out of the loss.",
    )
    refill: str = family_switch(
        "refill",
        default="none",
        help="'dynamic_sampling' (DAPO): replace the prompt groups without signal by new groups with signal "
        "before the sample filter chooses; or 'none'.",
    )
    pf_rescale: bool = field(
        default=True,
        metadata={
            "help": "For per-sequence loss types (grpo, sapo, luspo, dr_grpo), rescale each micro-batch's loss to "
            "the mean over its kept rows (sample filter and refill) instead of diluting it with the masked ones."
        },
    )
    pf_filter_eval: bool = field(
        default=False,
        metadata={"help": "Also filter evaluation batches (off: eval_loss uses every completion, as GRPOTrainer)."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={
            "help": "refill='dynamic_sampling': the most extra generation rounds per generation batch (0: "
            "mask the groups without signal, no refill).",
        },
    )
    dynamic_sampling_fill: Literal["filter", "replace"] = field(
        default="filter",
        metadata={
            "help": "Groups still without signal after the last round: 'filter' (DAPO) masks them, 'replace' "
            "(Polaris) fills them with copies of this process's groups with signal."
        },
    )

    def check(self) -> None:
        if self.dynamic_sampling_max_rounds < 0:
            _fail("dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds, "must be >= 0", "e.g. 3")
