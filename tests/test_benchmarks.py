"""Benchmark scripts' own logic: the GPU check and its wheel list on the CPU (the GPU run itself needs a GPU machine),
the testbed study's paired comparison and held-out checkpoints."""

import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("gpu_check", "gpu_wheels", "overhead", "math_reward_speed", "diversity_speed", "testbed_study"):
        sys.modules.pop(name, None)


def test_gpu_check_runs_tiny_on_cpu(benchmarks_on_path, tmp_path, capsys):
    import gpu_check

    out = tmp_path / "gpu.json"
    argv = ["--tiny", "--steps", "2", "--batch", "8", "--completion_length", "4", "--out", str(out)]
    results = gpu_check.main([*argv, "--only", "AEPO", "all on"])
    assert set(results) == {"trl", "trl beta=0.04", "AEPO", "all on"}  # the chosen configs and their baselines
    assert all(r["step_time_s"] > 0 for r in results.values())
    assert results["trl"]["ext_fraction"] is None and 0 < results["all on"]["ext_fraction"] < 1
    assert json.loads(out.read_text())["device"] == "cpu (tiny)"
    printed = capsys.readouterr().out
    assert "all on" in printed and "vs trl" in printed


def test_gpu_check_pads_the_tokenizer_to_qwens_vocabulary(benchmarks_on_path):
    import gpu_check

    tok = gpu_check.padded_char_tokenizer(151_936)
    assert len(tok) == 151_936
    ids = tok("12+3=", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "12+3=" and tok.decode([151_935]) != ""


def test_gpu_wheels_lists_pinned_dependencies_without_torch(benchmarks_on_path, tmp_path):
    import gpu_wheels

    reqs = gpu_wheels.main([str(tmp_path), "--list"])
    names = {r.split("==")[0] for r in reqs}
    assert {"trl", "transformers", "accelerate", "datasets"} <= names
    assert not any(gpu_wheels.EXCLUDED.match(n) for n in names)
    lines = (tmp_path / "requirements.txt").read_text().split()
    assert lines[-1].startswith("trl_grpo_ext==") and all("==" in line for line in lines)


def test_equivalent_answers_of_the_reward_benchmark_are_timed_and_mostly_right(benchmarks_on_path):
    """The rows behind the per-answer bound's default: right answers in another form, scored by the real reward."""
    import math_reward_speed

    from trl_grpo_ext.rewards.math import math_accuracy

    times = math_reward_speed.equivalent_answer_times()
    assert len(times) == len(math_reward_speed.EQUIVALENT) and all(t > 0 for t in times)
    scores = [math_accuracy(c, g) for c, g in math_reward_speed.EQUIVALENT]
    assert sum(scores) >= len(scores) - 2  # math-verify misses e^{i pi} = -1; the rest are recognised


def _run(seed, acc, entropy=0.1, distinct_2=0.2, pass_at_8=0.9, checkpoints=None):
    end = {"answer_acc": acc, "pass_at_1": 0.5, "pass_at_8": pass_at_8, "entropy": entropy, "distinct_2": distinct_2}
    run = {"seed": seed, "end": end}
    if checkpoints is not None:  # as json.load gives them back: string steps
        run["checkpoints"] = {str(step): {**end, "answer_acc": a} for step, a in checkpoints.items()}
    return run


def test_paired_compares_methods_with_vanilla_run_by_run(benchmarks_on_path):
    import testbed_study

    first = {  # offset 0: seeds 0 and 1
        "runs": {
            "vanilla": [_run(0, 0.90, checkpoints={500: 0.80, 600: 0.90}), _run(1, 0.70, pass_at_8=0.8)],
            "tools": [_run(0, 0.85, entropy=0.2, checkpoints={500: 0.90, 600: 0.85}), _run(1, 0.75, pass_at_8=0.8)],
        }
    }
    second = {  # offset 100: seed 0; the tools' run has a lower entropy and Distinct-2
        "grpo_seed_offset": 100,
        "runs": {"vanilla": [_run(0, 0.60)], "tools": [_run(0, 0.595, entropy=0.05, distinct_2=0.1, pass_at_8=0.8)]},
    }
    again = {"runs": {"vanilla": [_run(0, 0.90)]}}  # the same vanilla run in another study, without checkpoints
    text = testbed_study.paired([first, second, again])
    final = next(line for line in text.splitlines() if line.startswith("| tools | final |"))
    cells = [c.strip() for c in final.strip("|").split("|")]
    # differences -5.0 (0/0), +5.0 (0/1), -0.5 (100/0): mean -0.17, std 5.01
    assert cells[2] == "3" and cells[5] == "-0.2 +- 5.0"
    # clustered by warm start (the seed): warm start 0 has -5.0 and -0.5 (offsets 0 and 100), warm start 1 has +5.0;
    # the mean of the warm starts' means is (-2.75 + 5.0) / 2 = +1.1, two warm starts make it exploratory
    assert cells[6].startswith("+1.1 [") and cells[6].endswith("] over 2 warm starts")
    assert cells[7] == "no effect shown (exploratory)"
    assert cells[8] == "0/0: -5.0, 0/1: +5.0, 100/0: -0.5"
    assert cells[3] == "0.732 +- 0.128" and cells[4] == "0.733 +- 0.153"
    assert cells[9:] == ["2 of 3", "1 of 3", "0 of 3", "0 / 2 / 1"]  # within a point; entropy; Distinct-2; pass@8
    # checkpoints: only the 0/0 pair has them; means 0.875 vs 0.85
    ckpt = next(line for line in text.splitlines() if line.startswith("| tools | mean of checkpoints |"))
    assert "| 1 |" in ckpt and "0/0: +2.5" in ckpt
    # one run's movement across its checkpoints: std of (0.8, 0.9) = 7.07 points, of (0.9, 0.85) = 3.54
    assert "vanilla: accuracy across the checkpoints [500, 600] of one run moves by 7.1 points" in text
    assert "tools: accuracy across the checkpoints [500, 600] of one run moves by 3.5 points" in text


def test_set_changes_every_run_over_the_methods_own_values(benchmarks_on_path):
    import testbed_study

    method = testbed_study.Method({"token_clip": "kl_cov", "kl_target": 0.1})
    assert testbed_study.run_config(method, {"kl_target": 0.3, "learning_rate": 3e-4}) == {
        "token_clip": "kl_cov",
        "kl_target": 0.3,
        "learning_rate": 3e-4,
    }
    assert testbed_study.run_config(testbed_study.Method(), {"kl_target": 0.3}) == {"kl_target": 0.3}


def test_paired_names_a_set_study_and_borrows_the_plain_vanilla(benchmarks_on_path):
    import testbed_study

    plain = {"runs": {"vanilla": [_run(0, 0.90)], "tools": [_run(0, 0.80)]}}
    variant = {"set": {"kl_target": 0.3}, "runs": {"tools": [_run(0, 0.95)]}}  # --methods tools --set kl_target=0.3
    text = testbed_study.paired([plain, variant])
    assert "| tools | final | 1 | 0.800 +- 0.000 | 0.900 +- 0.000 | -10.0 +- 0.0 | -10.0 [-10.0, -10.0] over 1" in text
    assert "| tools [kl_target=0.3] | final | 1 | 0.950 +- 0.000 | 0.900 +- 0.000 | +5.0 +- 0.0 | +5.0" in text
    assert "| hurts (exploratory) |" in text
    assert "tools [kl_target=0.3]: paired with the vanilla runs of the study without --set" in text
    own = {
        "set": {"learning_rate": 1e-3},
        "runs": {"vanilla": [_run(0, 0.5, checkpoints={500: 0.4, 600: 0.5})], "tools": [_run(0, 0.6)]},
    }
    text = testbed_study.paired([plain, own])  # a --set study with its own vanilla pairs with it
    assert "| tools [learning_rate=0.001] | final | 1 | 0.600 +- 0.000 | 0.500 +- 0.000 | +10.0 +- 0.0 |" in text
    assert "| helps (exploratory) |" in text
    assert "without --set" not in text
    # its vanilla's movement between checkpoints is reported under its settings (std of 0.4, 0.5: 7.1 points)
    assert "vanilla [learning_rate=0.001]: accuracy across the checkpoints [500, 600] of one run moves by 7.1" in text


def _evidence_run(arm, w, g, distinct, pass1):
    return {
        "arm": arm,
        "warm_start": w,
        "seed": g,
        "split": "test",
        "eval": {
            "pass_at_k": {"1": pass1, "64": 1.0},
            "distinct_correct": distinct,
            "greedy_accuracy": pass1,
        },
        "seconds": 1.0,
    }


def test_evidence_report_pairs_runs_and_gives_verdicts(benchmarks_on_path, tmp_path):
    import evidence_study

    # 6 warm starts x 2 seeds: the default tools keep +2 distinct right answers on every run (helps), cost 5 points
    # of pass@1 on every run (hurts); KL-Cov k=2e-3 has no runs yet (no row).
    for w in range(6):
        for g in range(2):
            for arm, distinct, pass1 in (("vanilla", 2.0 + w, 0.9), ("default tools", 4.0 + w, 0.85)):
                path = evidence_study.run_path(tmp_path, "test", arm, w, g)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(_evidence_run(arm, w, g, distinct, pass1)))
    text = evidence_study.report(tmp_path, "forks_tools", "test", range(6), range(2))
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in text.splitlines()}
    distinct = rows[("default tools", "distinct right answers / prompt")]
    assert "+2.00 [+2.00, +2.00] | helps | 12 (6) |" in distinct
    assert "-5.0 [-5.0, -5.0] | hurts | 12 (6) |" in rows[("default tools", "pass@1 (points)")]
    assert not any(key[0] == "KL-Cov k=2e-3" for key in rows)
    assert "Validation prompts" not in text and "vanilla (12 runs)" in text


def test_evidence_verdicts_against_a_knob_and_the_collapse_lead(benchmarks_on_path, tmp_path):
    import evidence_study

    # the default tools against "KL-Cov k=2e-3" (as --against pairs them): +1 distinct on every run, the same pass@1
    for w in range(6):
        for g in range(2):
            for arm, distinct in (("vanilla", 2.0), ("default tools", 4.0), ("KL-Cov k=2e-3", 3.0)):
                path = evidence_study.run_path(tmp_path, "test", arm, w, g)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(_evidence_run(arm, w, g, distinct, 0.8)))
    rows = evidence_study.verdict_rows(tmp_path, "test", range(6), range(2), baseline="KL-Cov k=2e-3")
    assert rows[0].startswith("| tool | metric | setting | arm - KL-Cov k=2e-3")
    tools = [r for r in rows if r.startswith("| default tools | more distinct")]
    assert len(tools) == 1 and "+1.00 [+1.00, +1.00] | helps |" in tools[0]
    assert not any(r.startswith("| KL-Cov k=2e-3 |") for r in rows)  # the baseline is not paired with itself
    # a proxy-gold gap: less is better, so a smaller gap helps; the training reward gets no verdict
    from grpo_lab.stats import Interval

    interval = Interval(-0.2, -0.3, -0.1, warm_starts=6, runs=12)
    assert evidence_study.judged(interval, "gap") == "helps"
    assert evidence_study.judged(interval, "greedy_gold") == "hurts"
    assert "no verdict" in evidence_study.judged(interval, "proxy")
    # the collapse: the first checkpoint after the peak under half of it; the alarm's lead in words
    gold = [[25, 0.30], [50, 0.40], [75, 0.25], [100, 0.15], [125, 0.30]]
    assert evidence_study.collapse_step(gold) == 100
    assert evidence_study.collapse_step([[25, 0.3], [50, 0.4], [75, 0.35]]) is None
    assert evidence_study.when(22) == "22 steps before" and evidence_study.when(-36) == "36 steps after"


def test_evidence_picker_lines_name_the_winner_per_warm_start(benchmarks_on_path, tmp_path):
    import evidence_study

    path = evidence_study.picker_path(tmp_path)
    path.parent.mkdir(parents=True)
    rankings = {
        0: [["none", 0.98], ["best_worst", 0.93]],
        1: [["best_worst", 0.95], ["none", 0.90]],
        2: [["none", 0.97], ["best_worst", 0.90]],
        7: [["best_of_n", 0.99], ["none", 0.5]],  # not asked for: left out
    }
    path.write_text(json.dumps(rankings))
    lines = evidence_study.picker_lines(tmp_path, [0, 1, 2])
    assert "first choice none on 2 of 3 warm starts" in lines[1]
    assert lines[2:] == [
        "- warm start 0: none 0.980, best_worst 0.930",
        "- warm start 1: best_worst 0.950, none 0.900",
        "- warm start 2: none 0.970, best_worst 0.900",
    ]
    assert evidence_study.picker_lines(tmp_path / "elsewhere", [0]) == []


def test_evidence_verdicts_list_an_arm_shared_by_two_studies_once(benchmarks_on_path, tmp_path, monkeypatch):
    import evidence_study

    shared = evidence_study.Arm(reward="gold")
    two = {"a": {"clean": shared, "other": evidence_study.Arm()}, "b": {"clean": shared}}
    monkeypatch.setattr(evidence_study, "studies", lambda: two)
    monkeypatch.setattr(evidence_study, "TESTBED_OF", {"a": "length_bias", "b": "length_bias"})
    for arm in ("vanilla", "clean", "other"):
        for w in range(6):
            for g in range(2):
                run = {"eval": {"greedy_gold": 0.5 if arm != "vanilla" else 0.0, "gap": 0.1 * w}}
                path = evidence_study.run_path(tmp_path, "test", arm, w, g, "length_bias")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(run))
    rows = evidence_study.verdict_rows(tmp_path, "test", range(6), range(2))
    metrics = len(evidence_study.HEADLINE["length_bias"])
    assert sum(row.startswith("| clean |") for row in rows) == metrics
    assert sum(row.startswith("| other |") for row in rows) == metrics


def _hack_run(testbed, arm, w, g, *, hack_at):
    """A saved hack-study run: a generation batch every 4 steps; gold rises to its peak at ``hack_at`` (or all run,
    ``None``) and falls to 0.05 after it, completion length rising 10% per batch from ``hack_at`` on; held-out gold
    every 25 steps follows the same curve."""
    steps = list(range(1, 301, 4))

    def gold(step):
        if hack_at is None or step <= hack_at:
            return 0.3 + 0.3 * step / (hack_at or 300)
        return max(0.05, 0.6 - 0.02 * (step - hack_at))

    def length(step):
        return 3.0 if hack_at is None or step < hack_at else 3.0 * 1.1 ** ((step - hack_at) // 4 + 1)

    log = {str(s): {"completions/mean_length": length(s), "diversity/prompt_info": 2.0, "diversity/repetition": 0.0}
           for s in steps}  # fmt: skip
    heldout = {str(s): {split: {"gold": gold(s), "proxy": 1.0} for split in ("validation", "test")}
               for s in range(0, 301, 25)}  # fmt: skip
    return {
        "testbed": testbed, "arm": arm, "warm_start": w, "seed": g, "steps_log": log,
        "train_gold": {str(s): gold(s) for s in steps}, "heldout": heldout,
        "old_alarm_steps": [hack_at + 60] if hack_at is not None else [], "rollback": None, "final_heldout": None,
    }  # fmt: skip


def test_hack_report_judges_alarms_lead_times_and_rollback_by_hand(benchmarks_on_path, tmp_path):
    """Vanilla hacks at step 101 on every run (its length grows 10% a batch from there), clean runs never: the
    detector (length +25%, window 1, warm-up 1) fires on the third batch of the hack (1.1^3 = 1.331 at step 109),
    never on a clean run; gold's peak, smoothed over 5 batches, is at step 93 (the fall after 101 pulls the centred
    means at 97 and 101 below 93's: 0.5696 and 0.5448 < 0.576), so the alarm is 16 steps after it and the old one 68;
    the onset is step 97 (the last batch at length 3) and rollback returns to checkpoint 75."""
    import hack_report
    import hack_study

    for w in range(3):
        for g in range(2):
            for arm, hack_at in (("vanilla", 101), ("clean", None)):
                path = hack_study.run_path(tmp_path, "length_bias", arm, w, g)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(_hack_run("length_bias", arm, w, g, hack_at=hack_at)))
    runs = hack_report.load(tmp_path)
    settings = {"window": 1, "warmup": 1, "length": 0.25, "prompt_info": None, "repetition": None}
    judged = hack_report.judge(runs, settings, "test", ("length_bias",))["length_bias"]
    assert {w: hits for w, hits in judged["hits"].items()} == {0: [1.0, 1.0], 1: [1.0, 1.0], 2: [1.0, 1.0]}
    assert judged["lags"] == [16] * 6
    assert judged["falses"] == {0: [0.0, 0.0], 1: [0.0, 0.0], 2: [0.0, 0.0]}  # the clean runs held gold
    assert judged["partial"] == {} and judged["tools_hacked"] == {}
    assert [hack_report.outcome(runs[("length_bias", arm)][(0, 0)], "test") for arm in ("vanilla", "clean")] == [
        "hacked",
        "held",
    ]
    old = hack_report.judge(runs, None, "test", ("length_bias",))["length_bias"]
    assert old["lags"] == [68] * 6
    run = runs[("length_bias", "vanilla")][(0, 0)]
    alarm = hack_report.replay(run, settings)
    assert (alarm.step, alarm.onset) == (109, 97)  # the last batch before the length rose
    assert hack_report.rollback_gold(run, alarm.onset, "test") == pytest.approx(0.3 + 0.3 * 75 / 101)
    text = hack_report.report(tmp_path, settings)
    row = "| length_bias | detector | 6/6 (1.00 [1.00, 1.00]) | 0/6 (0.00 [0.00, 0.00]) | - | - | +16 (+16 to +16) |"
    assert row in text


def test_hack_report_counts_rises_and_lists_held_runs_that_alarmed(benchmarks_on_path, tmp_path):
    """By hand: a vanilla run whose held-out gold climbs 0.3 -> 0.6 then falls to 0.05 rose first and hacked; one
    that hacks from step 1 (gold never above step 0's) hacked without rising. A clean run whose length rises 10% a
    batch from step 201 while its gold keeps climbing held gold and alarmed: the list names it, with its proxy - gold
    gap (reward 0.2 above gold from step 201: 0.0 over steps 1-20, 0.2 over the last 20)."""
    import hack_report

    risen = _hack_run("restate_bias", "vanilla", 0, 0, hack_at=101)
    at_once = _hack_run("restate_bias", "vanilla", 1, 0, hack_at=101)
    at_once["heldout"] = {s: {k: {"gold": 0.3 if s == "0" else 0.05, "proxy": 1.0} for k in v}
                          for s, v in at_once["heldout"].items()}  # fmt: skip
    assert hack_report.rose_then_hacked(risen, "test") and not hack_report.rose_then_hacked(at_once, "test")
    held = _hack_run("restate_bias", "clean", 0, 0, hack_at=None)
    for step, record in held["steps_log"].items():
        record["completions/mean_length"] = 3.0 * 1.1 ** max(0, (int(step) - 201) // 4 + 1)
        record["reward"] = held["train_gold"][step] + (0.2 if int(step) >= 201 else 0.0)
    assert hack_report.gap(held, range(1, 21)) == pytest.approx(0.0)
    assert hack_report.gap(held, range(278, 298)) == pytest.approx(0.2)
    runs = {("restate_bias", "vanilla"): {(0, 0): risen, (1, 0): at_once}, ("restate_bias", "clean"): {(0, 0): held}}
    settings = {"window": 1, "warmup": 1, "length": 0.25, "prompt_info": None, "repetition": None}
    lines = hack_report.false_alarm_lines(runs, settings)
    assert lines[0] == "Runs that held gold and alarmed:" and len(lines) == 2
    assert lines[1].startswith("- restate_bias clean w0-g0: length at step 209; proxy - gold gap 0.000")
    assert lines[1].endswith("-> 0.200 (last 20)")
    rise = hack_report.rise_lines(runs)
    assert "| restate_bias | 2/2 | 1/2 |" in rise


def test_signal_report_separates_the_families_and_acts_on_independent_signals_by_hand(benchmarks_on_path, tmp_path):
    """Hand-built runs: a hack from step 101 whose length grows 10% a batch and whose audit disagreement jumps from
    0.125 to 0.625 two batches later; a healthy run that lengthens the same way (no hack: gold keeps rising, the audit
    stays at 0.125). The shape family alarms on both (a false alarm on the healthy run); the audit alarms on the hack
    only; the acting rule acts at the audit's alarm with the length alarm's earlier onset, never on the healthy run."""
    import hack_study
    import signal_report

    hacked = _hack_run("carry_bias", "vanilla", 0, 0, hack_at=101)
    healthy = _hack_run("scratchpad", "vanilla", 0, 0, hack_at=None)
    for step, record in healthy["steps_log"].items():
        record["completions/mean_length"] = 3.0 * 1.1 ** max(0, (int(step) - 101) // 4 + 1)
    for run in (hacked, healthy):
        for step, record in run["steps_log"].items():
            # binary fractions: the trailing means of a constant are then exactly constant (onset fraction 0 here)
            record["audit/disagreement"] = 0.625 if run is hacked and int(step) >= 109 else 0.125
            record["reward"] = 1.0
        path = hack_study.run_path(tmp_path, run["testbed"], "vanilla", 0, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run))
    s = {"window": 1, "warmup": 1, "onset": 0.0, "length": 0.25, "prompt_info": None, "repetition": None,
         "audit": 0.2, "validation": None, "gate": None}  # fmt: skip
    shape_hack, shape_healthy = (signal_report.replay(r, "shape", s) for r in (hacked, healthy))
    assert shape_hack.step == 109 and shape_healthy.step == 109  # shape cannot tell them apart
    assert signal_report.replay(hacked, "audit", s).step == 109 and signal_report.replay(healthy, "audit", s) is None
    acting = signal_report.replay(hacked, "acting", s)
    assert (acting.step, acting.onset) == (109, 97)  # the length alarm's onset (the audit's is 105)
    assert signal_report.replay(healthy, "acting", s) is None
    lines = signal_report.table(signal_report.hr.load(tmp_path), s)
    assert "| scratchpad (healthy) | shape | - | - | 1/1 |" in "\n".join(lines)
    assert "| scratchpad (healthy) | acting | - | - | 0/1 | 100% (100%) |" in lines
    # the audit's sweep: gold peaks at 93 (hack_report's test); the trailing mean over w batches of 0.125 ... 0.625
    # reaches 0.125 + rise at step 109 (w 2: 0.375), 109 / 113 (w 3: 0.292 then 0.458), 109 / 113 (w 4: 0.25, 0.375),
    # 113 / 117 / 121 (w 8: 0.25, 0.3125, 0.375)
    rows = signal_report.audit_rise_table(signal_report.hr.load(tmp_path), s)
    expected = {(0.08, 8): "+20", (0.15, 3): "+16", (0.15, 8): "+24", (0.2, 2): "+16", (0.2, 3): "+20",
                (0.2, 4): "+20", (0.2, 8): "+28"}  # fmt: skip
    for (rise, window), lag in expected.items():
        cells = f"- [0/0], - [0/0], - [0/0], - [0/0], {lag} [1/1], - [0/0]"
        assert f"| {rise:g} | {window} | {cells} | 0/0 | 0/1 | 0/0 | 0/0 |" in rows
    # the CUSUM's sweep: reference 0.125, so S = 0.5 - k at step 109 and 1 - 2k at 113
    rows = signal_report.audit_cusum_table(signal_report.hr.load(tmp_path))
    for (slack, limit), lag in {
        (0.02, 0.15): "+16",
        (0.02, 0.6): "+20",
        (0.06, 0.4): "+16",
        (0.06, 0.6): "+20",
    }.items():
        cells = f"- [0/0], - [0/0], - [0/0], - [0/0], {lag} [1/1], - [0/0]"
        assert f"| {slack:g} | {limit:g} | {cells} | 0/0 | 0/1 | 0/0 | 0/0 |" in rows
    steps = torch.arange(1, 14 * 4, 4)
    spike = torch.tensor([0.0] * 8 + [0.5] + [0.0] * 5, dtype=torch.float64)  # a lone spike: S = 0.46, then falls
    persistent = torch.tensor([0.0] * 8 + [0.2] * 6, dtype=torch.float64)  # S = 0.16, 0.32, 0.48, 0.64 (step 45)
    assert signal_report.cusum_alarm(steps, spike, slack=0.04, limit=0.6) is None
    assert signal_report.cusum_alarm(steps, persistent, slack=0.04, limit=0.6) == 45
    # the runs log neither audit/inversion nor audit/overpaid: the stricter reads' sweeps have no run to count
    for arm in signal_report.STRICTER:
        assert all(row.endswith("| 0/0 | 0/0 | 0/0 | 0/0 |") for row in signal_report.audit_rise_table(
            signal_report.hr.load(tmp_path), s, arm=arm)[2:])  # fmt: skip
