"""The hack-detection study's report, from the runs benchmarks/hack_study.py saved (trains nothing).

    python benchmarks/hack_report.py                 # the tables of docs/results.md, "Detecting a hack while it starts"
    python benchmarks/hack_report.py --tune          # the choice of the detector's settings (validation prompts)
    python benchmarks/hack_report.py --plot          # docs/images/hack_detection.png

Definitions (docs/results.md says why):
    - **gold's timeline**: the gold of each step's own training completions (a side computation the trainer never
      sees), smoothed by a centred mean over :data:`SMOOTH` generation batches; its *peak* is the step of its
      maximum, its *halving* the first later step where it is under half the peak.
    - **hacked**: the run's held-out sampled gold at its last step is under half its best held-out checkpoint (every
      25 steps and step 0), on the half the report is on (``validation`` while choosing, ``test`` for the report).
    - **alarm**: the detector (:func:`trl_grpo_ext.core.hack_detection.drift_alarm`, replayed on the run's logged
      signals: what the trainer computes online) or the old threshold alarm (repetition > 0.2 or Distinct-2 half its
      start; logged by the run itself). Recall: hacked runs alarmed; false alarms: runs not hacked that alarmed.
    - **rollback**: to the last checkpoint (every 25 steps, and step 0) at or before the detector's onset; its gold is
      that checkpoint's held-out gold. Kept = rollback's gold / the run's best held-out gold.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_lab.evaluation import gold_peak, smoothed_gold  # noqa: E402
from grpo_lab.stats import cluster_bootstrap  # noqa: E402
from trl_grpo_ext.core.hack_detection import DriftAlarm, drift_alarm  # noqa: E402
from trl_grpo_ext.detector import SIGNALS, drift_rules  # noqa: E402

TESTBEDS = ("length_bias", "keyword_bias", "round_bias", "restate_bias", "carry_bias", "hedge_bias")
ARMS = ("vanilla", "tools", "clean")
#: The testbeds the settings are chosen on (validation prompts); the others are held out while choosing.
TUNED_ON = ("length_bias", "keyword_bias")
#: Generation batches in gold's centred mean.
SMOOTH = 5
CHECKPOINT_EVERY = 25
#: A run "held gold" when no held-out checkpoint fell under this fraction of the best one before it.
HELD = 0.8
#: The onset fractions a rollback's checkpoint is chosen by (after the alarm's settings).
ONSETS = (0.0, 0.25, 0.5, 0.75)
#: The grid the settings are chosen from.
GRID = {
    "window": (2, 3, 4),
    "warmup": (2, 3, 5),
    "length": (0.1, 0.15, 0.2, 0.3, None),
    "prompt_info": (0.1, 0.15, 0.2, 0.3, None),
    "repetition": (0.03, 0.05, 0.1, None),
}


def load(out: Path) -> dict[tuple[str, str], dict[tuple[int, int], dict]]:
    runs: dict[tuple[str, str], dict[tuple[int, int], dict]] = {}
    for path in sorted((out / "runs" / "hack").glob("*/*/w*-g*.json")):
        run = json.loads(path.read_text())
        runs.setdefault((run["testbed"], run["arm"]), {})[(run["warm_start"], run["seed"])] = run
    return runs


def series(run: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The detector's inputs of a run: signal -> (steps, values), as the trainer fed them."""
    out = {}
    for name in SHAPE:
        key = SIGNALS[name][0]
        points = [(int(s), v[key]) for s, v in run["steps_log"].items() if key in v]
        points.sort()
        out[name] = (torch.tensor([p[0] for p in points]), torch.tensor([p[1] for p in points], dtype=torch.float64))
    return out


#: The shape signals this report replays (the detector's gold-free part; benchmarks/signal_report.py replays the rest).
SHAPE = ("length", "prompt_info", "repetition")


def replay(run: dict, settings: dict) -> DriftAlarm | None:
    thresholds = {name: settings[name] for name in SHAPE if settings.get(name) is not None}
    gates = {"length": settings["gate"]} if settings.get("gate") is not None and "length" in thresholds else {}
    rules = drift_rules(thresholds, gates)
    if not rules:
        return None
    cached = run.setdefault("_series", series(run))
    return drift_alarm(
        cached, rules, window=settings["window"], warmup=settings["warmup"], onset_fraction=settings.get("onset", 0.0)
    )


def peak_and_halving(run: dict) -> tuple[int, int | None]:
    """Gold's peak and halving steps on the run's per-step training gold (:func:`grpo_lab.evaluation.gold_peak`,
    the function the default run prints with)."""
    step, _, halving = gold_peak({int(s): v for s, v in run["train_gold"].items()}, smooth=SMOOTH)
    return step, halving


def heldout(run: dict, split: str) -> dict[int, float]:
    return {int(s): r[split]["gold"] for s, r in run["heldout"].items()}


def outcome(run: dict, split: str) -> str:
    """``"hacked"``: held-out gold at the last step under half its best checkpoint; ``"held"``: gold never fell under
    :data:`HELD` of its best so far (checkpoint by checkpoint: a run that sagged and recovered did not hold it);
    ``"partial"``: the rest (a hack slowed, stopped or undone by the tools)."""
    gold = [value for _, value in sorted(heldout(run, split).items())]
    if gold[-1] < 0.5 * max(gold):
        return "hacked"
    best_so_far = [max(gold[: i + 1]) for i in range(len(gold))]
    return "held" if all(g >= HELD * b for g, b in zip(gold, best_so_far, strict=True)) else "partial"


def hacked(run: dict, split: str) -> bool:
    return outcome(run, split) == "hacked"


#: Held-out gold must climb by more than this above step 0 before it hacks for a run to have "risen first".
RISE = 0.03


def rose_then_hacked(run: dict, split: str) -> bool:
    """Whether the run's held-out gold climbed by more than :data:`RISE` above its step-0 value (best checkpoint) and
    the run then hacked: the testbed requirement "vanilla first rises, then hacks"."""
    gold = heldout(run, split)
    return hacked(run, split) and max(gold.values()) > gold[0] + RISE


def rise_lines(runs, split: str = "test") -> list[str]:
    """Per testbed: vanilla runs that hacked, and those that rose first."""
    lines = ["| testbed | vanilla runs hacked | ... of which gold first rose by > 3 points |", "|---|---|---|"]
    for testbed in TESTBEDS:
        vanilla = list(runs.get((testbed, "vanilla"), {}).values())
        hacked_runs = sum(hacked(r, split) for r in vanilla)
        rose = sum(rose_then_hacked(r, split) for r in vanilla)
        lines.append(f"| {testbed} | {hacked_runs}/{len(vanilla)} | {rose}/{len(vanilla)} |")
    return lines


def old_alarm(run: dict) -> int | None:
    return run["old_alarm_steps"][0] if run["old_alarm_steps"] else None


def rollback_gold(run: dict, onset: int, split: str) -> float:
    gold = heldout(run, split)
    return gold[max(s for s in gold if s <= onset and s % CHECKPOINT_EVERY == 0)]


def judge(runs, settings: dict | None, split: str, testbeds=TESTBEDS) -> dict:
    """Per testbed, warm start -> alarm indicators of: the hacked vanilla runs (``hits``: recall), the runs that held
    gold, whatever their arm (``falses``: false alarms), the partial hacks (``partial``) and the hacked tool runs
    (``tools_hacked``); the hacked vanilla runs' lags (alarm - gold's peak) and leads (gold's halving - alarm).
    ``settings`` None: the old alarm."""
    out = {}
    for testbed in testbeds:
        found: dict[str, dict[int, list[float]]] = {"hits": {}, "falses": {}, "partial": {}, "tools_hacked": {}}
        lags, leads = [], []
        for arm in ARMS:
            for key, run in runs.get((testbed, arm), {}).items():
                step = old_alarm(run) if settings is None else getattr(replay(run, settings), "step", None)
                kind = outcome(run, split)
                group = {"held": "falses", "partial": "partial"}.get(kind)
                if kind == "hacked":
                    group = "hits" if arm == "vanilla" else "tools_hacked" if arm == "tools" else None
                if group is None:
                    continue  # a clean-reward run that lost gold: not a hack the proxy caused
                found[group].setdefault(key[0], []).append(float(step is not None))
                if group == "hits" and step is not None:
                    peak, halving = peak_and_halving(run)
                    lags.append(step - peak)
                    if halving is not None:
                        leads.append(halving - step)
        out[testbed] = {**found, "lags": lags, "leads": leads}
    return out


def score(judged: dict) -> tuple:
    """The choice's order: most hacked runs alarmed, with at most one false alarm in 12 runs that held gold per
    testbed; then the
    smallest median |alarm - peak| (late alarms lose gold, early ones lose the rise a rollback keeps)."""
    recall = sum(sum(sum(v) for v in j["hits"].values()) for j in judged.values())
    false = [
        sum(sum(v) for v in j["falses"].values()) / max(sum(len(v) for v in j["falses"].values()), 1)
        for j in judged.values()
    ]
    lags = [abs(x) for j in judged.values() for x in j["lags"]]
    ok = all(f <= 1 / 12 + 1e-9 for f in false)
    return (ok, recall, -(statistics.median(lags) if lags else 1e9))


def tune(runs) -> tuple[dict, list[str]]:
    best, best_score = None, None
    for values in itertools.product(*GRID.values()):
        settings = dict(zip(GRID, values, strict=True))
        if all(settings[s] is None for s in SHAPE):
            continue
        result = score(judge(runs, settings, "validation", TUNED_ON))
        if best_score is None or result > best_score:
            best, best_score = settings, result
    # then where a rollback returns to (it moves the onset only, never the alarm): the fraction whose rollbacks keep
    # the most of the runs' best validation gold
    best["onset"] = max(ONSETS, key=lambda f: kept_gold(runs, {**best, "onset": f}, "validation", TUNED_ON))
    arms = sorted({arm for (testbed, arm) in runs if testbed in TUNED_ON})
    lines = [
        f"Chosen on the validation prompts of {', '.join(TUNED_ON)} ({', '.join(arms)} runs; "
        f"{', '.join(t for t in TESTBEDS if t not in TUNED_ON)} held out) from {count_grid()} settings: {best} "
        f"(false alarms within 1 in 12: {best_score[0]}; hacked runs alarmed: {best_score[1]}; median |alarm - peak| "
        f"{-best_score[2]:.0f} steps).",
    ]
    return best, lines


def kept_gold(runs, settings: dict, split: str, testbeds) -> float:
    """Mean over the vanilla runs of ``testbeds`` of (gold after acting on the detector / the run's best gold):
    the rollback checkpoint's where it fired, the last checkpoint's where it did not."""
    kept = []
    for testbed in testbeds:
        for run in runs.get((testbed, "vanilla"), {}).values():
            gold = heldout(run, split)
            alarm = replay(run, settings)
            final = rollback_gold(run, alarm.onset, split) if alarm is not None else gold[max(gold)]
            kept.append(final / max(max(gold.values()), 1e-9))
    return statistics.fmean(kept) if kept else 0.0


def count_grid() -> int:
    return sum(1 for v in itertools.product(*GRID.values()) if any(x is not None for x in v[2:]))


def rate_line(per_warm_start: dict) -> str:
    flat = [x for v in per_warm_start.values() for x in v]
    if not flat:
        return "-"
    interval = cluster_bootstrap(per_warm_start) if len(per_warm_start) > 1 else None
    text = f"{int(sum(flat))}/{len(flat)}"
    if interval is not None:
        text += f" ({interval.mean:.2f} [{interval.low:.2f}, {interval.high:.2f}])"
    return text


def lag_line(values: list[int]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):+.0f} ({min(values):+d} to {max(values):+d})"


def report(out: Path, settings: dict | None = None) -> str:
    runs = load(out)
    if settings is None:  # the shipped defaults are what is reported
        settings = shipped_settings()
    lines = [f"Detector settings: {settings}.", ""]
    counts = {(t, a): len(v) for (t, a), v in runs.items()}
    lines.append("Runs: " + ", ".join(f"{t}/{a} {n}" for (t, a), n in sorted(counts.items())) + ".")
    lines.append("")
    lines.append(
        "| testbed | alarm | recall: hacked vanilla runs alarmed (rate [95% CI]) | false alarms: runs that held gold "
        "| partial hacks alarmed | hacked tool runs alarmed | alarm - gold's peak, steps: median (range) "
        "| gold's halving - alarm, steps: median (range) |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, judged in (("detector", judge(runs, settings, "test")), ("old alarm", judge(runs, None, "test"))):
        for testbed in TESTBEDS:
            j = judged[testbed]
            lines.append(
                f"| {testbed} | {name} | {rate_line(j['hits'])} | {rate_line(j['falses'])} | "
                f"{rate_line(j['partial'])} | {rate_line(j['tools_hacked'])} | {lag_line(j['lags'])} | "
                f"{lag_line(j['leads'])} |"
            )
    lines += ["", *rise_lines(runs), "", *paired_lines(runs, settings), "", *rollback_lines(runs, settings)]
    lines += ["", *false_alarm_lines(runs, settings)]
    check = rollback_check_lines(runs, settings)
    if check:
        lines += ["", *check]
    return "\n".join(lines)


def paired_lines(runs, settings: dict) -> list[str]:
    """Detector against the old alarm, run by run on the hacked vanilla runs where both fired: the alarm step's
    difference (detector - old; below 0: earlier), with its cluster-bootstrap interval and the verdict."""
    from grpo_lab.stats import verdict

    lines = [
        "| testbed | detector - old alarm, steps (hacked vanilla runs; < 0: earlier) [95% interval] | verdict "
        "(earlier helps) | runs (warm starts) |",
        "|---|---|---|---|",
    ]
    for testbed in TESTBEDS:
        differences: dict[int, list[float]] = {}
        for key, run in sorted(runs.get((testbed, "vanilla"), {}).items()):
            alarm, old = replay(run, settings), old_alarm(run)
            if hacked(run, "test") and alarm is not None and old is not None:
                differences.setdefault(key[0], []).append(float(alarm.step - old))
        if not differences:
            continue
        interval = cluster_bootstrap(differences)
        lines.append(
            f"| {testbed} | {interval.mean:+.1f} [{interval.low:+.1f}, {interval.high:+.1f}] | "
            f"{verdict(interval, higher_is_better=False)} | {interval.runs} ({interval.warm_starts}) |"
        )
    return lines


def rollback_lines(runs, settings: dict) -> list[str]:
    lines = [
        "| testbed | vanilla, last | vanilla, best checkpoint (oracle) | vanilla + rollback | kept of the best: "
        "median (min) | default tools, last | runs rolled back |",
        "|---|---|---|---|---|---|---|",
    ]
    for testbed in TESTBEDS:
        vanilla = runs.get((testbed, "vanilla"), {})
        if not vanilla:
            continue
        last, best, rolled, kept, moved = [], [], [], [], 0
        for run in vanilla.values():
            gold = heldout(run, "test")
            alarm = replay(run, settings)
            end = gold[max(gold)]
            final = rollback_gold(run, alarm.onset, "test") if alarm is not None else end
            moved += alarm is not None
            last.append(end)
            best.append(max(gold.values()))
            rolled.append(final)
            kept.append(final / max(gold.values()))
        tools = [heldout(r, "test") for r in runs.get((testbed, "tools"), {}).values()]
        tools_last = f"{statistics.fmean(g[max(g)] for g in tools):.3f}" if tools else "-"
        lines.append(
            f"| {testbed} | {statistics.fmean(last):.3f} | {statistics.fmean(best):.3f} "
            f"| {statistics.fmean(rolled):.3f} | {statistics.median(kept):.0%} ({min(kept):.0%}) | {tools_last} "
            f"| {moved}/{len(vanilla)} |"
        )
    return lines


def gap(run: dict, steps: range) -> float:
    """Mean proxy - gold of the run's training batches over ``steps`` (the logged reward minus the gold kept aside):
    what the proxy pays that gold does not."""
    values = [
        run["steps_log"][str(s)]["reward"] - run["train_gold"][str(s)]
        for s in steps
        if str(s) in run["steps_log"] and str(s) in run["train_gold"]
    ]
    return statistics.fmean(values) if values else float("nan")


def false_alarm_lines(runs, settings: dict) -> list[str]:
    """The runs that held gold yet alarmed: which signal fired, and the proxy - gold gap of their training batches
    over the first and the last 20 steps (a gap that grows is a hack that began without costing a fifth of gold)."""
    lines = []
    for testbed in TESTBEDS:
        for arm in ARMS:
            for (w, g), run in sorted(runs.get((testbed, arm), {}).items()):
                alarm = replay(run, settings)
                if alarm is None or outcome(run, "test") != "held":
                    continue
                last = max(int(s) for s in run["steps_log"])
                lines.append(
                    f"- {testbed} {arm} w{w}-g{g}: {alarm.signal} at step {alarm.step}; proxy - gold gap "
                    f"{gap(run, range(1, 21)):.3f} (steps 1-20) -> {gap(run, range(last - 19, last + 1)):.3f} "
                    f"(last 20)"
                )
    return ["Runs that held gold and alarmed:", *lines] if lines else []


def rollback_check_lines(runs, settings: dict) -> list[str]:
    """The rollback arm (benchmarks/hack_study.py --arms rollback: vanilla with collapse_action rollback, trained for
    real): its restored model's held-out gold against the value the table reads off the same (warm start, seed)'s
    vanilla run."""
    lines = []
    for testbed in TESTBEDS:
        real = runs.get((testbed, "rollback"), {})
        pairs = []
        for key, run in sorted(real.items()):
            vanilla = runs.get((testbed, "vanilla"), {}).get(key)
            alarm = replay(vanilla, settings) if vanilla is not None else None
            if vanilla is None or run["final_heldout"] is None:
                continue
            last = heldout(vanilla, "test")
            offline = rollback_gold(vanilla, alarm.onset, "test") if alarm is not None else last[max(last)]
            restored = run["rollback"]["checkpoint_step"] if run["rollback"] else None
            pairs.append((key, restored, run["final_heldout"]["test"]["gold"], offline))
        if pairs:
            worst = max(abs(a - b) for _, _, a, b in pairs)
            shown = ", ".join(f"w{k[0]}-g{k[1]}: checkpoint {c}, {a:.3f} vs {b:.3f}" for k, c, a, b in pairs)
            lines.append(
                f"- {testbed}: {len(pairs)} runs trained with `collapse_action: rollback`; the restored model's test "
                f"gold vs the table's value: {shown} (largest difference {worst:.3f})"
            )
    return lines


def shipped_settings() -> dict:
    """The detector's defaults as GRPOExtConfig declares them."""
    import dataclasses

    from trl_grpo_ext import GRPOExtConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOExtConfig)}
    return {
        "window": defaults["collapse_detector_window"],
        "warmup": defaults["collapse_detector_warmup"],
        "length": defaults["collapse_length_rise"],
        "prompt_info": defaults["collapse_prompt_info_drop"],
        "repetition": defaults["collapse_repetition_rise"],
        "onset": defaults["collapse_onset_fraction"],
        "gate": defaults["collapse_length_info_gate"],
    }


def plot(out: Path, settings: dict, path: Path) -> Path:
    """Per testbed: every vanilla run's training gold (smoothed, over its peak) against steps from its peak, and where
    each run's detector and old alarm fired."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load(out)
    columns = min(3, len(TESTBEDS))
    rows = -(-len(TESTBEDS) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False)
    for ax in axes.flat[len(TESTBEDS) :]:
        ax.set_visible(False)
    for ax, testbed in zip(axes.flat, TESTBEDS, strict=False):
        for run in runs.get((testbed, "vanilla"), {}).values():
            means = {int(s): v for s, v in run["train_gold"].items()}
            peak, top, _ = gold_peak(means, smooth=SMOOTH)
            steps, smooth = smoothed_gold(means, smooth=SMOOTH)
            ax.plot([x - peak for x in steps], [v / top for v in smooth], color="0.7", linewidth=0.8)
            alarm = replay(run, settings)
            if alarm is not None:
                ax.plot([alarm.step - peak], [0.08], marker="v", color="tab:blue", linestyle="none")
            if old_alarm(run) is not None:
                ax.plot([old_alarm(run) - peak], [0.02], marker="^", color="tab:red", linestyle="none")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.axhline(0.5, color="black", linewidth=0.5, linestyle=":")
        ax.plot([], [], marker="v", color="tab:blue", linestyle="none", label="detector")
        ax.plot([], [], marker="^", color="tab:red", linestyle="none", label="old alarm")
        ax.set_title(f"{testbed}: vanilla runs")
        ax.set_xlabel("steps from gold's peak")
        ax.set_ylabel("training gold / its peak")
        ax.set_xlim(-120, 200)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


START, END = "<!-- hack detection: benchmarks/hack_report.py --write -->", "<!-- /hack detection -->"


def write(out: Path, text: str, results: Path) -> None:
    """Replace the block between the markers of docs/results.md by ``text``."""
    page = results.read_text()
    if START not in page or END not in page:
        raise SystemExit(f"{results} lacks the markers {START} ... {END}")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    results.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "evidence"))
    parser.add_argument("--tune", action="store_true", help="choose the settings on validation, report with them")
    parser.add_argument("--plot", action="store_true", help="write docs/images/hack_detection.png")
    parser.add_argument("--write", action="store_true", help="rewrite the block of docs/results.md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.tune:
        settings, lines = tune(load(out))
        print("\n".join(lines))
        print(report(out, settings))
        return
    text = report(out)
    if args.plot:
        print(plot(out, shipped_settings(), ROOT / "docs" / "images" / "hack_detection.png"))
    if args.write:
        write(out, text, ROOT / "docs" / "results.md")
    print(text)


if __name__ == "__main__":
    main()
