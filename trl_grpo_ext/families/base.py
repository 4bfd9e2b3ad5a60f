"""The hook interface of a family member, the narrow :class:`Host` it talks to, and the contexts of the hooks.

An extension never sees the trainer: it gets a :class:`Host`, the one door to TRL (beta, metric logging, loss-type
aggregation, seeded generators, collectives, the tokenizer, and for the members that generate outside TRL's batch the
rollout service of :mod:`trl_grpo_ext.adapter.rollouts`). Every access to TRL's private attributes lives behind it,
in ``trl_grpo_ext/trainer.py`` (``TrainerHost``) and the adapter package ``trl_grpo_ext/adapter`` (``RolloutService``,
the copies of TRL code); a TRL upgrade touches those, and ``tests/test_boundary.py`` fails if a family module reaches
past the host.

A member sees the host through a :class:`HostView`: what changes TRL's run beyond the loss (generating and scoring
rollouts, setting beta, dropping the ratio clip, callbacks, a scoring model) is in :data:`CAPABILITIES`, and a member
uses it only where its class declares it (``Extension.host_capabilities``); anything else raises an error naming the
capability to declare.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import torch

from ..adapter.compat import PER_SEQUENCE_LOSS_TYPES, per_token_kl
from ..adapter.rollouts import RolloutService

# The registries (trl_grpo_ext.api types them; trl_grpo_ext.names holds them for the config), re-exported here too.
from ..api import (  # noqa: F401  (re-exported)  # noqa: F401  (re-exported: trl_grpo_ext.families.base.TOKEN_CLIPS, ...)
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
    Splice,
)
from ..core.advantages import ScaleKind
from ..core.collectives import Collectives
from ..names import FAMILIES, registry_for  # noqa: F401  (re-exported)
from .contracts import Receiver


class Host(Protocol):
    """What an extension may use of the trainer. Implemented by ``trl_grpo_ext.adapter.host.TrainerHost``."""

    args: Any  #: the GRPOExtConfig
    collectives: Collectives  #: sums / concatenations over all processes
    beta: float  #: KL coefficient TRL reads live in its loss (settable)
    clock: Any  #: the trainer's ``ExtClock`` of plugin time (work outside the hooks, a callback, measures with it)
    #: generation, scoring and forwards outside TRL's batch (the ``rollout`` capability;
    #: :mod:`trl_grpo_ext.adapter.rollouts`)
    rollouts: RolloutService

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
    def zero_logged_advantages(self, rows: torch.Tensor) -> None: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def micro_step(self) -> int: ...
    @property
    def accumulation_steps(self) -> int: ...
    @property
    def step_end(self) -> bool: ...
    @property
    def tokenizer(self) -> Any: ...
    @property
    def scale_rewards(self) -> ScaleKind: ...
    @property
    def top_entropy_quantile(self) -> float: ...
    @property
    def step_reward_funcs(self) -> list[Callable]: ...
    @property
    def ratio_clip(self) -> tuple[float, float]: ...

    def drop_ratio_clip(self) -> None:
        """Switch TRL's PPO ratio clip off (epsilon_low = epsilon_high = inf)."""

    def log(self, mode: str, name: str, value: float) -> None:
        """Append a value to the trainer's metrics of ``mode`` ("train" / "eval"); averaged at the next log."""

    def log_column(self, name: str, values: list) -> None:
        """Extend a column of TRL's completions table (one value per row of the last generation batch)."""

    def add_callback(self, callback) -> None:
        """Register a ``TrainerCallback`` (an observer that acts at step ends)."""

    def metric_values(self, mode: str, name: str) -> list:
        """The values logged under ``name`` (TRL's and the members') since the trainer's last log; [] if none."""

    def save_checkpoint(self) -> None:
        """Save a checkpoint now (``checkpoint-<global step>``, extension state included): every process calls it."""

    def restore_checkpoint(self, folder: str) -> None:
        """Load a checkpoint's weights, optimizer, scheduler and extension state into the running trainer (its state,
        the record of the run, is kept): every process calls it."""

    def discard_buffered_rollouts(self) -> None:
        """Drop TRL's buffered generation batch: the next training step generates afresh."""

    def prepare_reference(self) -> bool:
        """Make TRL's reference one a reset can move (with PEFT: a frozen copy of the adapter, TRL's ``"ref"``
        adapter); False where there is none (beta 0)."""

    def reset_reference(self) -> bool:
        """Make the reference model the current policy (a collective under ZeRO-3); False where there is none."""

    def reset_optimizer_moments(self) -> int:
        """Zero the optimizer's per-parameter state (Adam's moments, step counts); returns how many were reset."""

    def greedy_completions(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, prompts: list) -> list:
        """One greedy decode per (left-padded) prompt, decoded as TRL decodes completions."""

    def prepare_scoring_model(self, model):
        """A frozen scoring model (a PRM) placed as TRL places its reward models for the engine in use: wrapped by
        DeepSpeed under ZeRO-3, sharded under FSDP. Its forwards are then collectives: run as many on every process."""

    def score_rule_based(self, inputs: list[dict], prompts: list, completions: list) -> torch.Tensor:
        """(n,) weighted sum of the Python reward functions on this process's rows (model-based ones skipped)."""

    def generator(self, tag: str, *, per_rank: bool, device) -> torch.Generator:
        """A generator seeded from (seed, global step, micro-step, tag[, rank])."""

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, *, mode: str, num_items_in_batch) -> torch.Tensor:
        """Reduce a (B, T) term to the scalar TRL's ``loss_type`` would make of it."""

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a tensor of every process along dim 0."""

    def gather_object(self, obj: list) -> list:
        """Concatenate a Python list of every process."""

    def log_advantages(self, per_row: torch.Tensor) -> None:
        """Replace the advantages of the last N rows of TRL's completions table by (N,) ``per_row``."""

    def reward_kwargs(self, inputs: list[dict], completion_ids: list) -> dict[str, Any]:
        """The keyword arguments TRL passes to reward functions for these rows (dataset columns, trainer_state,
        log_extra, log_metric, environments, completion_ids)."""


#: Host members a family member may use only where its class declares the capability
#: (``Extension.host_capabilities``); the rest of :class:`Host` (the run's state and settings, reading beta, metric
#: logging, collectives, seeded generators, loss aggregation) is every member's.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    # generate, score and run forwards outside TRL's own batch (AEPO, dynamic sampling)
    "rollout": ("rollouts",),
    "set_beta": (),  # assigning ``host.beta`` (the KL controllers); reading it is everyone's
    "ratio_clip": ("drop_ratio_clip",),  # switch TRL's PPO ratio clip off (KL-Cov without kl_cov_ppo_clip)
    "scoring_model": ("prepare_scoring_model", "reward_kwargs", "step_reward_funcs"),  # PRM step rewards
    "callbacks": ("add_callback",),  # act at step ends (the collapse monitor)
    "checkpoints": ("save_checkpoint", "restore_checkpoint", "discard_buffered_rollouts"),  # a collapse rollback
    "evaluation": ("greedy_completions", "score_rule_based"),  # decode and score outside the batch (pass@k)
    "completions_table": ("log_advantages", "zero_logged_advantages"),  # TRL's completions table (the trainer's own)
    # the reference reset: TRL's reference model and the optimizer
    "reference": ("prepare_reference", "reset_reference", "reset_optimizer_moments"),
}  # fmt: skip
_NEEDS = {name: capability for capability, names in CAPABILITIES.items() for name in names}
_PROTOCOL = frozenset(
    {name for name in vars(Host) if not name.startswith("_")} | set(Host.__annotations__) | {"feeds_collapse_monitor"}
)


def args_fields(member: type[Extension]) -> frozenset[str]:
    """The config fields a member class reads: the fields of its :class:`Extension.Args`."""
    return frozenset(f.name for f in dataclasses.fields(member.Args))


def member_args(config: Any, member: type[Extension]) -> Extension.Args:
    """``member.Args`` filled from the run's ``config``: the member's own frozen settings (each value a deep copy, so
    editing a list of it cannot reach the run's config, and nothing of the config is reachable from it)."""
    return member.Args(**{f.name: copy.deepcopy(getattr(config, f.name)) for f in dataclasses.fields(member.Args)})


def _private(view, name: str) -> AttributeError | None:
    """The error for reading the host view's internals from outside (``self.host._host``)."""
    if name.startswith("_") and not name.startswith("__"):
        owner = object.__getattribute__(view, "_owner")
        return AttributeError(
            f"{owner} reads {name} of its {type(view).__name__}: a member reaches the run only through the names its "
            "view allows (trl_grpo_ext.families.base.Host)."
        )
    return None


class HostView:
    """The :class:`Host` as one member sees it: every protocol member but the :data:`CAPABILITIES` its class did not
    declare. Using one of those, or anything outside the protocol (the host behind the view included), is an
    ``AttributeError`` that names the member, the capability and where to declare it, so a member cannot reach further
    into the run than its class says. A beta it sets is checked (finite, >= 0) before TRL sees it."""

    def __init__(self, host: Host, capabilities, owner: str, args=None):
        unknown = set(capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"{owner}.host_capabilities: unknown {sorted(unknown)}; choose from {list(CAPABILITIES)}.")
        object.__setattr__(self, "args", args)  # the member's Args (the same object as its self.args)
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "_capabilities", frozenset(capabilities))
        object.__setattr__(self, "_owner", owner)

    def __getattribute__(self, name: str):
        error = _private(self, name)
        if error is not None:
            raise error
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str):  # after __getattribute__ raised (private names) or found nothing
        if name.startswith("__"):
            raise AttributeError(name)
        error = _private(self, name)
        if error is not None:
            raise error
        owner = object.__getattribute__(self, "_owner")
        needed = _NEEDS.get(name)
        if needed is not None and needed not in object.__getattribute__(self, "_capabilities"):
            raise AttributeError(
                f"{owner} uses host.{name}, which needs the host capability {needed!r} that the class does not "
                f"declare. Fix: add {needed!r} to {owner}.host_capabilities (trl_grpo_ext.families.base."
                "CAPABILITIES lists what each capability allows)."
            )
        if name not in _PROTOCOL:
            raise AttributeError(
                f"{owner} uses host.{name}, which is not part of the Host protocol (trl_grpo_ext.families.base."
                "Host): a member reaches TRL only through the host's declared members."
            )
        return getattr(object.__getattribute__(self, "_host"), name)

    def __setattr__(self, name: str, value) -> None:
        owner = object.__getattribute__(self, "_owner")
        if name != "beta":
            raise AttributeError(f"{owner} sets host.{name}: only host.beta is settable.")
        if "set_beta" not in object.__getattribute__(self, "_capabilities"):
            raise AttributeError(
                f"{owner} sets host.beta, which needs the host capability 'set_beta' that the class does not "
                f"declare. Fix: add 'set_beta' to {owner}.host_capabilities."
            )
        host = object.__getattribute__(self, "_host")
        setattr(host, name, Receiver(lambda: host.global_step).beta(owner, value))


def restrict(host: Host, member: type) -> HostView:
    """``host`` as ``member`` (an :class:`Extension` subclass) may use it: a view of the unrestricted host whose
    ``args`` is the member's own :class:`Extension.Args`, filled from the run's config."""
    if isinstance(host, HostView):
        host = object.__getattribute__(host, "_host")
    return HostView(
        host, getattr(member, "host_capabilities", ()), member.__name__, args=member_args(host.args, member)
    )


class Extension:
    """Base class of a family member; every hook is a no-op.

    Hooks, in the order the trainer calls them:
        ``on_generation(batch)``: after TRL scored a generation batch; returns a :class:`GenerationUpdate` (new
            advantages, rows to keep) or None, which the trainer applies before the next member runs.
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
        ``loss_scale(inputs, mode)``: a factor for this micro-batch's per-sequence loss (the trainer scales the
            advantages by the product of the factors; ``ctx.row_scale`` holds it for :meth:`aggregate`).
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
    #: The :data:`CAPABILITIES` of the host the member uses beyond what every member may (its ``self.host`` is a
    #: :class:`HostView` that refuses the others).
    host_capabilities: ClassVar[tuple[str, ...]] = ()

    #: Advantage estimators: whether :meth:`group_advantages` gives whole groups' advantages from their rewards alone
    #: (what dynamic sampling's new groups need; PRM's need step rewards).
    gives_group_advantages: ClassVar[bool] = False
    #: Sample filters: whether the member puts new groups in place of the groups without signal (dynamic sampling).
    refills_groups: ClassVar[bool] = False

    @dataclasses.dataclass(frozen=True)
    class Args:
        """The member's own settings: the config fields it reads, typed as the config types them, copied from the run's
        config when the member is built (frozen). A member reading more declares ``class Args(<its base>.Args)`` with
        the fields it adds (``@dataclass(frozen=True)``, no defaults: the config's are the only ones) and annotates
        ``args: Args``, so mypy checks every read; a field no config has is refused when the run is configured."""

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
    #: The run as the member may use it, typed as the :class:`Host` protocol so mypy checks every use (at run time a
    #: :class:`HostView` refusing the capabilities the class did not declare).
    host: Host

    def __init__(self, host: Host):
        view = restrict(host, type(self))
        self.host = cast(Host, view)
        self.args = view.args

    @classmethod
    def check_combination(cls, args, members: dict[str, type]) -> None:
        """Refuse a configuration this member cannot run with: ``args`` is the whole config, ``members`` the selected
        member class of every family (switch -> class). Raise ``trl_grpo_ext.names.config_error(field, value,
        problem, fix)``. Rules about another family read its member's class and traits (:attr:`refills_groups`,
        :attr:`gives_group_advantages`, ``host_capabilities``, the fields of its ``Args``), never its switch's value,
        so they hold for registered variants too. Called by ``GRPOExtConfig.validate`` (construction, the trainer,
        ``train``).
        """

    @classmethod
    def never_negative_advantages(cls, args) -> bool:
        """Advantage estimators: whether, with these settings, no advantage it writes is ever negative (a weighting
        by sign then only rescales the loss)."""
        return False

    def on_generation(self, batch: GenerationBatch) -> GenerationUpdate | None:
        return None

    def group_advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor | None:
        return None

    def shape_advantages(self, advantages: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return advantages

    def select_tokens(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor | None:
        return None

    def modify_logps(self, logps: torch.Tensor, ctx: LossContext) -> torch.Tensor:
        return logps

    def loss_scale(self, inputs: dict[str, Any], mode: str) -> float:
        return 1.0

    def extra_loss(self, ctx: LossContext) -> torch.Tensor | None:
        return None

    def after_loss(self, ctx: LossContext) -> None:
        pass

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

    def log_metric(self, mode: str, name: str, value: float) -> None:
        self.host.log(mode, name, float(value))

    def aggregate(self, per_token: torch.Tensor, ctx: LossContext, *, scale_rows: bool = True) -> torch.Tensor:
        """Aggregate a (B, T) term exactly like the configured ``loss_type`` (see :mod:`trl_grpo_ext.adapter.compat`).

        ``scale_rows``: apply the sample filter's per-sequence rescale (``ctx.row_scale``), as for any term that
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
