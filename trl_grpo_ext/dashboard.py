"""A saved wandb workspace for KL and diversity: ``python -m trl_grpo_ext.dashboard --entity E --project P``.

Builds the workspace with ``wandb-workspaces`` (sections for KL control, entropy, diversity and the collapse alarm,
token clipping and filtering, rewards, the plugin's own cost) and saves it to the project. ``--dry-run`` prints the
workspace's spec as JSON without touching the network.
"""

from __future__ import annotations

import argparse
import json

#: Sections of TRL's own metrics and the collapse monitor's; every family gets one more section, built from what its
#: registered members declare (``Extension.metrics``), so a new member shows up without editing this file.
BASE_SECTIONS = {
    "KL": ["train/kl", "train/clip_ratio/region_mean"],
    "Entropy": [
        "train/entropy",
        "train/entropy/mean",
        "train/entropy/p10",
        "train/entropy/p50",
        "train/entropy/p90",
        "train/entropy/low_frac",
    ],
    "Diversity and collapse": [
        "train/diversity/distinct_1",
        "train/diversity/distinct_2",
        "train/diversity/distinct_2_in_group",
        "train/diversity/self_bleu",
        "train/diversity/repetition",
        "train/diversity/unique_frac",
        "train/alarm/collapse",
    ],
    "Rewards": ["train/reward", "train/reward_std", "train/frac_reward_zero_std", "train/rewards/timeouts"],
    "Cost": ["train/timing/ext_fraction", "train/timing/ext_s", "train/step_time"],
}


def sections() -> dict[str, list[str]]:
    """The dashboard's sections: :data:`BASE_SECTIONS`, then one per family listing its members' declared metrics."""
    from .families import FAMILIES

    out = dict(BASE_SECTIONS)
    for switch, registry in FAMILIES.items():
        keys = list(dict.fromkeys(f"train/{m}" for name in registry.names() for m in registry.get(name).metrics))
        if keys:
            out[f"{switch} family"] = keys
    return out


def build_workspace(entity: str, project: str, name: str = "GRPO collapse watch"):
    """The workspace object (nothing is sent): one line plot per metric, grouped in sections."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    panels_by_section = [
        ws.Section(
            name=title,
            is_open=True,
            panels=[wr.LinePlot(title=key.removeprefix("train/"), x="train/global_step", y=[key]) for key in keys],
        )
        for title, keys in sections().items()
    ]
    return ws.Workspace(entity=entity, project=project, name=name, sections=panels_by_section)


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entity", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--name", default="GRPO collapse watch")
    parser.add_argument("--dry-run", action="store_true", help="print the spec, do not save")
    args = parser.parse_args(argv)
    workspace = build_workspace(args.entity, args.project, args.name)
    if args.dry_run:
        # The view spec wandb-workspaces would send (its internal model; nothing leaves the machine).
        print(json.dumps(workspace._to_model().model_dump(mode="json", by_alias=True), indent=1, default=str))
        return workspace
    workspace.save()
    print(f"saved workspace {args.name!r} to {args.entity}/{args.project}: {workspace.url}")
    return workspace


if __name__ == "__main__":
    main()
