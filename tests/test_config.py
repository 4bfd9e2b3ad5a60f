import dataclasses
import re
import typing

import pytest
import yaml
from trl import GRPOConfig, TrlParser

from trl_grpo_ext import GRPOExtConfig

BASE = dict(
    output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8, num_generations=4
)


def make(**kw):
    return GRPOExtConfig(**{**BASE, **kw})


def test_defaults_are_trl_behaviour():
    """At its default every family switch selects the member that leaves TRL alone: its registry's off member, or the
    outcome estimator, which with advantage_std='sample' returns no update (tests/test_parity.py shows the run equals
    GRPOTrainer's); without_extensions() changes nothing, and no observer is switched on."""
    from trl_grpo_ext.families import FAMILIES, GenerationBatch
    from trl_grpo_ext.families.base import build_member
    from trl_grpo_ext.families.observers import OBSERVERS

    cfg = make()
    assert cfg.without_extensions() == cfg
    for switch, registry in FAMILIES.items():
        member = registry.get(getattr(cfg, switch))
        if not member.is_off:  # the outcome estimator: built, but silent at advantage_std='sample'
            assert switch == "advantage_estimator" and cfg.advantage_std == "sample"
            batch = GenerationBatch({}, None, None, group_size=4, process_slice=slice(0), mode="train")
            assert build_member(member, cfg, host=object(), services={}).on_generation(batch) is None
    assert not any(OBSERVERS.get(name).enabled(cfg) for name in OBSERVERS.names())


# Each bad config: the field that must be named in the message and a word of the fix.
BAD = [
    (dict(advantage_estimator="gae"), "advantage_estimator", "use one of"),
    (dict(advantage_std="bessel"), "advantage_std", "use one of"),
    (
        dict(advantage_std="population", multi_objective_aggregation="normalize_then_sum"),
        "advantage_std",
        "sum_then_normalize",
    ),
    (dict(token_clip="clip_higher"), "token_clip", "use one of"),
    (dict(token_clip_scope="world"), "token_clip_scope", "use one of"),
    (dict(clip_cov_ratio=0.0), "clip_cov_ratio", "fraction"),
    (dict(clip_cov_ratio=2.0), "clip_cov_ratio", "fraction"),
    (dict(kl_cov_ratio=-1e-3), "kl_cov_ratio", "fraction"),
    (dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_lb", "clip_cov_ub"),
    (dict(kl_cov_coef=0.0), "kl_cov_coef", "kl_cov_coef=1.0"),
    (dict(kl_cov_coef=float("nan")), "kl_cov_coef", "finite"),
    (dict(token_clip="kl_cov"), "token_clip", "num_iterations=2"),
    (
        dict(token_clip="clip_cov", importance_sampling_level="sequence"),
        "token_clip",
        "importance_sampling_level='token'",
    ),
    (dict(sample_filter="top_k"), "sample_filter", "best_worst"),
    (dict(kl_control="pid"), "kl_control", "adaptive"),
    (dict(kl_control="adaptive", beta=0.0), "beta", "beta=0.04"),
    (dict(kl_control="adaptive", beta=2.0), "beta", "kl_beta_max"),
    (dict(kl_beta_min=0.0), "kl_beta_min", "kl_beta_min=1e-4"),
    (dict(kl_beta_min=0.5, kl_beta_max=0.1), "kl_beta_max", "raise kl_beta_max"),
    (dict(kl_target=0.0), "kl_target", "kl_target=0.1"),
    (dict(kl_target=float("inf")), "kl_target", "finite"),
    (dict(kl_horizon=0), "kl_horizon", "kl_horizon=10000"),
    (dict(prm_batch_size=0), "prm_batch_size", "prm_batch_size=8"),
    (dict(prm_model_name_or_path="some/prm"), "prm_model_name_or_path", "advantage_estimator='prm'"),
    (dict(entropy_control="aepo", aepo_temperature_low=1.5), "aepo_temperature_low", "0.8 and 1.2"),
    (dict(aepo_coef=0.0), "aepo_coef", "aepo_coef=1.0"),
    (dict(aepo_target_entropy=-1.0), "aepo_target_entropy", "0.5"),
    (dict(entropy_control="aepo", entropy_coef=0.1), "entropy_control", "entropy_coef=0"),
    (dict(diversity_metrics=["perplexity"]), "diversity_metrics", "distinct"),
    (dict(collapse_entropy_min=0.5), "collapse_entropy_min", "add 'entropy'"),
    (dict(diversity_metrics=["distinct"], collapse_distinct2_drop=1.5), "collapse_distinct2_drop", "0.5"),
    (dict(kl_diversity_target=0.0), "kl_diversity_target", "0.5"),
    (dict(eval_pass_at_k=[0]), "eval_pass_at_k", "[1, 4, 8]"),
]


@pytest.mark.parametrize("overrides, field, fix", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_config_names_field_and_fix(overrides, field, fix):
    with pytest.raises(ValueError) as info:
        make(**overrides)
    message = str(info.value)
    assert f"GRPOExtConfig.{field}=" in message
    assert "Fix:" in message and fix in message


def test_kl_cov_off_policy_is_accepted():
    assert make(token_clip="kl_cov", num_iterations=2).is_off_policy
    assert make(token_clip="kl_cov", steps_per_generation=2).is_off_policy


@pytest.mark.parametrize(
    "overrides",
    [dict(token_clip="kl_cov", kl_cov_ratio=0.2, num_iterations=2), dict(token_clip="clip_cov", clip_cov_ratio=0.1)],
)
def test_token_clip_ratio_that_looks_like_a_percentage_warns(overrides):
    # PRIME-RL's k_percent=0.2 means 0.2% of tokens; pasted into kl_cov_ratio it would mean 20%.
    with pytest.warns(UserWarning, match=r"fraction, not a percentage") as record:
        make(**overrides)
    ours = [w for w in record if "not a percentage" in str(w.message)]
    assert len(ours) == 1 and f"{overrides['token_clip']}_ratio" in str(ours[0].message)


def test_paper_ratios_and_inactive_ratios_do_not_warn():
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make(token_clip="kl_cov", kl_cov_ratio=2e-3, num_iterations=2)
        make(token_clip="clip_cov", clip_cov_ratio=0.05)
        make(token_clip="none", kl_cov_ratio=0.2)  # not active: nothing to warn about
    assert not [w for w in record if "not a percentage" in str(w.message)]


def test_every_extension_field_documented_and_literal_switches():
    ours = [
        f for f in dataclasses.fields(GRPOExtConfig) if f.name not in {g.name for g in dataclasses.fields(GRPOConfig)}
    ]
    assert len(ours) >= 15
    hints = typing.get_type_hints(GRPOExtConfig)
    for f in ours:
        assert f.metadata.get("help"), f"{f.name} has no help"
        assert f.name in GRPOExtConfig.__doc__, f"{f.name} missing from the docstring"
    for name in ("advantage_std", "token_clip_scope", "dynamic_sampling_fill", "collapse_action"):
        assert typing.get_origin(hints[name]) is typing.Literal  # a closed list of values: the annotation is it
    for switch in ("advantage_estimator", "token_clip", "sample_filter", "kl_control"):
        assert hints[switch] is str  # a family switch: its values are the registry's (test_registry)


def test_no_field_shadows_trl():
    """No field GRPOExtConfig declares itself redefines a GRPOConfig field (it would silently change TRL's default)."""
    from trl import GRPOConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    from trl_grpo_ext.config import SECTIONS

    own = [name for section in SECTIONS for name in section.__annotations__]  # declared by the family sections
    assert len(own) == len(set(own)) > 40  # each field in exactly one section
    own = set(own)
    assert not set(GRPOExtConfig.__annotations__) - {"FAMILY_SWITCHES"}  # GRPOExtConfig itself only composes
    assert not own & trl_fields, sorted(own & trl_fields)
    assert {"token_clip", "sample_filter", "kl_control"} <= own


CLI = [
    "--output_dir",
    "o",
    "--use_cpu",
    "--bf16",
    "false",
    "--report_to",
    "none",
    "--per_device_train_batch_size",
    "8",
    "--num_generations",
    "4",
]


def test_trl_parser_command_line():
    (cfg,) = TrlParser((GRPOExtConfig,)).parse_args_and_config(
        CLI
        + [
            "--token_clip",
            "clip_cov",
            "--clip_cov_ratio",
            "0.01",
            "--sample_filter",
            "best_worst",
            "--kl_control",
            "adaptive",
            "--beta",
            "0.04",
            "--kl_target",
            "0.2",
            "--token_clip_scope",
            "global",
        ]
    )
    assert (cfg.token_clip, cfg.clip_cov_ratio, cfg.sample_filter, cfg.kl_control, cfg.kl_target) == (
        "clip_cov",
        0.01,
        "best_worst",
        "adaptive",
        0.2,
    )
    assert cfg.token_clip_scope == "global"


def test_trl_parser_rejects_unknown_switch_value():
    with pytest.raises(SystemExit):
        TrlParser((GRPOExtConfig,)).parse_args_and_config(CLI + ["--token_clip", "bogus"])


def test_trl_parser_yaml_config(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "token_clip": "kl_cov",
                "num_iterations": 2,
                "kl_cov_ratio": 0.002,
                "sample_filter": "nonzero_std",
                "advantage_std": "population",
            }
        )
    )
    (cfg,) = TrlParser((GRPOExtConfig,)).parse_args_and_config(CLI + ["--config", str(path)])
    assert (cfg.token_clip, cfg.num_iterations, cfg.sample_filter, cfg.advantage_std) == (
        "kl_cov",
        2,
        "nonzero_std",
        "population",
    )


def test_help_lists_fields(capsys):
    with pytest.raises(SystemExit):
        TrlParser((GRPOExtConfig,)).parse_args_and_config(["--help"])
    out = capsys.readouterr().out
    for name in ("--token_clip", "--clip_cov_ratio", "--sample_filter", "--kl_control", "--kl_target"):
        assert name in out
    assert "Cui et al. 2025" in " ".join(out.split())


def test_without_extensions_is_vanilla_with_the_same_trl_settings():
    args = make(
        output_dir="out",
        steps_per_generation=4,
        per_device_train_batch_size=16,
        learning_rate=3e-4,
        token_clip="kl_cov",
        sample_filter="best_worst",
        advantage_std="population",
        entropy_control="aepo",
        beta=0.04,
        kl_control="adaptive",
        diversity_metrics=["distinct"],
    )
    vanilla = args.without_extensions(output_dir="out/vanilla")
    for name in GRPOExtConfig.FAMILY_SWITCHES:
        assert getattr(vanilla, name) == getattr(make(), name)
    assert vanilla.beta == 0.0  # the controller owned beta: back to TRL's default, no KL term
    assert vanilla.output_dir == "out/vanilla" and vanilla.diversity_metrics == ["distinct"]
    assert (vanilla.learning_rate, vanilla.steps_per_generation, vanilla.generation_batch_size) == (3e-4, 4, 64)
    assert args.token_clip == "kl_cov"  # the original is untouched
    fixed = make(beta=0.02, token_clip="clip_cov").without_extensions()
    assert fixed.beta == 0.02 and fixed.token_clip == "none"  # a fixed beta is TRL's own setting: kept


def test_each_section_checks_only_its_own_fields():
    """A section's ``check`` reads its own fields; what reads another family's or TRL's fields is in the section's
    ``check_across`` (its cross-family rules, beside its fields)."""
    import ast
    import inspect
    import textwrap

    from trl_grpo_ext.config import SECTIONS

    for section in SECTIONS:
        own = set(section.__annotations__)
        tree = ast.parse(textwrap.dedent(inspect.getsource(section.check)))
        read = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        }
        assert read <= own, f"{section.__name__}.check reads {sorted(read - own)}"


def test_one_list_of_sections_makes_the_flat_config_its_switches_and_its_docs():
    """``SECTIONS`` is the one list: GRPOExtConfig's bases are the sections (then GRPOConfig), its switch list is the
    sections' switches, its docstring holds every section's, and ``PLUGIN_FIELDS`` is their fields in order."""
    from trl import GRPOConfig

    from trl_grpo_ext.config import PLUGIN_FIELDS, SECTIONS, GRPOExtFields

    assert GRPOExtConfig.__bases__ == (GRPOExtFields,) and GRPOExtFields.__bases__ == (*reversed(SECTIONS), GRPOConfig)
    assert GRPOExtConfig.FAMILY_SWITCHES == tuple(s for section in SECTIONS for s in section.switches)
    assert {"advantage_estimator", "token_clip", "sample_filter", "kl_control", "entropy_control"} <= set(
        GRPOExtConfig.FAMILY_SWITCHES
    )
    assert all(section.__doc__.strip() in GRPOExtConfig.__doc__ for section in SECTIONS)
    assert PLUGIN_FIELDS == tuple(f.name for section in SECTIONS for f in dataclasses.fields(section))
    for section in SECTIONS:  # one module per section, named after it
        assert section.__module__.startswith("trl_grpo_ext.config."), section


@pytest.mark.parametrize(
    ("name", "bad"),
    [("kl_beta_max", 1e3), ("aepo_temperature_high", 11.0), ("collapse_repetition_max", 1.5), ("beta", 1e3)],
)
def test_a_fields_bounds_are_declared_by_its_section(name, bad):
    """A section declares its fields' bounds beside them (``field_bounds``; TRL's fields the families read in
    TRL_FIELD_BOUNDS); a value outside them is refused with the bound, why and an example."""
    from trl_grpo_ext.config import SECTIONS, TRL_FIELD_BOUNDS

    declared = {}
    for section in SECTIONS:
        own = section.__dict__.get("field_bounds", {})
        assert set(own) <= {f.name for f in dataclasses.fields(section)}, section  # only its own fields
        declared.update(own)
    low, high, why, example = declared.get(name) or TRL_FIELD_BOUNDS[name]
    extra = {"kl_control": "adaptive", "beta": 0.04} if name.startswith("kl_") else {}
    with pytest.raises(ValueError, match=rf"GRPOExtConfig\.{name}=.*outside \[.*\]: {re.escape(why)}\. Fix: e\.g\."):
        make(**extra, **{name: bad})


def test_a_member_that_changed_family_is_refused_with_its_new_switch(tmp_path):
    """Entropy-shaped advantages are an advantage weighting since 0.2.0: the old spelling names the new one."""
    from trl_grpo_ext import GRPOExtConfig

    moved = r"entropy_control='entropy_advantage': this member moved to advantage_weighting.*Fix: set advantage_w"
    with pytest.raises(ValueError, match=moved):
        GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, entropy_control="entropy_advantage")
    args = GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, advantage_weighting="entropy_advantage",
                         entropy_control="aepo")  # fmt: skip
    assert (args.advantage_weighting, args.entropy_control) == ("entropy_advantage", "aepo")  # now they combine
    # dynamic sampling refills before the sample filter chooses: its own family, so the two combine
    moved = r"sample_filter='dynamic_sampling': this member moved to refill.*Fix: set refill='dynamic_sampling'"
    with pytest.raises(ValueError, match=moved):
        GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, sample_filter="dynamic_sampling")
    args = GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, refill="dynamic_sampling",
                         sample_filter="best_worst")  # fmt: skip
    assert (args.refill, args.sample_filter) == ("dynamic_sampling", "best_worst")
