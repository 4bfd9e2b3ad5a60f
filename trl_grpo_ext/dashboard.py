"""A saved wandb workspace for KL and diversity: ``python -m trl_grpo_ext.dashboard --entity E --project P``.

Builds the workspace with ``wandb-workspaces`` (sections for KL control, entropy, diversity and the collapse alarm,
the hack detector's alarm, score and signals, token clipping and filtering, rewards, the plugin's own cost) and saves
it to the project. ``--dry-run`` prints the workspace's spec as JSON without touching the network.
"""

from __future__ import annotations

import argparse
import json


def base_sections() -> dict[str, list[str]]:
    """Sections of TRL's own metrics (``adapter.compat.TRL_METRICS``), the collapse monitor's, the trainer's and the
    timing callback's, every key from where it is declared (``trl_grpo_ext.families.declared_metrics``)."""
    from .adapter.compat import TRL_METRICS
    from .callbacks import monitor_metric_keys
    from .families import declared_metrics

    declared = declared_metrics([])  # the trainer's and the timing callback's own
    monitor = monitor_metric_keys(ngram_sizes=(1, 2))
    trl = {key: f"train/{key}" for key in TRL_METRICS}
    return {
        "KL": [trl["kl"], trl["clip_ratio/region_mean"]],
        "Entropy": [trl["entropy"], *(f"train/{k}" for k in monitor if k.startswith("entropy/"))],
        "Diversity and collapse": [f"train/{k}" for k in monitor if not k.startswith(("entropy/", "audit/"))],
        # what tells learning from hacking: the audits' disagreement with the training reward (docs/monitoring.md)
        "Learning or hacking: audits": [trl["reward"], *(f"train/{k}" for k in monitor if k.startswith("audit/"))],
        # the hack detector: its alarm (a spike at the step it fires), its score and the three signals it reads
        "Hack detector": [
            "train/alarm/hack",
            "train/alarm/hack_score",
            "train/completions/mean_length",
            "train/diversity/prompt_info",
            "train/diversity/repetition",
        ],
        "Rewards": [trl["reward"], trl["reward_std"], trl["frac_reward_zero_std"]]
        + [f"train/{k}" for k in declared["GRPOExtTrainer"]],
        "Cost": [*(f"train/{k}" for k in declared["ExtTimingCallback"]), trl["step_time"]],
    }


def sections(validation_metric: str | None = None) -> dict[str, list[str]]:
    """The dashboard's sections: :func:`base_sections`, then one per family listing its members' declared metrics,
    so a new member shows up without editing this file. ``validation_metric`` (``collapse_validation_metric``, e.g.
    ``rewards/strict/mean``): held-out gold at evaluation beside the training reward, in the audits' section."""
    from .families import FAMILIES

    out = base_sections()
    if validation_metric:
        out["Learning or hacking: audits"].append(f"eval/{validation_metric.removeprefix('eval_')}")
    for switch, registry in FAMILIES.items():
        keys = list(dict.fromkeys(f"train/{m}" for name in registry.names() for m in registry.get(name).metrics))
        if keys:
            out[f"{switch} family"] = keys
    return out


def build_workspace(entity: str, project: str, name: str = "GRPO collapse watch", validation_metric: str | None = None):
    """The workspace object (nothing is sent): one line plot per metric, grouped in sections."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    panels_by_section = [
        ws.Section(
            name=title,
            is_open=True,
            panels=[wr.LinePlot(title=key.removeprefix("train/"), x="train/global_step", y=[key]) for key in keys],
        )
        for title, keys in sections(validation_metric).items()
    ]
    return ws.Workspace(entity=entity, project=project, name=name, sections=panels_by_section)


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entity", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--name", default="GRPO collapse watch")
    parser.add_argument(
        "--validation_metric", default=None, help="collapse_validation_metric: held-out gold beside the reward"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the spec, do not save")
    args = parser.parse_args(argv)
    workspace = build_workspace(args.entity, args.project, args.name, args.validation_metric)
    if args.dry_run:
        # The view spec wandb-workspaces would send (its internal model; nothing leaves the machine).
        print(json.dumps(workspace._to_model().model_dump(mode="json", by_alias=True), indent=1, default=str))
        return workspace
    workspace.save()
    print(f"saved workspace {args.name!r} to {args.entity}/{args.project}: {workspace.url}")
    return workspace


if __name__ == "__main__":
    main()
