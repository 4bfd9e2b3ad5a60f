"""Drop-in contract: every call a user's working TRL 1.16 code makes on ``GRPOConfig`` / ``GRPOTrainer`` works the same
on ``GRPOExtConfig`` / ``GRPOExtTrainer`` (checked against the installed TRL, not against a copy of it).

Each test names, in its docstring, the user code it protects.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os

import pytest
import torch
import yaml
from conftest import TINY_ARGS, last_logs
from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from trl_grpo_ext.callbacks import CollapseMonitor
from trl_grpo_ext.families import FAMILIES
from trl_grpo_ext.families.observers import OBSERVERS

CPU = dict(use_cpu=True, bf16=False, report_to="none")


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# ------------------------------------------------------------------------------------------------ the config
def test_fields_start_with_grpo_configs_in_its_order():
    """``GRPOExtConfig("out", 8, ...)``: positional arguments mean what they mean for GRPOConfig (and
    TrainingArguments), so a swapped-in class never puts a string into one of our switches."""
    trl_fields = _names(GRPOConfig)
    ours = _names(GRPOExtConfig)
    assert ours[: len(trl_fields)] == trl_fields
    assert len(ours) > len(trl_fields)  # our fields come after, none interleaved


def test_positional_output_dir():
    """``GRPOExtConfig("my-run")``, the form HF's docs use for ``TrainingArguments("test-trainer")``."""
    args = GRPOExtConfig("my-run", **CPU)
    assert args.output_dir == "my-run"
    assert args == GRPOExtConfig(output_dir="my-run", **CPU)
    # the second positional field is per_device_train_batch_size for both
    assert GRPOExtConfig("o", 16, **CPU).per_device_train_batch_size == 16
    assert GRPOConfig("o", 16, **CPU).per_device_train_batch_size == 16


def test_shared_defaults_equal_grpo_configs():
    """A script that swaps the class and sets nothing else trains with TRL's settings."""
    ours, theirs = GRPOExtConfig("o", **CPU).to_dict(), GRPOConfig("o", **CPU).to_dict()
    assert {k: ours[k] for k in theirs} == theirs


def _rebuild(cls, saved: dict):
    """A config from its saved JSON, as a user reloads one: init fields only, and without ``generation_batch_size``,
    which GRPOConfig derives from ``steps_per_generation`` and refuses beside it (true of TRL's class as of ours)."""
    init_fields = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in saved.items() if k in init_fields and k != "generation_batch_size"})


def test_to_dict_and_json_round_trip():
    """``args.to_dict()`` / ``args.to_json_string()`` (what wandb and the Trainer record) hold our fields, and a config
    reloaded from that JSON is the same config, as for GRPOConfig."""
    fields = dict(beta=0.04, learning_rate=3e-6, num_generations=4, **CPU)
    args = GRPOExtConfig("o", token_clip="kl_cov", kl_cov_ratio=0.002, num_iterations=2, **fields)
    args.diversity_metrics = ["distinct"]
    as_dict = args.to_dict()
    assert as_dict["token_clip"] == "kl_cov" and as_dict["diversity_metrics"] == ["distinct"]
    ours = _rebuild(GRPOExtConfig, json.loads(args.to_json_string()))
    theirs = _rebuild(GRPOConfig, json.loads(GRPOConfig("o", num_iterations=2, **fields).to_json_string()))
    assert (ours.token_clip, ours.kl_cov_ratio, ours.diversity_metrics) == ("kl_cov", 0.002, ["distinct"])
    assert {k: ours.to_dict()[k] for k in theirs.to_dict()} == theirs.to_dict()
    assert ours.to_dict() == as_dict


def test_trl_parser_command_line_and_yaml(tmp_path):
    """TRL's recipe scripts: ``TrlParser((ScriptArguments, GRPOExtConfig, ModelConfig))`` with flags and
    ``--config file.yaml``, as with GRPOConfig in the same tuple."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"output_dir": "from-yaml", "kl_control": "adaptive", "beta": 0.04, **CPU}))
    parser = TrlParser((ScriptArguments, GRPOExtConfig, ModelConfig))
    script, args, model = parser.parse_args_and_config(
        ["--config", str(path), "--dataset_name", "local", "--kl_target", "0.2"]
    )
    assert script.dataset_name == "local" and isinstance(model, ModelConfig)
    assert (args.output_dir, args.kl_control, args.kl_target) == ("from-yaml", "adaptive", 0.2)
    # the same flags the plain class takes parse to the same TRL values
    flags = ["--output_dir", "o", "--use_cpu", "--bf16", "false"]
    trl_args = TrlParser((GRPOConfig,)).parse_args_and_config(flags)[0]
    ext_args = TrlParser((GRPOExtConfig,)).parse_args_and_config(flags)[0]
    assert {k: ext_args.to_dict()[k] for k in trl_args.to_dict()} == trl_args.to_dict()


def test_a_grpo_ext_config_is_a_grpo_config(tiny_model_path, tokenizer, train_dataset, tmp_path):
    """Code typed for GRPOConfig (``isinstance`` checks, TRL's own ``GRPOTrainer(args=...)``) takes ours: plain TRL
    trains with a GRPOExtConfig whose switches are off."""
    args = GRPOExtConfig(**{**TINY_ARGS, "output_dir": str(tmp_path), "max_steps": 1})
    assert isinstance(args, GRPOConfig)
    trainer = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=testkit.exact_match_reward,
        args=args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert math.isfinite(last_logs(trainer)[0]["loss"])


# ------------------------------------------------------------------------------------------------ the trainer
def test_init_takes_every_grpo_trainer_parameter_with_its_default():
    """Every ``GRPOTrainer(...)`` call, positional or by keyword: the same parameters in the same order, the same
    defaults; ours (``step_reward_funcs``) are keyword-only after them."""
    theirs = list(inspect.signature(GRPOTrainer.__init__).parameters.values())
    ours = list(inspect.signature(GRPOExtTrainer.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[: len(theirs)]] == [(p.name, p.kind, p.default) for p in theirs]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs) :])


def test_positional_train_dataset(tiny_model_path, tokenizer, train_dataset, tmp_path):
    """``GRPOTrainer(model, reward, args, dataset)``, the positional form TRL's own tests use."""
    args = GRPOExtConfig(**{**TINY_ARGS, "output_dir": str(tmp_path), "max_steps": 1})
    trainer = GRPOExtTrainer(tiny_model_path, testkit.exact_match_reward, args, train_dataset, None, tokenizer)
    assert trainer.train_dataset is train_dataset and trainer.processing_class is tokenizer


def test_no_args_builds_the_default_config_as_trl_names_it(tiny_model_path, tokenizer, train_dataset, monkeypatch):
    """``GRPOExtTrainer(model=..., reward_funcs=..., train_dataset=...)`` without ``args`` (TRL's
    ``test_init_minimal``): a GRPOExtConfig with every default and TRL's output dir ``<model name>-GRPO``."""
    # On a machine without a GPU the default config (bf16, no use_cpu) is refused by transformers, for TRL as for us:
    # what is compared is the call, so both get the same CPU defaults through the same dataclass.
    from transformers import TrainingArguments

    monkeypatch.setattr(TrainingArguments, "__post_init__", _cpu_post_init(TrainingArguments.__post_init__))
    monkeypatch.chdir(os.path.dirname(tiny_model_path))
    common = dict(model=str(tiny_model_path), reward_funcs=testkit.exact_match_reward, train_dataset=train_dataset)
    theirs = GRPOTrainer(processing_class=tokenizer, **common)
    ours = GRPOExtTrainer(processing_class=tokenizer, **common)
    assert type(ours.args) is GRPOExtConfig
    assert ours.args.output_dir == theirs.args.output_dir == "model-GRPO"
    theirs_dict = theirs.args.to_dict()
    assert {k: ours.args.to_dict()[k] for k in theirs_dict} == theirs_dict


def _cpu_post_init(original):
    def post_init(self):
        self.use_cpu, self.bf16 = True, False
        original(self)

    return post_init


# ------------------------------------------------------------------------------------------------ evaluate first
def _digit_steps(prompts, completions, steps, **kwargs):
    return [[sum(ch.isdigit() for ch in s) / len(s) for s in row] for row in steps]


MEMBERS = [
    (switch, name)
    for switch, registry in FAMILIES.items()
    for name in registry.names()
    if not registry.get(name).is_off and not name.startswith("test_")
] + [("observer", name) for name in OBSERVERS.names()]

OBSERVER_CONFIG = {
    "collapse_monitor": dict(diversity_metrics=["distinct", "repetition", "entropy"]),
    "pass_at_k": dict(eval_pass_at_k=[1, 2], eval_pass_greedy=True),
}


@pytest.mark.filterwarnings("ignore:.*not a percentage")
@pytest.mark.parametrize(("switch", "name"), MEMBERS, ids=[f"{s}={n}" for s, n in MEMBERS])
def test_evaluate_before_train_and_eval_on_start(make_trainer, switch, name):
    """``trainer.evaluate()`` before ``trainer.train()``, and ``eval_on_start=True``: nothing a member reads may exist
    only once transformers' training loop has started (``current_gradient_accumulation_steps`` did)."""
    if switch == "observer":
        config = OBSERVER_CONFIG[name]
    else:
        config = {switch: name, **FAMILIES[switch].get(name).example_config}
    trainer_kwargs = {"eval_dataset": testkit.arithmetic_dataset(4, seed=9)}
    if name == "prm":
        trainer_kwargs["step_reward_funcs"] = [_digit_steps]
    trainer = make_trainer(
        trainer_kwargs=trainer_kwargs,
        max_steps=1,
        max_completion_length=8,
        eval_strategy="steps",
        eval_steps=1,
        eval_on_start=True,
        per_device_eval_batch_size=8,
        **config,
    )
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"])
    if (switch, name) == ("observer", "pass_at_k"):  # the evaluation observer, not the PKPO estimator
        assert "eval_pass@k/greedy" in metrics and "eval_pass@k/sampled_2" in metrics
    trainer.train()  # eval_on_start evaluates again before the first step
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evals) >= 2 and evals[0]["step"] == 0
    assert all(math.isfinite(h["eval_loss"]) for h in evals)


def test_plain_trl_collapse_monitor_before_train(tiny_model_path, tokenizer, train_dataset, tmp_path):
    """The monitor as a callback on TRL's own ``GRPOTrainer`` (the plain-TRL entry point), with ``evaluate()`` before
    ``train()`` and ``eval_on_start``."""
    args = GRPOConfig(
        **{**TINY_ARGS, "output_dir": str(tmp_path), "max_steps": 1, "max_completion_length": 8},
        eval_strategy="steps",
        eval_steps=1,
        eval_on_start=True,
        per_device_eval_batch_size=8,
    )
    trainer = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=testkit.exact_match_reward,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=testkit.arithmetic_dataset(4, seed=9),
        processing_class=tokenizer,
    )
    trainer.add_callback(CollapseMonitor(trainer, metrics=["distinct", "entropy"]))
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    trainer.train()
    assert any("diversity/distinct_2" in h for h in trainer.state.log_history)
    assert torch.isfinite(torch.tensor(last_logs(trainer)[0]["loss"]))
