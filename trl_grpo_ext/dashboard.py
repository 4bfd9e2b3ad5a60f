"""A saved wandb workspace for KL and diversity: ``python -m trl_grpo_ext.dashboard --entity E --project P``.

Builds the workspace with ``wandb-workspaces`` (sections for KL control, entropy, diversity and the collapse alarm,
token clipping and filtering, rewards, the plugin's own cost) and saves it to the project. ``--dry-run`` prints the
workspace's spec as JSON without touching the network.
"""

from __future__ import annotations

import argparse
import json

SECTIONS = {
    "KL control": ["train/kl", "train/kl/value", "train/kl/beta", "train/kl/target", "train/kl/diversity"],
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
    "Token clipping and filtering": [
        "train/clip_cov/selected_frac",
        "train/kl_cov/selected_frac",
        "train/kl_cov/penalty_mean",
        "train/filter/kept_frac",
        "train/clip_ratio/region_mean",
    ],
    "Rewards and PRM": [
        "train/reward",
        "train/reward_std",
        "train/frac_reward_zero_std",
        "train/prm/step_reward_mean",
        "train/prm/adv_abs_mean",
    ],
    "Cost": ["train/timing/ext_fraction", "train/timing/ext_s", "train/step_time", "train/aepo/extra_gen_time"],
}


def build_workspace(entity: str, project: str, name: str = "GRPO collapse watch"):
    """The workspace object (nothing is sent): one line plot per metric, grouped in sections."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = [
        ws.Section(
            name=title,
            is_open=True,
            panels=[wr.LinePlot(title=key.removeprefix("train/"), x="train/global_step", y=[key]) for key in keys],
        )
        for title, keys in SECTIONS.items()
    ]
    return ws.Workspace(entity=entity, project=project, name=name, sections=sections)


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
