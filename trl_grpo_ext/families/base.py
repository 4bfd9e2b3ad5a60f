"""The hook interface of a family member, the :class:`Host` it talks to, the services it may name, and the contexts
of the hooks.

A member never sees the trainer. It is built as ``Member(args, host, **services)``: ``args`` its own frozen settings
(:class:`Extension.Args`, copied from the run's config), ``host`` the :class:`Host` every member gets (the run's state,
collectives, seeded generators, loss aggregation, reading beta), and as keyword-only constructor
parameters the :data:`SERVICES` it names: what changes TRL's run beyond the loss (setting beta, dropping the ratio clip,
generating outside TRL's batch, callbacks, a scoring model, the reference model, decoding for evaluation). Each is a
typed object of its own, so mypy checks every use and a member holds nothing it did not name. Every access to TRL's
private attributes lives behind them, in the adapter package ``trl_grpo_ext/adapter`` (``TrainerHost`` and the
services of ``adapter/host.py``, ``RolloutService``); ``tests/test_boundary.py`` fails if a family module reaches past.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch
from transformers import PreTrainedTokenizerBase

from ..adapter.compat import PER_SEQUENCE_LOSS_TYPES, per_token_kl
from ..adapter.host import MonitorSource
from ..adapter.rollouts import RolloutService

# The registries (trl_grpo_ext.api types them; trl_grpo_ext.names holds them for the config), re-exported here too.
from ..api import (  # noqa: F401  (re-exported: trl_grpo_ext.families.base.TOKEN_CLIPS, ...)
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_WEIGHTINGS,
    ENTROPY_CONTROLS,
    KEEP_KEY,
    KL_CONTROLLERS,
    SAMPLE_FILTERS,
    TOKEN_CLIPS,
    GenerationBatch,
    GenerationUpdate,
    LossContext,
    Metrics,
    Out,
    Splice,
)
from ..core.advantages import ScaleKind
from ..core.collectives import Collectives
from ..names import FAMILIES, registry_for  # noqa: F401  (re-exported)
from .registration import args_fields, check_member_class, services_of  # noqa: F401  (args_fields re-exported)

E = TypeVar("E", bound="Extension")


class Host(Protocol):
    """What every member may use of the run. Implemented by ``trl_grpo_ext.adapter.host.TrainerHost``."""

    collectives: Collectives  #: sums / concatenations over all processes

    @property
    def beta(self) -> float:
        """The KL coefficient TRL reads live in its loss (a KL controller sets it through :class:`BetaControl`)."""

    @property
    def loss_type(self) -> str: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def num_processes(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def reward_func_names(self) -> list[str]: ...
    @property
    def reward_weights(self) -> list[float]: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def micro_step(self) -> int: ...
    @property
    def accumulation_steps(self) -> int: ...
    @property
    def step_end(self) -> bool: ...
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...
    @property
    def scale_rewards(self) -> ScaleKind: ...
    @property
    def top_entropy_quantile(self) -> float: ...
    @property
    def ratio_clip(self) -> tuple[float, float]: ...

    def generator(self, tag: str, *, per_rank: bool, device) -> torch.Generator:
        """A generator seeded from (seed, global step, micro-step, tag[, rank])."""

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, *, mode: str, num_items_in_batch) -> torch.Tensor:
        """Reduce a (B, T) term to the scalar TRL's ``loss_type`` would make of it."""

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a tensor of every process along dim 0."""

    def gather_object(self, obj: list) -> list:
        """Concatenate a Python list of every process."""


# ---------------------------------------------------------------------------------------------------- services
class BetaControl(Protocol):
    """``beta_control``: set the KL coefficient TRL reads live (the KL controllers)."""

    def set_beta(self, value: float) -> None:
        """Set beta from the next loss on (checked: finite and >= 0, or an error naming the member)."""


class RatioClip(Protocol):
    """``ratio_clip``: switch TRL's PPO ratio clip off (KL-Cov without ``kl_cov_ppo_clip``)."""

    def drop_ratio_clip(self) -> None:
        """epsilon_low = epsilon_high = inf."""


class ScoringModels(Protocol):
    """``scoring``: score steps outside TRL's reward functions (PRM step rewards)."""

    @property
    def step_reward_funcs(self) -> list[Callable]: ...

    def prepare_scoring_model(self, model):
        """A frozen scoring model (a PRM) placed as TRL places its reward models for the engine in use: wrapped by
        DeepSpeed under ZeRO-3, sharded under FSDP. Its forwards are then collectives: run as many on every process."""

    def reward_kwargs(self, inputs: list[dict], completion_ids: list) -> dict[str, Any]:
        """The keyword arguments TRL passes to reward functions for these rows (dataset columns, trainer_state,
        log_extra, log_metric, environments, completion_ids)."""


class Callbacks(Protocol):
    """``callbacks``: act at step ends."""

    def add_callback(self, callback) -> None:
        """Register a ``TrainerCallback``."""


class Evaluation(Protocol):
    """``evaluation``: decode and score outside the batch (pass@k's greedy accuracy)."""

    def greedy_completions(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, prompts: list) -> list:
        """One greedy decode per (left-padded) prompt, decoded as TRL decodes completions."""

    def score_rule_based(self, inputs: list[dict], prompts: list, completions: list) -> torch.Tensor:
        """(n,) weighted sum of the Python reward functions on this process's rows (model-based ones skipped)."""


class ReferenceModel(Protocol):
    """``reference``: TRL's reference model and the optimizer (the reference reset)."""

    def prepare_reference(self) -> bool:
        """Make TRL's reference one a reset can move (with PEFT: a frozen copy of the adapter, TRL's ``"ref"``
        adapter); False where there is none (beta 0)."""

    def reset_reference(self) -> bool:
        """Make the reference model the current policy (a collective under ZeRO-3); False where there is none."""

    def reset_optimizer_moments(self) -> int:
        """Zero the optimizer's per-parameter state (Adam's moments, step counts); returns how many were reset."""


#: The services a member may name as keyword-only parameters of its constructor (name -> type); the trainer passes
#: each named one (``build_member``) and registration refuses any other name.
SERVICES: dict[str, Any] = {
    "beta_control": BetaControl,
    "ratio_clip": RatioClip,
    "scoring": ScoringModels,
    "callbacks": Callbacks,
    "evaluation": Evaluation,
    "reference": ReferenceModel,
    "rollouts": RolloutService,  # generate, score and run forwards outside TRL's batch (AEPO, dynamic sampling)
    "monitor_source": MonitorSource,  # what the collapse monitor reads and does (checkpoints, TRL's logs)
}


def member_args(config: Any, member: type[Extension]) -> Extension.Args:
    """``member.Args`` filled from the run's ``config``: the member's own frozen settings (each value a deep copy, so
    editing a list of it cannot reach the run's config, and nothing of the config is reachable from it)."""
    return member.Args(**{f.name: copy.deepcopy(getattr(config, f.name)) for f in dataclasses.fields(member.Args)})


def build_member(member: type[E], config: Any, host: Host, services: dict[str, Callable[[str], Any]]) -> E:
    """``member(args, host, **services)``: its own ``Args`` from ``config``, and each service its constructor names
    (``services``: name -> a factory given the member's class name, for the errors a service raises)."""
    named = {name: services[name](member.__name__) for name in services_of(member)}
    return member(member_args(config, member), host, **named)


class Extension:
    """Base class of a family member; every hook is a no-op.

    Every hook returns its value, or ``(value, metrics)``: ``metrics`` maps keys the class declares (:attr:`metrics`,
    :attr:`optional_metrics`) to numbers, which the trainer logs under the hook's mode (``batch.mode`` / ``ctx.mode``)
    once it checked them (``trl_grpo_ext.api.Out``); a hook that has no value returns ``None`` or ``(None, metrics)``.

    Hooks, in the order the trainer calls them:
        ``on_generation(batch)``: after TRL scored a generation batch; returns a :class:`GenerationUpdate` (new
            advantages, new groups, rows to keep) or None, which the trainer applies before the next member runs.
        ``group_advantages(rewards, group_size)``: advantage estimators only: the (n,) advantages of whole groups
            scored outside TRL's batch (dynamic sampling's new groups), or None where rewards are not enough (PRM).
        ``shape_advantages(advantages, ctx)``: inside the loss, once the policy's log-probs and entropies
            (``ctx.logps``, ``ctx.entropies``) are known: returns the (B,) or (B, T) advantages TRL's loss uses for this
            micro-batch (the input unchanged by default; the buffered batch is never edited).
        ``select_tokens(logps, ctx)``: inside the loss, before ``modify_logps``: the (B, T) bool tokens the member acts
            on in this micro-batch (a token clip's selection), or None; the trainer stores it as ``ctx.selected`` for
            the member's ``modify_logps`` and ``extra_loss`` (one member per run may select).
        ``modify_logps(logps, ctx)``: inside the loss, on the log-probs TRL's loss is about to use.
        ``extra_loss(ctx)``: a term added to TRL's loss (aggregate it with :meth:`aggregate`).
        ``after_loss(ctx)``: after the loss of a micro-batch (accumulate statistics, act at optimizer-step ends).
        ``state_dict()`` / ``load_state_dict(state)``: saved in and restored from checkpoints.
    """

    #: True for a family's "off" member (:class:`Off`): the trainer skips it.
    is_off: ClassVar[bool] = False
    #: Metric keys the member logs every time it acts (the registry sweep checks them; dashboards group by prefix).
    metrics: ClassVar[tuple[str, ...]] = ()
    #: Metric keys it logs only in some steps (a term that is zero, a quantity not yet measured): declared too, so
    #: every key a run logs is somebody's (``declared_metrics``; the sweep checks no undeclared key appears).
    optional_metrics: ClassVar[tuple[str, ...]] = ()
    #: Config fields the member needs besides its switch, with working values (the sweep and the docs use them).
    example_config: ClassVar[dict[str, Any]] = {}
    #: The docs page of the method.
    docs: ClassVar[str] = ""
    #: Advantage estimators: whether :meth:`group_advantages` gives whole groups' advantages from their rewards alone
    #: (what dynamic sampling's new groups need; PRM's need step rewards).
    gives_group_advantages: ClassVar[bool] = False

    @dataclasses.dataclass(frozen=True)
    class Args:
        """The member's own settings: the config fields it reads, typed as the config types them, copied from the run's
        config when the member is built (frozen). A member reading more declares ``class Args(<its base>.Args)`` with
        the fields it adds (``@dataclass(frozen=True)``) and annotates ``args: Args``, so mypy checks every read; a
        field no config has is refused when the run is configured. A field with a default and ``help`` metadata is
        the member's own parameter: a config field the config composes for the package's members
        (``trl_grpo_ext.config.members``)."""

        use_bias_correction_kl: bool  # read by trl_kl below

        if not TYPE_CHECKING:  # a run-time hint only: mypy must still refuse a misspelt read

            def __getattr__(self, name: str):  # called for names that are not fields
                if name.startswith("__"):
                    raise AttributeError(name)
                raise AttributeError(
                    f"{type(self).__qualname__} has no field {name!r}: a member reads only the config fields of its "
                    f"Args. Fix: add `{name}: <its type>` to {type(self).__qualname__} (a frozen dataclass deriving "
                    "from its base's Args)."
                )

    args: Args
    #: What every member may use of the run (typed: mypy checks every use).
    host: Host

    def __init__(self, args: Args, host: Host):
        """Built by the trainer as ``Member(args, host, **services)`` (:func:`build_member`). A member using a
        service names it as a keyword-only parameter typed as in :data:`SERVICES` and keeps it:
        ``def __init__(self, args: Args, host: Host, *, rollouts: RolloutService)``."""
        self.args = args
        self.host = host

    @classmethod
    def check_registration(cls, *, family: str, name: str) -> None:
        """Refuse, at its ``@REGISTRY.register(name)`` line, a class that cannot be a member of ``family``: the member
        contract of :func:`~.registration.check_member_class` (each registry runs it, ``names.member_contract``)."""
        check_member_class(cls, family=family, name=name, root=Extension, services=SERVICES)

    @classmethod
    def check_combination(cls, args, members: dict[str, type]) -> None:
        """Refuse a configuration this member cannot run with: ``args`` is the whole config, ``members`` the selected
        member class of every family (switch -> class). Raise ``trl_grpo_ext.names.config_error(field, value,
        problem, fix)``. Rules about another family read its member's class and traits (``is_off``,
        :attr:`gives_group_advantages`, the services it names, the fields of its ``Args``), never its switch's value,
        so they hold for registered variants too. Called by ``GRPOExtConfig.validate`` (construction, the trainer,
        ``train``).
        """

    @classmethod
    def never_negative_advantages(cls, args) -> bool:
        """Advantage estimators: whether, with these settings, no advantage it writes is ever negative (a weighting
        by sign then only rescales the loss)."""
        return False

    def on_generation(self, batch: GenerationBatch) -> Out[GenerationUpdate | None]:
        return None

    def group_advantages(self, rewards: torch.Tensor, group_size: int) -> Out[torch.Tensor | None]:
        return None

    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor]:
        return advantages

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor | None]:
        return None

    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> Out[torch.Tensor]:
        return logps

    def extra_loss(self, ctx: LossContext) -> Out[torch.Tensor | None]:
        return None

    def after_loss(self, ctx: LossContext) -> Out[None]:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # Helpers shared by the members
    def trl_kl(self, ctx: LossContext) -> torch.Tensor:
        """(B, T) the KL term exactly as TRL's loss computes it for this micro-batch (differentiable)."""
        return per_token_kl(
            ctx.logps,
            ctx.inputs["ref_per_token_logps"],
            old_logps=ctx.old_logps,
            bias_correction=self.args.use_bias_correction_kl,
        )

    def aggregate(self, per_token: torch.Tensor, ctx: LossContext, *, scale_rows: bool = True) -> torch.Tensor:
        """Aggregate a (B, T) term exactly like the configured ``loss_type`` (see :mod:`trl_grpo_ext.adapter.compat`).

        ``scale_rows``: apply the per-sequence rescale to the kept rows (``ctx.row_scale``), as for any term that
        should average over the kept rows only; pass False for a term that mirrors TRL's own (unscaled) loss.
        """
        host = self.host
        value = host.aggregate(
            per_token, ctx.mask, mode=ctx.mode, num_items_in_batch=ctx.inputs.get("num_items_in_batch")
        )
        if scale_rows and host.loss_type in PER_SEQUENCE_LOSS_TYPES:
            value = value * ctx.row_scale
        return value


class Off(Extension):
    """The "off" member every family registers (``token_clip="none"``, ``kl_control="fixed"``, ...): no hooks; the
    trainer does not instantiate it, so a run with every family off is TRL's ``GRPOTrainer``. Its ``on_generation``
    returns nothing, which satisfies every family's interface (:mod:`~trl_grpo_ext.families.interfaces`)."""

    is_off = True

    def on_generation(self, batch: GenerationBatch) -> None:
        return None
