"""Seeing collapse: diversity functions, the CollapseMonitor, diversity-driven KL, wandb keys, plots, dashboard."""

import glob
import json
import math
import subprocess
import sys
from collections import Counter

import pytest
import torch
from conftest import last_logs
from hypothesis import given, settings
from hypothesis import strategies as st
from wandb_records import history_keys_and_metrics

from grpo_lab import testkit
from trl_grpo_ext.core import (
    DiversityKLController,
    batch_diversity,
    distinct_n,
    distinct_n_batch,
    pass_at_k,
    repetition_rate,
    repetition_rates,
    self_bleu_batch,
    unique_fraction,
)

IDS = torch.tensor([[1, 2, 3, 1, 2, 3], [1, 2, 3, 4, 5, 6], [7, 7, 7, 7, 0, 0], [1, 2, 3, 1, 2, 3]])
MASK = torch.tensor([[1] * 6, [1] * 6, [1, 1, 1, 1, 0, 0], [1] * 6])


def test_hand_computed_diversity():
    # bigrams: row0 12 23 31 12 23; row1 12 23 34 45 56; row2 77 77 77; row3 = row0 -> 18 bigrams, 7 distinct
    assert distinct_n_batch(IDS, MASK, 2) == pytest.approx(7 / 18)
    assert distinct_n([[1, 2, 3, 1, 2, 3], [1, 2, 3, 4, 5, 6], [7, 7, 7, 7], [1, 2, 3, 1, 2, 3]], 2) == 7 / 18
    # groups of 2: {row0,row1}: 10 bigrams, 6 distinct; {row2,row3}: 8 bigrams, 4 distinct
    assert distinct_n_batch(IDS, MASK, 2, group_size=2) == pytest.approx((6 / 10 + 4 / 8) / 2)
    torch.testing.assert_close(repetition_rates(IDS, MASK, 2), torch.tensor([2 / 5, 0.0, 2 / 3, 2 / 5]))
    assert repetition_rate([7, 7, 7, 7], 2) == pytest.approx(2 / 3)
    assert unique_fraction(IDS, MASK, 2) == 1.0 and unique_fraction(IDS, MASK, 4) == 0.75
    assert distinct_n([], 2) == 0.0 and distinct_n_batch(IDS[:, :1], MASK[:, :1], 2) == 0.0


def test_self_bleu_extremes():
    same = torch.tensor([[5, 6, 7, 8, 9]] * 4)
    assert self_bleu_batch(same, torch.ones_like(same), 4) == pytest.approx(1.0)
    disjoint = torch.arange(20).view(4, 5)
    assert self_bleu_batch(disjoint, torch.ones_like(disjoint), 4) < 0.01
    # One shared completion in a group of two: BLEU 1 for both; the other group below 1.
    assert self_bleu_batch(IDS[[0, 3]], MASK[[0, 3]], 2) == pytest.approx(1.0)
    assert self_bleu_batch(IDS, MASK, 2) < 1.0


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (ids, mask) of token lists."""
    width = max(len(r) for r in rows) or 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=12), min_size=1, max_size=6), st.integers(1, 4))
def test_batch_versions_match_reference(rows, n):
    ids, mask = _padded(rows)
    assert distinct_n_batch(ids, mask, n) == pytest.approx(distinct_n(rows, n))
    torch.testing.assert_close(repetition_rates(ids, mask, n), torch.tensor([repetition_rate(r, n) for r in rows]))


def _pinned_batch():
    """32 completions in groups of 4, right-padded, three copies of row 0 (two in its group), a hole in row 5."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 12, (32, 40), generator=g)
    lengths = torch.randint(0, 41, (32,), generator=g)
    ids[[1, 2, 9]], lengths[[1, 2, 9]] = ids[0].clone(), lengths[0].clone()
    mask = torch.arange(40)[None] < lengths[:, None]
    mask[5, 3] = False  # windows across the hole are not n-grams
    return ids, mask


# The values of release 0.2.0's implementation (two sorts per metric and n-gram order) on _pinned_batch: the one-sort
# rewrite must print the same numbers.
PINNED = {
    "distinct_1": 0.017216643318533897,
    "distinct_1_in_group": 0.15517300367355347,
    "distinct_2": 0.21052631735801697,
    "distinct_2_in_group": 0.7239937782287598,
    "distinct_3": 0.731437623500824,
    "distinct_3_in_group": 0.9101247191429138,
    "distinct_4": 0.8369384407997131,
    "distinct_4_in_group": 0.9299065470695496,
    "self_bleu": 0.22295625507831573,
    "unique_frac": 0.9375,
    "repetition": 0.011385912075638771,
}


@pytest.mark.parametrize("fused_tokens", [0, 2**40], ids=["one-order-per-pass", "all-orders-in-one-pass"])
def test_diversity_values_unchanged(monkeypatch, fused_tokens):
    monkeypatch.setattr("trl_grpo_ext.core.diversity._FUSED_TOKENS", fused_tokens)
    ids, mask = _pinned_batch()
    fused = batch_diversity(ids, mask, 4)
    fused["repetition"] = float(fused["repetition"].mean())
    single = {"self_bleu": self_bleu_batch(ids, mask, 4), "unique_frac": unique_fraction(ids, mask, 4)}
    single["repetition"] = float(repetition_rates(ids, mask, 3).mean())
    for n in (1, 2, 3, 4):
        single[f"distinct_{n}"] = distinct_n_batch(ids, mask, n)
        single[f"distinct_{n}_in_group"] = distinct_n_batch(ids, mask, n, group_size=4)
    expected = torch.tensor([PINNED[k] for k in sorted(PINNED)])
    torch.testing.assert_close(torch.tensor([fused[k] for k in sorted(PINNED)]), expected)
    torch.testing.assert_close(torch.tensor([single[k] for k in sorted(PINNED)]), expected)
    assert fused == single | {"repetition": fused["repetition"]}  # one code path: the same floats, bit for bit


def _python_self_bleu(rows: list[list[int]], group_size: int, max_n: int = 4) -> float:
    """self_bleu_batch written out with Counters, one completion at a time (the definition, not the vectorisation). A
    completion alone in its group has no reference: 0.0, as the list API ``self_bleu`` gives."""
    if group_size < 2:
        return 0.0
    scores = []
    for start in range(0, len(rows), group_size):
        group = rows[start : start + group_size]
        for i, cand in enumerate(group):
            if not cand:
                continue
            others = [r for j, r in enumerate(group) if j != i]
            log_p = 0.0
            for n in range(1, max_n + 1):
                grams = Counter(tuple(cand[k : k + n]) for k in range(len(cand) - n + 1))
                refs = [Counter(tuple(r[k : k + n]) for k in range(len(r) - n + 1)) for r in others]
                clipped = sum(min(c, max((r[g] for r in refs), default=0)) for g, c in grams.items())
                total = sum(grams.values())
                p = (clipped / total if total else 0.0) if n == 1 else (clipped + 1) / (total + 1)
                log_p += math.log(max(p, 1e-9))
            ref_len = min((len(r) for r in others), key=lambda r: (abs(r - len(cand)), r), default=len(cand))
            brevity = math.exp(1 - ref_len / len(cand)) if len(cand) < ref_len else 1.0
            scores.append(brevity * math.exp(log_p / max_n))
    return sum(scores) / len(scores) if scores else 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_batch_diversity_matches_definitions(group_size, groups, data):
    """Every value of batch_diversity against plain-Python definitions, on random right-padded groups with repeats."""
    rows = [
        data.draw(st.lists(st.integers(0, 3), min_size=0, max_size=9), label=f"row {i}")
        for i in range(group_size * groups)
    ]
    ids, mask = _padded(rows)
    out = batch_diversity(ids, mask, group_size)
    grouped = [rows[s : s + group_size] for s in range(0, len(rows), group_size)]
    for n in (1, 2, 3, 4):
        assert out[f"distinct_{n}"] == pytest.approx(distinct_n(rows, n))
        in_group = [distinct_n(g, n) for g in grouped if any(len(r) >= n for r in g)]
        assert out[f"distinct_{n}_in_group"] == pytest.approx(sum(in_group) / len(in_group) if in_group else 0.0)
    torch.testing.assert_close(out["repetition"], torch.tensor([repetition_rate(r, 3) for r in rows]))
    assert out["self_bleu"] == pytest.approx(_python_self_bleu(rows, group_size), rel=1e-5)
    assert out["unique_frac"] == pytest.approx(sum(len({tuple(r) for r in g}) / group_size for g in grouped) / groups)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_entropy_percentiles_are_torch_quantile(size, seed):
    from trl_grpo_ext.callbacks import _QUANTILES, _quantiles

    values = torch.rand(size, generator=torch.Generator().manual_seed(seed)) * 5
    assert torch.equal(_quantiles(values), torch.quantile(values, torch.tensor(_QUANTILES)))


def test_pass_at_k():
    assert callable(pass_at_k)  # the function, not a submodule of the same name shadowing it in trl_grpo_ext.core
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 4) == 1.0 and pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - (7 * 6) / (10 * 9))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_diversity_controller_scripted_sequence():
    ctl = DiversityKLController(0.05, target=0.6, horizon=64, beta_min=1e-3, beta_max=1.0)
    betas = [ctl.update(d, n_steps=32) for d in (0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.3, 0.8)]
    assert betas[0] < 0.05 and betas[1] < betas[0]  # diverse: relaxed
    assert betas[2] > betas[1] and betas[3] > betas[2] and betas[5] > betas[4]  # falling diversity: raised
    assert betas[7] < betas[6]  # diversity back above target: relaxed again


COLLAPSE_ARGS = dict(
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=8,
    max_steps=12,
    logging_steps=1,
    diversity_metrics=["distinct", "self_bleu", "repetition", "unique", "entropy"],
    collapse_entropy_min=0.5,
    collapse_distinct2_drop=0.5,
)


def test_collapse_is_seen_and_alarmed(make_trainer):
    trainer = make_trainer(
        learning_rate=3e-2,
        collapse_action="stop",
        save_strategy="no",
        reward_funcs=[testkit.first_char_reward, testkit.digit_fraction_reward],
        **COLLAPSE_ARGS,
    )
    trainer.train()
    logs = last_logs(trainer)
    assert trainer.collapse_monitor.alarms, "the collapsing run did not trip the alarm"
    assert trainer.state.global_step < 12  # action 'stop'
    assert logs[-1]["alarm/collapse"] == 1.0
    assert logs[-1]["entropy/mean"] < 0.5 * logs[0]["entropy/mean"]
    assert logs[-1]["diversity/distinct_2"] < 0.5 * logs[0]["diversity/distinct_2"]
    assert logs[-1]["diversity/self_bleu"] > logs[0]["diversity/self_bleu"]
    for key in (
        "entropy/p10",
        "entropy/p50",
        "entropy/p90",
        "entropy/low_frac",
        "diversity/unique_frac",
        "diversity/distinct_4_in_group",
        "diversity/repetition",
    ):
        assert key in logs[-1]


def test_healthy_run_does_not_alarm(make_trainer):
    trainer = make_trainer(
        learning_rate=1e-4, reward_funcs=[testkit.first_char_reward, testkit.digit_fraction_reward], **COLLAPSE_ARGS
    )
    trainer.train()
    assert not trainer.collapse_monitor.alarms
    assert all(h["alarm/collapse"] == 0.0 for h in last_logs(trainer))
    assert trainer.state.global_step == 12


def test_diversity_every_measures_steps_1_1_plus_k_at_their_own_step(make_trainer):
    """diversity_every=2: the n-gram metrics at steps 1, 3, 5 only, each equal to what an every-step run logs at that
    step (the monitor does not change training); the entropy percentiles with them, its mean at every step."""
    metrics = ["distinct", "self_bleu", "repetition", "unique", "entropy"]
    runs = {}
    for every in (1, 2):
        trainer = make_trainer(max_steps=5, diversity_metrics=metrics, diversity_every=every)
        trainer.train()
        runs[every] = last_logs(trainer)
    every_step, sparse = runs[1], runs[2]
    assert [h["step"] for h in sparse if "diversity/distinct_2" in h] == [1, 3, 5]
    assert all("entropy/mean" in h and "diversity/self_bleu" in h for h in every_step)
    assert all("entropy/mean" in h for h in sparse)
    assert [h["step"] for h in sparse if "entropy/p50" in h] == [1, 3, 5]
    for full, part in zip(every_step, sparse, strict=True):
        for key, value in part.items():
            if key.startswith(("diversity/", "entropy/mean", "entropy/low_frac")):
                assert value == full[key], (part["step"], key)


@pytest.mark.parametrize("log_completions", [True, False])
def test_repetition_column_follows_the_completions_table(make_trainer, log_completions):
    """With log_completions the table gets a repetition value per row of every batch; without, no column is built
    (nothing on the step's critical path) and diversity/repetition is still logged."""
    trainer = make_trainer(max_steps=2, diversity_metrics=["repetition"], log_completions=log_completions)
    trainer.train()
    column = trainer._logs["extra"].get("repetition")
    if log_completions:
        assert len(column) == len(trainer._logs["completion"]) and all(0.0 <= v <= 1.0 for v in column)
    else:
        assert not column
    assert all("diversity/repetition" in h for h in last_logs(trainer))


def test_monitor_works_with_plain_trl_trainer(make_trainer):
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_ext.callbacks import CollapseMonitor

    trainer = make_trainer(cls=GRPOTrainer, config_cls=GRPOConfig, max_steps=3)
    before = dict(vars(trainer))
    trainer.add_callback(CollapseMonitor(trainer, metrics=["distinct", "entropy"], alarm_entropy_min=100.0))
    assert {k: v for k, v in vars(trainer).items() if k in before} == before  # no method replaced on the instance
    assert not set(vars(trainer)) - set(before)
    trainer.train()
    logs = last_logs(trainer)
    assert all("diversity/distinct_2" in h for h in logs)
    # the entropy TRL logs for the step (one loss pass per step here), read, not captured by a patched method
    assert all(h["entropy/mean"] == pytest.approx(h["entropy"]) for h in logs)
    assert not any("entropy/p50" in h or "entropy/low_frac" in h for h in logs)
    assert all(h["alarm/collapse"] == 1.0 for h in logs)  # the alarm reads it (threshold above any entropy)


def test_diversity_kl_raises_beta_when_diversity_falls(make_trainer):
    # The collapsing setting: Distinct-2 starts near 1 (beta relaxes), then falls under its target (beta rises).
    trainer = make_trainer(
        kl_control="diversity",
        beta=0.04,
        kl_diversity_target=0.5,
        kl_horizon=64,
        learning_rate=3e-2,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=8,
        max_steps=12,
        reward_funcs=[testkit.first_char_reward, testkit.digit_fraction_reward],
    )
    trainer.train()
    logs = last_logs(trainer)
    diversity = [h["kl/diversity"] for h in logs]
    betas = [h["kl/beta"] for h in logs] + [trainer.beta]
    assert diversity[0] > 0.5 and diversity[-1] < 0.5
    low = betas.index(min(betas))
    assert 0 < low < len(betas) - 1 and betas[-1] > betas[low]  # relaxed while diverse, raised once it fell
    assert all(diversity[i] < 0.5 for i in range(low, len(diversity)))


def test_offline_wandb_run_has_every_documented_key(make_trainer, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = make_trainer(
        report_to="wandb",
        max_steps=2,
        beta=0.04,
        kl_control="adaptive",
        token_clip="clip_cov",
        clip_cov_lb=-100.0,
        clip_cov_ratio=0.05,
        sample_filter="best_worst",
        loss_type="grpo",
        diversity_metrics=["distinct", "self_bleu", "repetition", "unique", "entropy"],
        log_completions=True,
    )
    trainer.train()
    import wandb

    wandb.finish()
    run_file = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))[0]
    keys, metrics = history_keys_and_metrics(run_file)
    from trl_grpo_ext.callbacks import metric_groups
    from trl_grpo_ext.families import TRAINER_METRICS, declared_metrics

    # what this run's members, monitor and timing callback declare (rewards/timeouts: only once math answers are
    # scored in the worker pool)
    declared = [k for keys in declared_metrics(trainer.extensions.values()).values() for k in keys]
    documented = [k for k in declared if k not in TRAINER_METRICS]
    assert {"kl/beta", "clip_cov/selected_frac", "filter/kept_frac", "diversity/distinct_4", "timing/ext_s"} <= set(
        documented
    )
    missing = [k for k in documented if f"train/{k}" not in keys]
    assert not missing, missing
    assert {f"train/{group}/*" for group in metric_groups(declared)} <= metrics
    assert {"train/kl/*", "train/entropy/*", "train/diversity/*", "train/timing/*"} <= metrics
    assert any(k.startswith("completions/") for k in keys)  # the completions table


def test_ext_timing_attributes_plugin_work(make_trainer, monkeypatch):
    """timing/ext_s counts the time inside the plugin's hooks and timing/ext_fraction divides it by the step's, on a
    fake clock (no wall-clock reading) that moves 3 s in the plugin's generation hook and 1 s per call of TRL's
    ``_generate``, and nowhere else. With AEPO a generation batch calls ``_generate`` twice: TRL's own generation
    (1 s, not the plugin's) and AEPO's regeneration inside the hook (1 s, the plugin's): 4 s of plugin time out of 5."""
    from types import SimpleNamespace

    from trl_grpo_ext import callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    trainer = make_trainer(max_steps=4, entropy_control="aepo")

    def advancing(method, seconds):
        def wrapper(*args, **kwargs):
            now[0] += seconds
            return method(*args, **kwargs)

        return wrapper

    trainer._on_generation = advancing(trainer._on_generation, 3.0)  # plugin work: inside ext_clock.measure()
    trainer._generate = advancing(trainer._generate, 1.0)  # TRL's generation, and AEPO's from inside the hook
    trainer.train()
    logs = last_logs(trainer)
    assert len(logs) == 4
    generated = [h for h in logs if h["timing/ext_s"] > 0]
    assert generated, logs
    for h in logs:
        if h["timing/ext_s"] == 0.0:  # a step that reused a buffered generation batch
            assert h["timing/ext_fraction"] == 0.0
            continue
        batches = h["timing/ext_s"] / 4.0
        assert batches == int(batches) >= 1, h
        assert h["timing/ext_fraction"] == pytest.approx(0.8, abs=1e-6), h


def test_the_collapse_monitors_own_work_counts_as_plugin_time(make_trainer, monkeypatch):
    """The monitor measures its work outside the hooks (its step-end checks, evaluation) on the trainer's clock, so
    timing/ext_s includes it (a fake clock: 2 s inside the monitor's measure land in the trainer's plugin time)."""
    from types import SimpleNamespace

    from trl_grpo_ext import callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    trainer = make_trainer(diversity_metrics=["distinct"])
    monitor = trainer.collapse_monitor
    before = trainer.ext_clock.seconds
    with callbacks._clock(monitor.source):
        now[0] += 2.0
    assert trainer.ext_clock.seconds == before + 2.0


def test_plot_command_on_a_real_run(make_trainer, tmp_path):
    trainer = make_trainer(max_steps=3, beta=0.04, kl_control="adaptive", diversity_metrics=["distinct", "entropy"])
    trainer.train()
    trainer.save_state()
    out = tmp_path / "plots"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trl_grpo_ext.plot",
            trainer.args.output_dir,
            trainer.args.output_dir,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("training.png", "collapse.png", "families.png"):  # families.png: the kl_control panel
        assert (out / name).stat().st_size > 5000
    from trl_grpo_ext.families import FAMILIES
    from trl_grpo_ext.plot import panels

    family_panels = dict(panels()["families"])
    assert set(family_panels) == set(FAMILIES)
    assert "kl/beta" in family_panels["kl_control"] and "clip_cov/selected_frac" in family_panels["token_clip"]
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        from trl_grpo_ext.plot import load_log_history

        load_log_history(tmp_path)


def test_plots_give_each_run_one_colour_and_each_metric_one_line_style(tmp_path, monkeypatch):
    """start / vanilla / tools stay apart in every panel: a run keeps its colour across panels, a panel's metrics
    differ by line style."""
    import matplotlib.figure

    from trl_grpo_ext.plot import plot_pass_at_k, plot_runs

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    history = [{"step": s, "reward": 0.1 * s, "kl/value": 0.01 * s, "kl/beta": 0.04} for s in (1, 2, 3)]
    plot_runs({"vanilla": history, "tools": history}, tmp_path)
    lines = {line.get_label(): line for fig in figures for ax in fig.axes for line in ax.get_lines()}
    assert lines["vanilla: reward"].get_color() == lines["vanilla: kl/value"].get_color()
    assert lines["vanilla: reward"].get_color() != lines["tools: reward"].get_color()
    assert lines["tools: kl/value"].get_linestyle() != lines["tools: kl/beta"].get_linestyle()
    assert lines["tools: kl/value"].get_linestyle() == lines["vanilla: kl/value"].get_linestyle()
    figures.clear()
    plot_pass_at_k({"start": {1: 0.3, 64: 1.0}, "vanilla": {"1": 0.9, "64": 1.0}}, tmp_path / "pass_at_k.png")
    (ax,) = figures[0].axes
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 64], [1, 64]]
    assert ax.get_xscale() == "log"


def test_dashboard_spec_without_network(capsys):
    from trl_grpo_ext import dashboard
    from trl_grpo_ext.callbacks import monitor_metric_keys
    from trl_grpo_ext.families import FAMILIES

    workspace = dashboard.build_workspace("my-entity", "my-project")
    shown = {key for keys in dashboard.sections().values() for key in keys}
    declared = {f"train/{m}" for reg in FAMILIES.values() for n in reg.names() for m in reg.get(n).metrics}
    assert declared and declared <= shown  # every member's declared metric has a panel
    # the monitor's keys (Distinct-1/2) come from its own declaration: a metric it adds appears without editing
    assert {f"train/{k}" for k in monitor_metric_keys(ngram_sizes=(1, 2))} <= shown
    panels = {p.y[0] for s in workspace.sections for p in s.panels}
    assert {"train/kl/beta", "train/diversity/distinct_2", "train/entropy/p10", "train/alarm/collapse"} <= panels
    assert {"train/audit/disagreement", "train/audit/flagged_frac"} <= set(
        dashboard.sections()["Learning or hacking: audits"]
    )
    dashboard.main(["--entity", "my-entity", "--project", "my-project", "--dry-run",
                    "--validation_metric", "rewards/strict/mean"])  # fmt: skip
    spec = json.loads(capsys.readouterr().out)
    assert spec["entity"] == "my-entity" and "train/kl/beta" in json.dumps(spec)
    assert "eval/rewards/strict/mean" in json.dumps(spec)


def test_every_plotted_and_grouped_metric_is_declared_once():
    """The curated plot panels name only declared keys (a renamed metric fails here, not silently in a plot), the
    monitor's declaration matches what it logs, and wandb's metric groups come from the declarations."""
    import torch

    from trl_grpo_ext.callbacks import CollapseMonitor, MetricGroupsCallback, monitor_metric_keys
    from trl_grpo_ext.plot import PANELS, undeclared_panel_keys

    assert undeclared_panel_keys() == []
    saved = PANELS["training"]
    PANELS["training"] = [*saved, ("typo", ["kl/betta"])]
    try:
        assert undeclared_panel_keys() == ["kl/betta"]
    finally:
        PANELS["training"] = saved
    monitor = CollapseMonitor(type("Host", (), {"feeds_collapse_monitor": True})(), ngram_sizes=(1, 2))
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 1, 2], [5, 6, 7, 8], [5, 6, 5, 6]])
    logged = set(monitor.diversity_metrics(ids, torch.ones_like(ids, dtype=torch.bool), group_size=2))
    assert logged == {k for k in monitor_metric_keys(ngram_sizes=(1, 2)) if k.startswith("diversity/")}
    callback = MetricGroupsCallback(["kl/beta", "kl/value", "aepo/temperature", "reward"])
    assert callback.groups == ("kl", "aepo")


def test_monitor_rejects_bad_arguments(make_trainer):
    from trl_grpo_ext.callbacks import CollapseMonitor

    trainer = make_trainer(max_steps=1)
    with pytest.raises(ValueError, match="Unknown diversity metric"):
        CollapseMonitor(trainer, metrics=["perplexity"])
    with pytest.raises(ValueError, match="alarm_action"):
        CollapseMonitor(trainer, alarm_action="explode")


TRACKIO_RUN = """
import tempfile
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer
from grpo_lab import testkit
d = tempfile.mkdtemp()
args = GRPOExtConfig(output_dir=d + "/o", per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                     max_steps=2, logging_steps=1, report_to="trackio", use_cpu=True, bf16=False, disable_tqdm=True,
                     beta=0.04, kl_control="adaptive", diversity_metrics=["distinct", "entropy"])
GRPOExtTrainer(model=testkit.save_tiny_model(d + "/m"), reward_funcs=[testkit.digit_fraction_reward], args=args,
               train_dataset=testkit.arithmetic_dataset(64), processing_class=testkit.build_char_tokenizer()).train()
"""


def test_trackio_local_run_has_the_metrics(tmp_path):
    import os
    import sqlite3

    # trackio reads TRACKIO_DIR at import time: run the tiny training in a fresh interpreter.
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", TRACKIO_RUN], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    databases = glob.glob(str(tmp_path / "trackio" / "**" / "*.db"), recursive=True)
    assert databases
    dump = []
    with sqlite3.connect(databases[0]) as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            dump.extend(str(row) for row in db.execute(f"SELECT * FROM {table}"))
    text = "\n".join(dump)
    for key in ("kl/beta", "diversity/distinct_2", "entropy/p50", "alarm/collapse"):
        assert key in text, key


def test_eval_pass_at_k_sampled_and_greedy(make_trainer, train_dataset):
    def always(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = make_trainer(
        reward_funcs=[testkit.digit_fraction_reward],
        eval_pass_at_k=[1, 4],
        eval_pass_threshold=0.25,
        num_generations_eval=4,
        per_device_eval_batch_size=8,
        eval_strategy="no",
    )
    metrics = trainer.evaluate(eval_dataset=train_dataset.select(range(8)))
    p1, p4, greedy = metrics["eval_pass@k/sampled_1"], metrics["eval_pass@k/sampled_4"], metrics["eval_pass@k/greedy"]
    assert 0.0 <= p1 <= p4 <= 1.0 and 0.0 <= greedy <= 1.0
    trainer = make_trainer(
        reward_funcs=[always], eval_pass_at_k=[1, 2], num_generations_eval=4, per_device_eval_batch_size=8
    )
    metrics = trainer.evaluate(eval_dataset=train_dataset.select(range(8)))
    assert metrics["eval_pass@k/sampled_1"] == metrics["eval_pass@k/sampled_2"] == metrics["eval_pass@k/greedy"] == 1.0
    with pytest.raises(ValueError, match="eval_pass_at_k"):
        make_trainer(eval_pass_at_k=[8], num_generations_eval=4)


def test_entropy_that_rises_alarms_and_acts(make_trainer):
    """``collapse_entropy_max`` / ``collapse_entropy_rise``: the alarm on entropy that explodes (verl #2738), with the
    other alarms' actions. The tiny random model's entropy (about 4.5 nats) is above a bound of 1: the run stops at
    step 1."""
    trainer = make_trainer(
        collapse_action="stop",
        save_strategy="no",
        diversity_metrics=["entropy"],
        collapse_entropy_max=1.0,
        max_steps=4,
        logging_steps=1,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    (step, reasons), *_ = trainer.collapse_monitor.alarms
    assert step == 1 and "entropy" in reasons[0] and "> 1.0 (rising)" in reasons[0]
    assert last_logs(trainer)[-1]["alarm/collapse"] == 1.0


def test_entropy_rise_is_relative_to_the_first_measurement_and_resumes(make_trainer):
    monitor = make_trainer(diversity_metrics=["entropy"], collapse_entropy_rise=1.0).collapse_monitor
    assert monitor.alarm_entropy_rise == 1.0 and monitor.alarm_entropy_max is None
    seen = [monitor._threshold_reasons({"entropy/mean": h}) for h in (0.5, 0.3, 0.9, 1.01)]
    assert seen[:3] == [[], [], []]  # a dip and a climb back to less than twice the start: no alarm
    assert seen[3] and "100% above its start" in seen[3][0]
    state = monitor.state_dict()
    assert state["baseline_entropy"] == 0.5
    fresh = make_trainer(diversity_metrics=["entropy"], collapse_entropy_rise=1.0).collapse_monitor
    fresh.load_state_dict(state)
    assert fresh._threshold_reasons({"entropy/mean": 1.01})  # the resumed run keeps its start


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(collapse_entropy_max=0.0), "collapse_entropy_max"),
        (dict(collapse_entropy_rise=-0.5), "collapse_entropy_rise"),
        (dict(collapse_entropy_min=0.5, collapse_entropy_max=0.4), "collapse_entropy_max"),
    ],
)
def test_entropy_rise_refusals(tmp_path, fields, named):
    from trl_grpo_ext import GRPOExtConfig

    with pytest.raises(ValueError, match=named):
        GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, diversity_metrics=["entropy"], **fields)
    with pytest.raises(ValueError, match="add 'entropy'"):
        GRPOExtConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, collapse_entropy_rise=1.0)
