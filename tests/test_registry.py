"""Registries drive coverage (issue 12): the config's choices are the registries' names, every registered member of
every family trains in a tiny run and logs the metrics it declares, and a variant registered from outside the
package (here, in this test module) is accepted by the config, built by the trainer and swept like a built-in."""

import dataclasses
import math
import typing

import pytest
import torch
from conftest import last_logs

from trl_grpo_ext import GRPOExtConfig
from trl_grpo_ext.core import SAMPLE_FILTER_STRATEGIES, Registry
from trl_grpo_ext.families import FAMILIES, SAMPLE_FILTERS, TOKEN_CLIPS, Extension, Off
from trl_grpo_ext.families.sample_filter import PolicyFilter, register_strategy
from trl_grpo_ext.names import MemberContractError


def test_register_get_and_duplicate_guard():
    reg = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a and "a" in reg and reg.names() == ["a"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    reg.register("a", override=True)(lambda: 3)
    assert reg.get("a")() == 3
    with pytest.raises(ValueError, match=r"Unknown widget 'b'\. Valid names: a"):
        reg.get("b")
    with pytest.raises(ValueError, match="non-empty"):
        reg.register("")


def test_unknown_name_hint_names_the_registry_users_import():
    """The hint of an unknown name is the registry's importable name (TOKEN_CLIPS, not TOKEN_CLIP); unregister
    removes a name (a notebook re-running a cell)."""
    with pytest.raises(ValueError, match=r"@TOKEN_CLIPS\.register\('nope'\)"):
        TOKEN_CLIPS.get("nope")
    with pytest.raises(ValueError, match=r"@SAMPLE_FILTERS\.register\('nope'\)"):
        SAMPLE_FILTERS.get("nope")
    assert all(FAMILIES[switch] is registry for switch, registry in FAMILIES.items())
    assert SAMPLE_FILTERS.symbol == "SAMPLE_FILTERS"
    reg = Registry("widget")
    reg.register("a")(1)
    assert reg.unregister("a") == 1 and "a" not in reg and reg.symbol == "WIDGET"


def test_every_core_strategy_is_a_sample_filter_member():
    """The sample_filter switch has one registry, the family's: each built-in strategy of the core is a PolicyFilter
    member there applying it, and so is a strategy registered from user code with register_strategy (as docs/index.md
    shows); the core's strategies are a read-only mapping, not a second registry."""
    for name, fn in SAMPLE_FILTER_STRATEGIES.items():
        member = SAMPLE_FILTERS.get(name)
        assert issubclass(member, PolicyFilter) and member.select is fn, name
        assert member.__module__ == "trl_grpo_ext.families.sample_filter"
    outside = SAMPLE_FILTERS.get("test_above_mean")
    assert issubclass(outside, PolicyFilter) and outside.select is above_mean and outside.__module__ == __name__
    assert not hasattr(SAMPLE_FILTER_STRATEGIES, "register") and "test_above_mean" not in SAMPLE_FILTER_STRATEGIES


# ---------------------------------------------------------------------------------------------- a variant from outside
@TOKEN_CLIPS.register("test_sign_flip_guard")
class SignFlipGuard(Extension):
    """A token clip defined outside the package: detaches the tokens whose advantage and ratio disagree in sign."""

    metrics = ("test_guard/detached_frac",)

    def modify_logps(self, logps, ctx):
        ratio = logps.detach() - ctx.old_logps
        chosen = ctx.policy_mask & (torch.sign(ratio) * torch.sign(ctx.advantages) < 0)
        return torch.where(chosen, logps.detach(), logps), {"test_guard/detached_frac": float(chosen.float().mean())}


@register_strategy("test_above_mean")  # its PolicyFilter member in the sample_filter registry
def above_mean(grouped, generator):  # (P, G) rewards -> (P, G) keep
    return grouped >= grouped.nanmean(dim=1, keepdim=True)


def test_a_strategy_registration_refuses_a_taken_name():
    """register_strategy refuses a name the sample_filter family holds (a built-in strategy, the off member, another
    member), registering nothing."""

    def keep_all(grouped, generator):
        return torch.ones_like(grouped, dtype=torch.bool)

    before = {name: SAMPLE_FILTERS.get(name) for name in SAMPLE_FILTERS.names()}
    for taken in ("best_of_n", "none", "nonzero_std"):
        with pytest.raises(ValueError, match=rf"The sample_filter '{taken}' is already registered"):
            register_strategy(taken)(keep_all)
    assert {name: SAMPLE_FILTERS.get(name) for name in SAMPLE_FILTERS.names()} == before
    # the strategy's member is built by register_strategy; PolicyFilter itself has no strategy to apply
    with pytest.raises(MemberContractError, match=r"PolicyFilter applies a strategy and has none.*@register_strategy"):
        SAMPLE_FILTERS.register("test_no_strategy")(PolicyFilter)
    with pytest.raises(TypeError, match=r"register_strategy\('test_not_a_function'\) decorates a function"):
        register_strategy("test_not_a_function")("best_of_n")
    assert "test_no_strategy" not in SAMPLE_FILTERS and "test_not_a_function" not in SAMPLE_FILTERS


def _builtin(switch: str) -> set[str]:
    registry = FAMILIES[switch]
    return {name for name in registry.names() if registry.get(name).__module__.startswith("trl_grpo_ext.")}


@pytest.mark.parametrize("switch", list(FAMILIES))
def test_config_choices_are_the_registry_names(switch):
    """The choices ``--help`` shows and the command line accepts are the registry's names, read when the parser is
    built: every built-in member, and a variant registered before parsing (no list of values to keep in step)."""
    from trl import TrlParser

    hints = typing.get_type_hints(GRPOExtConfig)
    assert hints[switch] is str  # an open registry: a user's variant is as valid a value as a built-in one
    assert _builtin(switch) <= set(FAMILIES[switch].names())
    parser = TrlParser((GRPOExtConfig,))
    (action,) = [a for a in parser._actions if a.dest == switch]
    assert list(action.choices) == FAMILIES[switch].names()
    assert "{" + ",".join(FAMILIES[switch].names()) + "}" in parser.format_help()
    default = next(f.default for f in dataclasses.fields(GRPOExtConfig) if f.name == switch)
    assert default in FAMILIES[switch]
    assert FAMILIES[switch].get(default).is_off or switch == "advantage_estimator"


def test_a_registered_variant_is_selected_from_the_command_line_and_a_yaml_config(tmp_path):
    """A variant the user's script registers before parsing is a valid ``--token_clip`` value (argparse's choices are
    the registry's, read then) and a valid YAML value; a misspelt one is refused by argparse listing the names."""
    from trl import TrlParser

    cli = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]
    (args,) = TrlParser((GRPOExtConfig,)).parse_args_and_config([*cli, "--token_clip", "test_sign_flip_guard"])
    assert args.token_clip == "test_sign_flip_guard"
    config = tmp_path / "run.yaml"
    config.write_text("token_clip: test_sign_flip_guard\nsample_filter: test_above_mean\n")
    (args,) = TrlParser((GRPOExtConfig,)).parse_args_and_config([*cli, "--config", str(config)])
    assert (args.token_clip, args.sample_filter) == ("test_sign_flip_guard", "test_above_mean")
    with pytest.raises(SystemExit):
        TrlParser((GRPOExtConfig,)).parse_args_and_config([*cli, "--token_clip", "clip_cvo"])
    config.write_text("token_clip: clip_cvo\n")
    with pytest.raises(ValueError, match=r"token_clip='clip_cvo': unknown value.*'clip_cov'"):
        TrlParser((GRPOExtConfig,)).parse_args_and_config([*cli, "--config", str(config)])


def test_outside_variants_are_accepted_and_built(make_trainer):
    trainer = make_trainer(token_clip="test_sign_flip_guard", sample_filter="test_above_mean", max_steps=2)
    assert isinstance(trainer.extensions["token_clip"], SignFlipGuard)
    assert trainer.extensions["sample_filter"].strategy == "test_above_mean"
    with pytest.raises(ValueError, match=r"token_clip='not_registered'.*test_sign_flip_guard"):
        make_trainer(token_clip="not_registered")


def test_every_family_has_one_off_member():
    for switch, registry in FAMILIES.items():
        off = [name for name in registry.names() if registry.get(name).is_off]
        assert off == ([] if switch == "advantage_estimator" else [off[0]]), (switch, off)
        assert all(registry.get(name) is Off for name in off)


# ---------------------------------------------------------------------------------------------- the sweep
def _digit_steps(prompts, completions, steps, **kwargs):
    return [[sum(ch.isdigit() for ch in s) / len(s) for s in row] for row in steps]


SWEEP = [
    (switch, name)
    for switch, registry in FAMILIES.items()
    for name in registry.names()
    if not registry.get(name).is_off and registry.get(name).metrics
]


@pytest.fixture(scope="module")
def trl_keys(tiny_model_path, tokenizer, train_dataset, tmp_path_factory):
    """Every key plain ``trl.GRPOTrainer`` logs in the sweep's setting (with and without a KL term and off-policy
    reuse, which add TRL keys of their own)."""
    from conftest import TINY_ARGS
    from trl import GRPOConfig, GRPOTrainer

    from grpo_lab import testkit

    keys = set()
    for extra in ({}, {"beta": 0.04, "num_iterations": 2}):
        args = GRPOConfig(**{**TINY_ARGS, "output_dir": str(tmp_path_factory.mktemp("trl")), "max_steps": 2, **extra})
        trainer = GRPOTrainer(
            model=tiny_model_path,
            reward_funcs=[testkit.exact_match_reward, testkit.digit_fraction_reward],
            args=args,
            train_dataset=train_dataset,
            processing_class=tokenizer,
        )
        trainer.train()
        keys |= {key for h in trainer.state.log_history for key in h}
    return keys


@pytest.mark.fast  # one tiny run of every family member: in the edit-loop tier
@pytest.mark.filterwarnings("ignore:.*not a percentage")
@pytest.mark.parametrize(("switch", "name"), SWEEP, ids=[f"{s}={n}" for s, n in SWEEP])
def test_every_registered_member_trains_and_logs_its_metrics(make_trainer, trl_keys, switch, name):
    """Each member trains, logs every metric it declares, and logs no key that nobody declares (TRL's own aside)."""
    from trl_grpo_ext.families import declared_metrics

    cls = FAMILIES[switch].get(name)
    kwargs = {"trainer_kwargs": {"step_reward_funcs": [_digit_steps]}} if name == "prm" else {}
    trainer = make_trainer(max_steps=2, max_completion_length=8, **{switch: name, **cls.example_config}, **kwargs)
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    for key in cls.metrics:
        assert any(key in h for h in logs), f"{switch}={name} did not log {key}"
    declared = {key for keys in declared_metrics(trainer.extensions.values()).values() for key in keys}
    logged = {key for h in trainer.state.log_history for key in h}
    assert not logged - trl_keys - declared, f"{switch}={name} logs undeclared {sorted(logged - trl_keys - declared)}"


#: Built-in members that act without logging metrics of their own (TRL logs the rewards they normalise).
SILENT = {("advantage_estimator", "grpo")}


def test_every_builtin_that_acts_declares_metrics_and_is_swept():
    """The sweep above trains the members that declare metrics: a member that declared none would escape it. So every
    built-in member is an off member, a known silent one, or declares metrics (and is swept); the variants this module
    registers from outside the package are swept like built-ins."""
    swept = set(SWEEP)
    assert ("token_clip", "test_sign_flip_guard") in swept and ("sample_filter", "test_above_mean") in swept
    for switch in FAMILIES:
        for name in _builtin(switch):
            cls = FAMILIES[switch].get(name)
            if cls.is_off or (switch, name) in SILENT:
                continue
            assert cls.metrics, f"{switch}={name} declares no metrics: the registry sweep would skip it"
            assert (switch, name) in swept


def test_every_builtin_member_points_to_its_docs_page():
    """``Extension.docs`` names the method's page: it exists, the docs index links it from the families table row of
    the switch, that row and the page name the switch value (a renamed page or member, or one missing from the table,
    breaks here, not in a user's browser)."""
    from pathlib import Path

    from trl_grpo_ext.families.observers import OBSERVERS

    docs = Path(__file__).resolve().parent.parent / "docs"
    index = (docs / "index.md").read_text()
    members = [(switch, name, FAMILIES[switch].get(name)) for switch in FAMILIES for name in _builtin(switch)]
    members += [("observer", name, OBSERVERS.get(name)) for name in OBSERVERS.names()]
    for switch, name, cls in members:
        if cls.is_off:
            continue
        assert cls.docs, f"{switch}={name} declares no docs page"
        page = docs / cls.docs
        assert page.exists(), f"{switch}={name}: docs/{cls.docs} is missing"
        assert f"({cls.docs})" in index, f"docs/index.md does not link {cls.docs} ({switch}={name})"
        if switch != "observer":
            assert name in page.read_text(), f"docs/{cls.docs} never names {switch}={name!r}"
            # the families table: the row that links the page lists the switch value
            rows = [line for line in index.splitlines() if line.startswith(f"| `{switch}") and f"({cls.docs})" in line]
            assert any(name in row for row in rows), f"docs/index.md's families table: no {switch} row names {name!r}"


def test_the_families_table_names_only_registered_members_docs_page():
    """The other way round: every switch value docs/index.md's families table names (a ``switch: name`` cell, or a
    quoted value in the row of a bare switch) is a registered member, and every page the table links exists. A value
    listed for a member that was renamed, moved or never written breaks here (the switch has no ``Literal`` that would
    list it too)."""
    import re
    import typing as t
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    index = (docs / "index.md").read_text()
    table = index[index.index("## Families") :]
    table = table[: table.index("\n\n", table.index("|---"))]
    hints = t.get_type_hints(GRPOExtConfig)
    checked = 0
    for row in (line for line in table.splitlines() if line.startswith("| `")):
        first, values, pages = (cell.strip() for cell in row.strip("|").split(" | "))
        for page in re.findall(r"\]\(([\w.]+\.md)", pages):
            assert (docs / page).exists(), f"docs/index.md's families table links docs/{page}, which is missing"
        fields = re.findall(r"`(\w+)(?::\s*(\w+))?`", first)
        for switch, name in fields:
            if switch in FAMILIES and name:
                assert name in FAMILIES[switch], f"the families table names {switch}: {name!r}, which is not registered"
                checked += 1
        bare = [switch for switch, name in fields if switch in FAMILIES and not name]
        # quoted values of another field named in the cell (advantage_std's "sample") are that field's
        others = {v for field, _ in fields if field not in FAMILIES for v in t.get_args(hints.get(field, int))}
        for switch in bare:
            for name in set(re.findall(r'"(\w+)"', values)) - others:
                assert name in FAMILIES[switch], f"the families table lists {switch}={name!r}, which is not registered"
                checked += 1
    assert checked >= 15, checked


def test_the_docs_worked_example_trains(make_trainer, tmp_path, monkeypatch):
    """docs/index.md's "Adding a variant" examples, run as the page prints them (the two Python blocks of that
    section: a token clip, a sample-filter strategy), then trained with: each is accepted by the config and acts; the
    token clip inside TRL's loss, logging its declared metric; the strategy keeping the rows it picks."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "index.md").read_text()
    section = page[page.index("## Adding a variant") : page.index("## Pure functions")]
    clip_code, strategy_code = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    from transformers import TrainingArguments

    original = TrainingArguments.__post_init__

    def on_cpu(self):  # the page's config is a GPU user's (bf16 by default); this machine has no GPU
        self.use_cpu, self.bf16 = True, False
        original(self)

    namespace: dict = {}
    try:
        monkeypatch.setattr(TrainingArguments, "__post_init__", on_cpu)
        exec(compile(clip_code, "docs/index.md", "exec"), namespace)  # registers "sign_flip_guard", builds `args`
        monkeypatch.setattr(TrainingArguments, "__post_init__", original)
        assert namespace["args"].token_clip == "sign_flip_guard"
        exec(compile(strategy_code, "docs/index.md", "exec"), {})  # registers "above_mean" in both registries
        trainer = make_trainer(token_clip="sign_flip_guard", sample_filter="above_mean", max_steps=2, num_iterations=2)
        trainer.train()
        logs = last_logs(trainer)
        assert logs and all("guard/detached_frac" in h for h in logs)
        kept = [h["filter/kept_frac"] for h in logs if "filter/kept_frac" in h]  # logged where a batch is generated
        assert kept and all(0.0 < k < 1.0 for k in kept), kept  # above the group mean: some rows, not all
    finally:
        FAMILIES["token_clip"].unregister("sign_flip_guard")
        if "above_mean" in SAMPLE_FILTERS:
            SAMPLE_FILTERS.unregister("above_mean")
