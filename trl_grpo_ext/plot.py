"""Plots without a tracker: ``python -m trl_grpo_ext.plot OUTPUT_DIR [OUTPUT_DIR ...] [--out DIR]``.

Reads ``trainer_state.json`` (the run folder's, or its newest ``checkpoint-*``'s) of one or several runs and writes PNG
panels, several runs overlaid with their folder names as labels: ``training.png`` (reward, KL and beta, entropy),
``collapse.png`` (Distinct-N, self-BLEU, repetition, filter and clip fractions) and ``families.png`` (one panel per
family, with the metrics its registered members declare), each panel only when some run logged its metric.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

#: The training figure's panel of held-out rewards (evaluation), filled from the runs' logs.
HELD_OUT = "held-out rewards (evaluation)"

#: The curated figures (title, keys); every key is one some owner declares (TRL's ``adapter.compat.TRL_METRICS``, a
#: member's ``metrics``, the monitor's ``monitor_metric_keys``): :func:`undeclared_panel_keys` lists any that is not.
PANELS = {
    "training": [
        ("reward", ["reward"]),
        # filled from the run: every reward function's mean at evaluation (held-out prompts), beside the reward
        (HELD_OUT, []),
        ("KL and beta", ["kl", "kl/value", "kl/beta"]),
        ("entropy", ["entropy", "entropy/p10", "entropy/p50", "entropy/p90"]),
        ("PRM", ["prm/step_reward_mean", "prm/adv_abs_mean"]),
    ],
    "collapse": [
        (
            "distinct-n",
            ["diversity/distinct_1", "diversity/distinct_2", "diversity/distinct_3", "diversity/distinct_4"],
        ),
        ("self-BLEU / unique", ["diversity/self_bleu", "diversity/unique_frac"]),
        ("repetition", ["diversity/repetition"]),
        (
            "filter / clip fractions",
            ["filter/kept_frac", "clip_cov/selected_frac", "kl_cov/selected_frac", "clip_ratio/region_mean"],
        ),
        ("collapse alarm / hack detector", ["alarm/collapse", "alarm/hack", "alarm/hack_score"]),
        (
            "audit (reward favours, audit fails)",
            ["audit/disagreement", "audit/inversion", "audit/overpaid", "audit/flagged_frac"],
        ),
    ],
}


#: Line styles of a panel's metrics, in the order the panel lists them (colours tell the runs apart).
LINE_STYLES = ("-", "--", ":", "-.")


def run_color(index: int) -> str:
    """The colour of the ``index``-th run: matplotlib's default cycle, so run i has the same colour in every panel and
    figure (start, vanilla and tools in the recipe's order)."""
    return f"C{index % 10}"


def plot_pass_at_k(curves: dict[str, dict[int, float]], path: str | Path, *, title: str = "held-out pass@k") -> Path:
    """One line per run of pass@k against k (log scale), e.g. ``{"start": {1: 0.3, 2: 0.5, ...}, "vanilla": ...}``
    from :func:`grpo_lab.evaluation.pass_at_k_curve`; colours as :func:`run_color`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    for i, (label, curve) in enumerate(curves.items()):
        points = sorted((int(k), value) for k, value in curve.items())  # keys may be ints or JSON's strings
        ax.plot([k for k, _ in points], [v for _, v in points], color=run_color(i), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("pass@k")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def panels() -> dict[str, list[tuple[str, list[str]]]]:
    """:data:`PANELS`, plus a ``families`` figure with one panel per family listing its members' declared metrics (a
    registered variant gets its panel without editing this file)."""
    from .families import FAMILIES

    out = dict(PANELS)
    out["families"] = [
        (switch, list(dict.fromkeys(m for name in registry.names() for m in registry.get(name).metrics)))
        for switch, registry in FAMILIES.items()
    ]
    return out


def undeclared_panel_keys() -> list[str]:
    """Keys of :data:`PANELS` that no owner declares (a renamed or mistyped metric; empty when all is well)."""
    from .adapter.compat import TRL_METRICS
    from .families import declared_metrics

    known = set(TRL_METRICS) | {key for keys in declared_metrics().values() for key in keys}
    return [key for figure in PANELS.values() for _, keys in figure for key in keys if key not in known]


def load_log_history(run_dir: str | Path) -> list[dict]:
    """``log_history`` of a run folder: its own ``trainer_state.json`` or that of its newest checkpoint."""
    run_dir = Path(run_dir)
    path = run_dir / "trainer_state.json"
    if not path.exists():
        checkpoints = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
        if not checkpoints:
            raise FileNotFoundError(
                f"No trainer_state.json in {run_dir} or its checkpoint-* folders. Save one with trainer.save_state() "
                "or save_strategy='steps'."
            )
        path = checkpoints[-1]
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}): the run was probably killed while writing it. Fix: plot an earlier "
            "checkpoint folder, or re-save the state with trainer.save_state()."
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(
            f"{path} has no 'log_history' list: it is not a transformers trainer_state.json. Fix: pass the run's "
            "output folder (the one trainer.save_state() wrote)."
        )
    return state["log_history"]


def hack_alarm_step(history: list[dict]) -> int | None:
    """The logged step at which the hack detector fired (``alarm/hack`` > 0: 1.0 at its step, averaged with the 0.0
    of the other steps of that log), or None."""
    return next((h["step"] for h in history if h.get("alarm/hack", 0.0) > 0 and "step" in h), None)


def _held_out(runs: dict[str, list[dict]], title: str) -> list[str]:
    """The keys of the held-out panel: every reward function's mean at evaluation (``eval_rewards/<name>/mean``,
    held-out prompts: validation gold beside the training reward); other panels nothing more."""
    if title != HELD_OUT:
        return []
    keys = {
        k for hist in runs.values() for h in hist for k in h if k.startswith("eval_rewards/") and k.endswith("/mean")
    }
    return sorted(keys)


def plot_runs(runs: dict[str, list[dict]], out_dir: str | Path) -> list[Path]:
    """Write the panel figures for ``{label: log_history}`` into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for figure, figure_panels in panels().items():
        present = [
            (title, [k for k in keys + _held_out(runs, title) if any(k in h for hist in runs.values() for h in hist)])
            for title, keys in figure_panels
        ]
        present = [(title, keys) for title, keys in present if keys]
        if not present:
            continue
        fig, axes = plt.subplots(1, len(present), figsize=(4.0 * len(present), 3.2), squeeze=False)
        for ax, (title, keys) in zip(axes[0], present):
            for i, (label, history) in enumerate(runs.items()):
                for j, key in enumerate(keys):
                    points = [(h["step"], h[key]) for h in history if h.get(key) is not None and "step" in h]
                    if points:
                        name = key if len(runs) == 1 else f"{label}: {key}"
                        # one colour per run, one line style per metric: runs stay apart in every panel
                        ax.plot(
                            [p[0] for p in points],
                            [p[1] for p in points],
                            color=run_color(i) if len(runs) > 1 else None,
                            linestyle=LINE_STYLES[j % len(LINE_STYLES)] if len(runs) > 1 else "-",
                            marker=".",
                            markersize=3,
                            label=name,
                        )
            for i, (label, history) in enumerate(runs.items()):
                fired = hack_alarm_step(history)
                if fired is not None:  # the detector's alarm, on every panel
                    ax.axvline(
                        fired, color=run_color(i) if len(runs) > 1 else "black", linestyle=(0, (1, 2)),
                        linewidth=1.2, label=f"{label}: hack alarm" if len(runs) > 1 else "hack alarm",
                    )  # fmt: skip
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{figure}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description="Plot GRPO runs from their trainer_state.json.")
    parser.add_argument("runs", nargs="+", help="run output folders")
    parser.add_argument("--out", default=None, help="where to write the PNGs (default: <first run>/plots)")
    args = parser.parse_args(argv)
    try:
        runs = {os.path.basename(os.path.normpath(r)): load_log_history(r) for r in args.runs}
    except (FileNotFoundError, ValueError) as error:
        parser.exit(2, f"error: {error}\n")
    written = plot_runs(runs, args.out or os.path.join(args.runs[0], "plots"))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
