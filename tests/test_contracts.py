"""The member contract (trl_grpo_ext.families.contracts): a class is checked when it is registered, what a member
returns is checked where the trainer receives it, and a member holds its own frozen settings and the services it
named. Each bad input gives an
error naming the member (or field), the hook, the step and the fix."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from trl_grpo_ext import GRPOExtConfig
from trl_grpo_ext.adapter.host import BetaService
from trl_grpo_ext.core import pf_keep_mask
from trl_grpo_ext.families import ADVANTAGE_WEIGHTINGS, ENTROPY_CONTROLS, KL_CONTROLLERS, TOKEN_CLIPS, Extension
from trl_grpo_ext.families.base import SERVICES, BetaControl, GenerationUpdate, Host, build_member, member_args
from trl_grpo_ext.families.contracts import MemberContractError, Receiver
from trl_grpo_ext.families.interfaces import AdvantageUpdate, FilterUpdate

#: Tiny trainers, seconds in all: in the edit-loop tier (tests/conftest.py).
pytestmark = pytest.mark.fast


# ------------------------------------------------------------------------------------------------- registration
def test_a_plain_function_is_refused_at_registration():
    with pytest.raises(
        MemberContractError, match=r"token_clip='fn_clip': clip is not a class derived from .*Extension"
    ):

        @TOKEN_CLIPS.register("fn_clip")
        def clip(logps, ctx):
            return logps

    assert "fn_clip" not in TOKEN_CLIPS


def test_a_constructor_the_trainer_cannot_call_is_refused():
    """The trainer builds a member as cls(args, host, **the services it names): another shape, an unknown service
    or a catch-all is refused at the register line, with the signature to write."""
    fix = r"the trainer builds every member as \w+\(args, host, \*\*services\).*def __init__\(self, args: Args, host: "
    with pytest.raises(MemberContractError, match=r"NoHost\.__init__ takes \(\): " + fix):

        @TOKEN_CLIPS.register("no_host_clip")
        class NoHost(Extension):
            def __init__(self):
                pass

            def modify_logps(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"OldStyle\.__init__ takes \(host\)"):

        @TOKEN_CLIPS.register("old_style_clip")
        class OldStyle(Extension):
            def __init__(self, host):
                pass

            def modify_logps(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"names the unknown service\(s\) \['checkpoints'\] \(the services: "):

        @TOKEN_CLIPS.register("unknown_service_clip")
        class Unknown(Extension):
            def __init__(self, args, host, *, checkpoints):
                super().__init__(args, host)

            def modify_logps(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"CatchAll\.__init__ takes \(args, host, services\)"):

        @TOKEN_CLIPS.register("catch_all_clip")
        class CatchAll(Extension):
            def __init__(self, args, host, **services):
                super().__init__(args, host)

            def modify_logps(self, logps, ctx):
                return logps

    assert not {"no_host_clip", "old_style_clip", "unknown_service_clip", "catch_all_clip"} & set(TOKEN_CLIPS.names())


def test_a_members_args_must_be_a_frozen_dataclass_of_its_bases_with_documented_defaults_and_real_fields():
    with pytest.raises(
        MemberContractError, match=r"Old\.config_fields is no longer read.*class Args\(Extension\.Args\)"
    ):

        @TOKEN_CLIPS.register("old_clip")
        class Old(Extension):
            config_fields = ("temperature",)

            def modify_logps(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"Plain\.Args is not a frozen dataclass of its own"):

        @TOKEN_CLIPS.register("plain_clip")
        class Plain(Extension):
            class Args(Extension.Args):  # no decorator: its annotation is no field
                temperature: float

            def modify_logps(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"Orphan\.Args does not derive from Extension\.Args"):

        @TOKEN_CLIPS.register("orphan_clip")
        class Orphan(Extension):
            @dataclasses.dataclass(frozen=True)
            class Args:
                temperature: float

            def modify_logps(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"Default\.Args gives \['temperature'\] a default but no help"):

        @TOKEN_CLIPS.register("default_clip")
        class Default(Extension):
            @dataclasses.dataclass(frozen=True)
            class Args(Extension.Args):
                temperature: float = 0.5

            def modify_logps(self, logps, ctx):
                return logps

    for name in ("old_clip", "plain_clip", "orphan_clip", "default_clip"):
        assert name not in TOKEN_CLIPS

    @TOKEN_CLIPS.register("typo_clip")
    class Typo(Extension):
        @dataclasses.dataclass(frozen=True)
        class Args(Extension.Args):
            temprature: float

        args: Args

        def modify_logps(self, logps, ctx):
            return logps

    try:  # a field is checked against the config the member is selected in (a subclass may add its own fields)
        with pytest.raises(MemberContractError, match=r"Typo\.Args declares \['temprature'\], which are not fields"):
            GRPOExtConfig(output_dir="unused", use_cpu=True, bf16=False, token_clip="typo_clip")

        @dataclasses.dataclass
        class WithTemprature(GRPOExtConfig):
            temprature: float = 0.5

        WithTemprature(output_dir="unused", use_cpu=True, bf16=False, token_clip="typo_clip")
    finally:
        TOKEN_CLIPS.unregister("typo_clip")


def _parameter_clip(default=0.5, help="How warm.", module=None):
    """A token clip whose ``Args`` declares one parameter, ``warmth``; ``module``: where it claims to live."""

    class Warm(Extension):
        @dataclasses.dataclass(frozen=True)
        class Args(Extension.Args):
            warmth: float = dataclasses.field(default=default, metadata={"help": help})

        args: Args

        def modify_logps(self, logps, ctx):
            return logps

    if module is not None:
        Warm.__module__ = module
    return Warm


def test_the_package_members_parameters_are_config_fields_and_a_users_are_not():
    """A field of a member's ``Args`` with a default and help is its parameter: for the package's members the config
    composes it (``config.members``: type, default, help, docstring); a member from elsewhere is left out (the config's
    fields never depend on what was imported first), and two members declaring one name differently are refused."""
    from trl_grpo_ext.config.members import member_parameters, parameters_section

    inside = ('token_clip="warm"', _parameter_clip(module="trl_grpo_ext.families.warm"))
    outside = ('token_clip="my_warm"', _parameter_clip(module="my_pkg.clips"))
    again = ('token_clip="warm_too"', _parameter_clip(module="trl_grpo_ext.families.warm_too"))
    found = member_parameters([inside, outside, again])
    assert list(found) == ["warmth"] and found["warmth"][0] is float
    assert found["warmth"][2] == ['token_clip="warm"', 'token_clip="warm_too"']
    section = parameters_section([inside, outside])
    (field,) = dataclasses.fields(section)
    assert (field.name, field.default, field.metadata["help"]) == ("warmth", 0.5, "How warm.")
    assert section().warmth == 0.5 and section.__module__ == "trl_grpo_ext.config.members"
    assert "warmth (`float`, *optional*, defaults to `0.5`):" in section.__doc__
    assert 'How warm. (A parameter of `token_clip="warm"`.)' in section.__doc__
    assert dataclasses.fields(parameters_section([outside])) == () and parameters_section([outside]).__doc__ == ""
    made_by_exec = _parameter_clip()
    made_by_exec.__module__ = None  # a class exec'd without a __name__ (docs/index.md's worked example) has no module
    assert member_parameters([('token_clip="exec"', made_by_exec)]) == {}
    other = ('token_clip="warmer"', _parameter_clip(default=0.25, module="trl_grpo_ext.families.warmer"))
    with pytest.raises(MemberContractError, match=r"both declare the parameter 'warmth', with a different type"):
        member_parameters([inside, other])
    with pytest.raises(MemberContractError, match=r"gives 'warmth', a field the config already has, a default"):
        member_parameters([inside], taken={"warmth", "beta"})
    # the shipped config: DPPO's parameters, declared by the member, are its fields with the member's defaults
    dppo = {f.name: f.default for f in dataclasses.fields(GRPOExtConfig) if f.name.startswith("dppo_")}
    assert dppo == {"dppo_divergence": "tv", "dppo_delta_low": 0.2, "dppo_delta_high": 0.2, "dppo_log_ratio_coef": 0.0}
    assert '`token_clip="dppo"`' in GRPOExtConfig.__doc__

    @dataclasses.dataclass
    class Tighter(GRPOExtConfig):  # a subclass may change a built-in member's default, as any field's
        dppo_delta_low: float = 0.1

    config = Tighter(output_dir="unused", use_cpu=True, bf16=False, token_clip="dppo", num_iterations=2)
    assert member_args(config, TOKEN_CLIPS.get("dppo")).dppo_delta_low == 0.1


def test_a_users_member_with_a_parameter_runs_on_a_config_that_declares_it_with_the_same_default():
    TOKEN_CLIPS.register("warm_clip")(_parameter_clip())
    try:
        with pytest.raises(MemberContractError, match=r"Warm\.Args declares \['warmth'\].*subclass GRPOExtConfig"):
            GRPOExtConfig(output_dir="unused", use_cpu=True, bf16=False, token_clip="warm_clip")

        @dataclasses.dataclass
        class Colder(GRPOExtConfig):
            warmth: float = 0.1

        with pytest.raises(MemberContractError, match=r"gives 'warmth' the default 0\.5, but Colder's is 0\.1"):
            Colder(output_dir="unused", use_cpu=True, bf16=False, token_clip="warm_clip")

        @dataclasses.dataclass
        class Warm(GRPOExtConfig):
            warmth: float = 0.5

        config = Warm(output_dir="unused", use_cpu=True, bf16=False, token_clip="warm_clip", warmth=0.75)
        assert member_args(config, TOKEN_CLIPS.get("warm_clip")).warmth == 0.75
    finally:
        TOKEN_CLIPS.unregister("warm_clip")


def test_a_member_implementing_none_of_its_familys_hooks_is_refused():
    with pytest.raises(MemberContractError, match=r"kl_control='lazy_kl': Lazy implements none of"):

        @KL_CONTROLLERS.register("lazy_kl")
        class Lazy(Extension):
            def __init__(self, args, host, *, beta_control):
                super().__init__(args, host)


# ------------------------------------------------------------------------------------------------- what it holds
class _Config:
    beta = 0.04
    kl_target = 0.1
    use_bias_correction_kl = False
    eval_pass_at_k = [1, 4]


class _Trainer:  # what BetaService sets
    beta = 0.04


class _Controller(Extension):
    @dataclasses.dataclass(frozen=True)
    class Args(Extension.Args):
        kl_target: float

    args: Args

    def __init__(self, args: Args, host: Host, *, beta_control: BetaControl):
        super().__init__(args, host)
        self.beta_control = beta_control

    def after_loss(self, ctx):
        pass


def _beta_service(owner: str, trainer=None):
    return BetaService(
        trainer or _Trainer(), functools.partial(Receiver(lambda: 7, log=lambda *metric: None).beta, owner)
    )


def test_a_member_holds_its_own_settings_and_only_the_services_it_names():
    built = []

    def factory(name):
        def make(owner):
            built.append((name, owner))
            return _beta_service(owner) if name == "beta_control" else object()

        return make

    host = object()
    member = build_member(_Controller, _Config(), host, {name: factory(name) for name in SERVICES})
    assert built == [("beta_control", "_Controller")]  # the one service it named, and nothing else was made
    assert member.host is host and isinstance(member.beta_control, BetaService)
    assert member.args == _Controller.Args(use_bias_correction_kl=False, kl_target=0.1)  # its own copy, nothing more
    with pytest.raises(dataclasses.FrozenInstanceError):
        member.args.kl_target = 1.0  # type: ignore[misc]
    with pytest.raises(AttributeError, match=r"_Controller\.Args has no field 'beta'.*add `beta: <its type>`"):
        member.args.beta  # noqa: B018


def test_a_members_args_are_a_copy_the_run_config_cannot_see_edits_of():
    class Lists(Extension):
        @dataclasses.dataclass(frozen=True)
        class Args(Extension.Args):
            eval_pass_at_k: list[int]

        args: Args

    config = _Config()
    args = member_args(config, Lists)
    args.eval_pass_at_k.append(8)
    assert config.eval_pass_at_k == [1, 4]


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "0.1", torch.tensor([0.1, 0.2])])
def test_a_beta_outside_its_range_is_refused_naming_the_member(value):
    trainer = _Trainer()
    service = _beta_service("_Controller", trainer)
    with pytest.raises(
        MemberContractError, match=r"_Controller\.beta_control\.set_beta at step 7: set beta to .*Fix: set a finite"
    ):
        service.set_beta(value)
    assert trainer.beta == 0.04
    service.set_beta(torch.tensor(0.5))  # a 0-d tensor is a number
    assert trainer.beta == 0.5 and isinstance(trainer.beta, float)


# ------------------------------------------------------------------------------------------------- outputs
LOGGED: list[tuple[str, str, float]] = []  # what RECEIVE logged (mode, key, value)
RECEIVE = Receiver(lambda: 3, log=lambda *metric: LOGGED.append(metric))


def test_a_hook_with_the_wrong_parameters_is_refused_at_registration():
    with pytest.raises(
        MemberContractError,
        match=r"token_clip='short_clip': ShortClip\.modify_logps\(self, logps\) cannot be called as "
        r"modify_logps\(self, logps, ctx\).*interfaces\.TokenClip\.modify_logps",
    ):

        @TOKEN_CLIPS.register("short_clip")
        class ShortClip(Extension):
            def modify_logps(self, logps):  # type: ignore[override]
                return logps

    assert "short_clip" not in TOKEN_CLIPS
    with pytest.raises(MemberContractError, match=r"LateClip\.after_loss is no token_clip hook.*would never run"):

        @TOKEN_CLIPS.register("late_clip")
        class LateClip(Extension):  # a hook outside the token clip's interface: its slot never calls it
            def modify_logps(self, logps, ctx):
                return logps

            def after_loss(self, ctx):
                pass


def test_members_that_would_train_as_silent_no_ops_are_refused_at_registration():
    """Tried as a hostile user would (issue 46): a member of a family base that overrides no hook, one whose only hook
    is misspelt, and a hook that takes ``**kwargs`` where the trainer passes arguments by position all used to pass."""
    from trl_grpo_ext.families import KL_CONTROLLERS
    from trl_grpo_ext.families.interfaces import EntropyControlBase, KLControllerBase, TokenClipBase

    with pytest.raises(MemberContractError, match=r"kl_control='idle_kl': IdleKL implements none of"):

        @KL_CONTROLLERS.register("idle_kl")
        class IdleKL(KLControllerBase):  # the base's on_generation is a no-op: nothing would ever set beta
            pass

    with pytest.raises(MemberContractError, match=r"TypoKL\.after_los is no hook.*did you mean after_loss"):

        @KL_CONTROLLERS.register("typo_kl")
        class TypoKL(KLControllerBase):
            def after_los(self, ctx):
                self.beta_control.set_beta(0.1)

    with pytest.raises(MemberContractError, match=r"TypoClip\.modify_logp is no hook.*did you mean modify_logps"):

        @TOKEN_CLIPS.register("typo_clip")
        class TypoClip(TokenClipBase):
            def select_tokens(self, logps, ctx):
                return None

            def modify_logp(self, logps, ctx):
                return logps

    with pytest.raises(MemberContractError, match=r"KwEntropy\.on_generation\(self, kw\) cannot be called as "):

        @ENTROPY_CONTROLS.register("kw_entropy")
        class KwEntropy(EntropyControlBase):
            def on_generation(self, **kw):
                return None

    assert not {"idle_kl", "typo_kl"} & set(KL_CONTROLLERS.names())
    assert "typo_clip" not in TOKEN_CLIPS and "kw_entropy" not in ENTROPY_CONTROLS

    @TOKEN_CLIPS.register("star_clip")  # *args takes what the trainer passes: accepted
    class StarClip(TokenClipBase):
        def modify_logps(self, *args):
            return args[0]

    TOKEN_CLIPS.unregister("star_clip")


def test_advantages_with_a_graph_or_the_wrong_width_and_unwritable_state_are_refused_by_name():
    logps = torch.zeros(2, 3, requires_grad=True)
    with pytest.raises(MemberContractError, match=r"Shaper\.shape_advantages at step 3: advantages carry a gradient"):
        RECEIVE.shaped_advantages("Shaper", logps.sum(1) * 2, given=torch.zeros(2), rows=2, width=3, mode="train")
    from trl_grpo_ext.families.base import GenerationUpdate

    with pytest.raises(MemberContractError, match=r"token-level advantages of width 5.*have 3 tokens"):
        RECEIVE.generation_update(
            "Wide", GenerationUpdate(advantages=torch.zeros(2, 5)), rows=2, family="advantage_estimator",
            width=lambda: 3, mode="train",
        )  # fmt: skip
    assert RECEIVE.generation_update(
        "Fits",
        GenerationUpdate(advantages=torch.zeros(2, 3)),
        rows=2,
        family="advantage_estimator",
        width=lambda: 3,
        mode="train",
    )
    with pytest.raises(MemberContractError, match=r"Keeper\.state_dict at step 3: .*JSON state file cannot hold"):
        RECEIVE.state("Keeper", {"moments": torch.zeros(2)})
    with pytest.raises(MemberContractError, match=r"JSON state file cannot hold"):
        RECEIVE.state("Keeper", {"beta": float("nan")})
    assert RECEIVE.state("Keeper", {"beta": 0.1, "history": [1, 2]}) == {"beta": 0.1, "history": [1, 2]}


def test_a_member_whose_state_no_checkpoint_can_write_fails_when_the_trainer_is_built(make_trainer):
    from trl_grpo_ext.families.interfaces import TokenClipBase

    @TOKEN_CLIPS.register("tensor_state")
    class TensorState(TokenClipBase):
        def modify_logps(self, logps, ctx):
            return logps

        def state_dict(self):
            return {"seen": torch.zeros(1)}

    try:
        with pytest.raises(MemberContractError, match=r"TensorState\.state_dict at step 0"):
            make_trainer(token_clip="tensor_state")
    finally:
        TOKEN_CLIPS.unregister("tensor_state")


def test_an_observer_is_checked_at_registration_too():
    from trl_grpo_ext.families import OBSERVERS

    with pytest.raises(MemberContractError, match=r"observer='fn_watch': watch is not a class derived from"):

        @OBSERVERS.register("fn_watch")
        def watch(batch):
            return None

    with pytest.raises(MemberContractError, match=r"implements none of \['on_generation', 'after_loss'\].*Observer"):

        @OBSERVERS.register("idle_watch")
        class Idle(Extension):
            pass

    with pytest.raises(MemberContractError, match=r"observer='token_clip': 'token_clip' is a family switch"):

        @OBSERVERS.register("token_clip")
        class Shadow(Extension):
            def after_loss(self, ctx):
                pass

    assert not {"fn_watch", "idle_watch", "token_clip"} & set(OBSERVERS.names())


class Member:
    pass


def test_generation_updates_are_checked():
    member = Member()
    with pytest.raises(MemberContractError, match=r"Member\.on_generation at step 3: returned dict.*AdvantageUpdate"):
        RECEIVE.generation_update(
            member, {"advantages": torch.zeros(8)}, rows=8, family="advantage_estimator", mode="train"
        )
    with pytest.raises(MemberContractError, match=r"shape \(16,\); the batch has 8 rows"):
        RECEIVE.generation_update(
            member, AdvantageUpdate(advantages=torch.zeros(16)), rows=8, family="advantage_estimator", mode="train"
        )
    with pytest.raises(MemberContractError, match=r"shape \(4,\); the batch has 8 rows"):
        RECEIVE.generation_update(
            member, AdvantageUpdate(advantages=torch.zeros(4)), rows=8, family="advantage_weighting", mode="train"
        )
    nan = torch.zeros(8)
    nan[5] = float("nan")
    with pytest.raises(MemberContractError, match=r"1 non-finite value\(s\) \(rows \[5\]\).*nan_to_num"):
        RECEIVE.generation_update(
            member, AdvantageUpdate(advantages=nan), rows=8, family="advantage_estimator", mode="train"
        )
    with pytest.raises(MemberContractError, match=r"are a torch.int64 tensor"):
        RECEIVE.generation_update(
            member,
            AdvantageUpdate(advantages=torch.zeros(8, dtype=torch.long)),
            rows=8,
            family="advantage_estimator",
            mode="train",
        )
    with pytest.raises(MemberContractError, match=r"keep is a torch.float32 tensor of shape \(8,\), not a \(8,\) bool"):
        RECEIVE.generation_update(
            member, FilterUpdate(keep=torch.ones(8)), rows=8, family="sample_filter", mode="train"
        )
    ok = FilterUpdate(keep=torch.ones(8, dtype=torch.bool))
    assert RECEIVE.generation_update(member, ok, rows=8, family="sample_filter", mode="train") is ok
    assert RECEIVE.generation_update(member, None, rows=8, family="kl_control", mode="train") is None
    # a plain GenerationUpdate passes when it sets only its family's fields
    plain = GenerationUpdate(advantages=torch.zeros(8, 3))
    assert RECEIVE.generation_update(member, plain, rows=8, family="advantage_weighting", mode="train") is plain


def test_an_update_outside_the_family_interface_is_refused():
    """A filter's advantages, an estimator's keep flags, anything from a KL controller or an observer: each family
    returns its own output type (trl_grpo_ext.families.interfaces)."""
    member = Member()
    cases = [
        ("sample_filter", GenerationUpdate(advantages=torch.zeros(8)), r"set \['advantages'\].*FilterUpdate"),
        (
            "advantage_estimator",
            GenerationUpdate(keep=torch.ones(8, dtype=torch.bool)),
            r"set \['keep'\].*AdvantageUpdate",
        ),
        ("kl_control", AdvantageUpdate(advantages=torch.zeros(8)), r"its family returns nothing.*return None"),
        ("observer", FilterUpdate(keep=torch.ones(8, dtype=torch.bool)), r"an? observer member does not return"),
        ("entropy_control", AdvantageUpdate(advantages=torch.zeros(8)), r"\['advantages'\].*SpliceUpdate"),
    ]
    for family, update, message in cases:
        with pytest.raises(MemberContractError, match=rf"Member\.on_generation at step 3: .*{message}"):
            RECEIVE.generation_update(member, update, rows=8, family=family, mode="train")


def test_the_family_outputs_carry_only_their_fields():
    with pytest.raises(TypeError):
        FilterUpdate(keep=torch.ones(8, dtype=torch.bool), advantages=torch.zeros(8))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        AdvantageUpdate(advantages=torch.zeros(8), keep=None)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        FilterUpdate()  # type: ignore[call-arg]  (keep is required)


def test_loss_side_outputs_are_checked():
    member = Member()
    logps = torch.zeros(2, 3, requires_grad=True)
    given = torch.zeros(2)
    assert RECEIVE.shaped_advantages(member, given, given=given, rows=2, width=3, mode="train") is given
    with pytest.raises(MemberContractError, match=r"shape_advantages at step 3: token-level advantages of width 5"):
        RECEIVE.shaped_advantages(member, torch.zeros(2, 5), given=given, rows=2, width=3, mode="train")
    with pytest.raises(MemberContractError, match=r"select_tokens at step 3: returned a torch.float32 tensor"):
        RECEIVE.selection(member, torch.zeros(2, 3), like=logps, mode="train")
    with pytest.raises(MemberContractError, match=r"modify_logps at step 3: returned log-probs detached"):
        RECEIVE.logps(member, logps.detach() * 1.0, like=logps, mode="train")
    with pytest.raises(MemberContractError, match=r"modify_logps at step 3: returned a torch.float32 tensor of shape"):
        RECEIVE.logps(member, logps[:1], like=logps, mode="train")
    with pytest.raises(MemberContractError, match=r"extra_loss at step 3: returned a torch.float32 tensor of shape"):
        RECEIVE.loss_term(member, torch.zeros(2), mode="train")
    with pytest.raises(MemberContractError, match=r"extra_loss at step 3: returned nan"):
        RECEIVE.loss_term(member, torch.tensor(float("nan")), mode="train")


class Measures:
    """A member class declaring its metrics, as the receiver reads them."""

    metrics = ("guard/frac", "pass@k/sampled_{k}")
    optional_metrics = ("guard/loss",)


def test_the_metrics_a_hook_returns_with_its_value_are_checked_and_logged_under_its_mode():
    member, logps = Measures(), torch.zeros(2, 3, requires_grad=True)
    LOGGED.clear()
    modified = logps * 2.0
    got = RECEIVE.logps(member, (modified, {"guard/frac": torch.tensor(0.25)}), like=logps, mode="eval")
    assert got is modified and LOGGED == [("eval", "guard/frac", 0.25)]
    # a "{k}" in a declared key stands for one path part; a hook with no value returns (None, metrics)
    metrics = {"pass@k/sampled_4": 0.5, "guard/loss": float("nan")}  # NaN: undefined this batch, still a number
    assert RECEIVE.nothing(member, "after_loss", (None, metrics), mode="train") is None
    assert LOGGED[1] == ("train", "pass@k/sampled_4", 0.5) and LOGGED[2][:2] == ("train", "guard/loss")
    assert math.isnan(LOGGED[2][2])
    term = torch.tensor(2.0)
    assert RECEIVE.loss_term(member, (term, {}), mode="train") is term and len(LOGGED) == 3
    LOGGED.clear()
    cases = [
        (
            {"guard/frac": 0.1, "guard/fraction": 0.2},
            r"returned the metric 'guard/fraction', which it does not declare",
        ),
        ({"pass@k/sampled_4/extra": 1.0}, r"'pass@k/sampled_4/extra', which it does not declare"),
        ({"guard/frac": "0.1"}, r"returned the metric 'guard/frac' as str"),
        ({"guard/frac": torch.zeros(2)}, r"as a torch.float32 tensor of shape \(2,\)"),
    ]
    for metrics, message in cases:
        with pytest.raises(MemberContractError, match=rf"Measures\.modify_logps at step 3: .*{message}.*Fix:"):
            RECEIVE.logps(member, (modified, metrics), like=logps, mode="train")
    assert LOGGED == []  # a refused output logs none of its metrics
    with pytest.raises(MemberContractError, match=r"Measures\.after_loss at step 3: returned a torch.*return None"):
        RECEIVE.nothing(member, "after_loss", torch.zeros(()), mode="train")


def test_a_filter_strategy_that_raises_or_returns_nothing_is_named():
    def raises(grouped, generator):
        raise KeyError("oops")

    def returns_none(grouped, generator):
        return None

    with pytest.raises(RuntimeError, match=r"strategy 'raises' raised KeyError.*Fix the strategy"):
        pf_keep_mask(torch.zeros(4), 2, strategy=raises)
    with pytest.raises(ValueError, match=r"strategy 'returns_none' must return a bool mask.*got NoneType"):
        pf_keep_mask(torch.zeros(4), 2, strategy=returns_none)


# ------------------------------------------------------------------------------------------------- in a trainer
@pytest.fixture
def registered():
    """Members registered for one test (unregistered after)."""
    names = []

    def register(registry, name, cls):
        registry.register(name)(cls)
        names.append((registry, name))
        return name

    yield register
    for registry, name in names:
        registry.unregister(name)


class NaNAdvantages(Extension):
    def on_generation(self, batch):
        advantages = torch.zeros_like(batch.rewards)
        advantages[0] = float("nan")
        return GenerationUpdate(advantages=advantages)


class DictUpdate(Extension):
    def on_generation(self, batch):
        return {"advantages": torch.zeros_like(batch.rewards)}


def test_nan_advantages_stop_before_the_weights_change(make_trainer, registered):
    trainer = make_trainer(advantage_weighting=registered(ADVANTAGE_WEIGHTINGS, "test_nan_adv", NaNAdvantages))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(MemberContractError, match=r"NaNAdvantages\.on_generation at step 0: advantages of every"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_an_update_of_the_wrong_type_names_the_member(make_trainer, registered):
    trainer = make_trainer(advantage_weighting=registered(ADVANTAGE_WEIGHTINGS, "test_dict_update", DictUpdate))
    with pytest.raises(MemberContractError, match=r"DictUpdate\.on_generation at step 0: returned dict"):
        trainer.train()


class UndeclaredMetric(Extension):
    metrics = ("undeclared/declared",)

    def modify_logps(self, logps, ctx):
        return logps, {"undeclared/declared": 1.0, "undeclared/other": 2.0}


class MeasuresInBothModes(Extension):
    metrics = ("both/rows",)

    def modify_logps(self, logps, ctx):
        return logps, {"both/rows": float(logps.size(0))}


def test_a_metric_the_member_does_not_declare_stops_the_run_naming_it(make_trainer, registered):
    trainer = make_trainer(token_clip=registered(TOKEN_CLIPS, "test_undeclared", UndeclaredMetric))
    with pytest.raises(MemberContractError, match=r"UndeclaredMetric\.modify_logps at step 0: .*'undeclared/other'"):
        trainer.train()


def test_a_hooks_metrics_go_to_the_mode_it_ran_in(make_trainer, registered, train_dataset):
    """Logged by the trainer under ``ctx.mode``: a training loss's under train, an evaluation loss's under eval (a
    member logging "train" by hand from the loss used to put its evaluation values among the training ones)."""
    name = registered(TOKEN_CLIPS, "test_both_modes", MeasuresInBothModes)
    trainer = make_trainer(
        token_clip=name, eval_strategy="steps", eval_steps=1, max_steps=1, per_device_eval_batch_size=8,
        trainer_kwargs={"eval_dataset": train_dataset.select(range(4))},
    )  # fmt: skip
    trainer.train()
    logged = [row for row in trainer.state.log_history if any("both/rows" in key for key in row)]
    assert any("both/rows" in row for row in logged) and any("eval_both/rows" in row for row in logged), logged


class WritesTheAdvantages(Extension):
    def select_tokens(self, logps, ctx):
        ctx.inputs["advantages"] = ctx.advantages * 0.0  # reaching TRL's loss behind the weighting's back
        return None


class OverwritesTheSelection(Extension):
    def modify_logps(self, logps, ctx):
        ctx.selected = torch.zeros_like(ctx.mask, dtype=torch.bool)
        return logps


class WritesTRLsBatch(Extension):
    def on_generation(self, batch):
        batch.output["advantages"] = batch.output["advantages"] * 0.0  # past the checks of a returned update
        return None


class SetsTheKeptRows(Extension):
    def on_generation(self, batch):
        batch.keep = torch.zeros_like(batch.rewards, dtype=torch.bool)
        return None


@pytest.mark.parametrize(
    ("switch", "registry", "member", "error"),
    [
        ("token_clip", TOKEN_CLIPS, WritesTheAdvantages, "'mappingproxy' object does not support item assignment"),
        ("token_clip", TOKEN_CLIPS, OverwritesTheSelection, "selected"),
        ("advantage_weighting", ADVANTAGE_WEIGHTINGS, WritesTRLsBatch, "'mappingproxy' object does not support item"),
        ("advantage_weighting", ADVANTAGE_WEIGHTINGS, SetsTheKeptRows, "keep"),
    ],
)
def test_a_member_writing_what_its_hook_reads_fails_before_the_weights_change(
    make_trainer, registered, switch, registry, member, error
):
    """The generation batch and the loss context are frozen, TRL's output and the micro-batch's inputs read-only
    views: a member changes advantages, kept rows or the selection only by returning them from its hook
    (on_generation, shape_advantages, select_tokens), where they are checked."""
    trainer = make_trainer(**{switch: registered(registry, f"test_{member.__name__.lower()}", member)})
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises((TypeError, dataclasses.FrozenInstanceError), match=error):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


# ------------------------------------------------------------------------------------------------- args after build
@pytest.mark.parametrize(
    ("built", "late"),
    [
        ({}, {"token_clip": "clip_cov", "clip_cov_lb": -100.0}),  # the notebook habit: no member was built
        ({"refill": "dynamic_sampling"}, {"refill": "none"}),  # the member would still refill
        ({"kl_control": "adaptive", "beta": 0.04}, {"kl_target": 0.5}),  # a parameter of a built member
    ],
)
def test_a_switch_or_field_set_on_args_after_building_is_refused_at_train(make_trainer, built, late):
    trainer = make_trainer(**built)
    for name, value in late.items():
        setattr(trainer.args, name, value)
    first = next(iter(late))
    with pytest.raises(ValueError, match=rf"changed on trainer\.args after the trainer was built \({first}: "):
        trainer.train()
    for name in late:  # put back: trains
        setattr(trainer.args, name, trainer.ext_built_with[name])
    trainer.args.max_steps = 1
    trainer.train()


def test_ext_resume_state_set_before_train_takes_effect(make_trainer):
    trainer = make_trainer(max_steps=1)
    trainer.args.ext_resume_state = "ignore"  # read when training starts, not by a member
    trainer.train()
    assert trainer.state.global_step == 1 and "ext_resume_state" not in trainer.ext_built_with


# ------------------------------------------------------------------------------------------------- combinations
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(advantage_estimator="pass_at_k", advantage_weighting="w_reinforce", w_reinforce_baseline="group"),
            r"advantage_weighting='w_reinforce': .*PassAtKAdvantage .* writes no negative advantage",
        ),
        (dict(advantage_estimator="pass_at_k", advantage_std="population"), r"advantage_std='population': no selected"),
        (
            dict(advantage_weighting="w_reinforce", advantage_std="population"),
            r"advantage_std='population': w_reinforce_baseline='none' replaces",
        ),
    ],
)
def test_do_nothing_combinations_are_refused(fields, message):
    from trl_grpo_ext import GRPOExtConfig

    with pytest.raises(ValueError, match=message):
        GRPOExtConfig("out", use_cpu=True, bf16=False, **fields)


def test_annealed_pass_at_k_with_w_reinforce_group_is_accepted():
    """k annealed to 1 gives negative advantages (the leave-one-out baseline): the weighting then acts."""
    from trl_grpo_ext import GRPOExtConfig
    from trl_grpo_ext.families.advantage import PassAtKAdvantage

    args = GRPOExtConfig(
        "out",
        use_cpu=True,
        bf16=False,
        advantage_estimator="pass_at_k",
        pkpo_anneal_fraction=0.5,
        advantage_weighting="w_reinforce",
        w_reinforce_baseline="group",
    )
    assert not PassAtKAdvantage.never_negative_advantages(args)
    assert PassAtKAdvantage.never_negative_advantages(GRPOExtConfig("o", use_cpu=True, bf16=False, pkpo_k=2))


def test_a_subclass_of_a_builtin_keeps_its_rules(registered):
    """Rules belong to the class, not to the switch's value: a variant of dynamic sampling registered under another
    name is refused with PRM advantages and with W-REINFORCE's baseline-free advantages, as the built-in is."""
    from trl_grpo_ext import GRPOExtConfig
    from trl_grpo_ext.families import REFILLS
    from trl_grpo_ext.families.dynamic_sampling import DynamicSampling

    class MyRefill(DynamicSampling):
        pass

    name = registered(REFILLS, "test_my_refill", MyRefill)
    base = dict(use_cpu=True, bf16=False, refill=name)
    with pytest.raises(ValueError, match=r"PRMAdvantage cannot \(PRM advantages need step rewards\)"):
        GRPOExtConfig("out", advantage_estimator="prm", **base)
    with pytest.raises(ValueError, match=r"no group lacks signal"):
        GRPOExtConfig("out", advantage_weighting="w_reinforce", **base)


def test_every_refill_is_refused_with_normalize_then_sum(registered):
    """The rule is the refill family's (its base's), not dynamic sampling's: a refill of one's own splices rows with
    advantages of their own too, which normalize_then_sum would have to change with every other row's."""
    from trl_grpo_ext import GRPOExtConfig
    from trl_grpo_ext.families import REFILLS
    from trl_grpo_ext.families.interfaces import RefillBase

    class KeepAll(RefillBase):
        def on_generation(self, batch):
            return None

    name = registered(REFILLS, "test_keep_all", KeepAll)
    with pytest.raises(ValueError, match=r"multi_objective_aggregation='normalize_then_sum': refill='test_keep_all'"):
        GRPOExtConfig("out", use_cpu=True, bf16=False, refill=name, multi_objective_aggregation="normalize_then_sum")
    assert GRPOExtConfig("out", use_cpu=True, bf16=False, refill=name).refill == name
