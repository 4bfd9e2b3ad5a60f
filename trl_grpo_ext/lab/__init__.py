"""The lab: what the project uses to study its own tools, apart from the library a user trains with.

- :mod:`.testkit`: tiny models, tokenizers and datasets built locally (no Hub), for tests and the offline tasks;
- :mod:`.testbed`: the addition testbed (a careless teacher's warm start, held-out evaluation);
- :mod:`.testbeds`: the other testbeds (forks, and the reward hacks: length_bias, keyword_bias, round_bias,
  restate_bias);
- :mod:`.evaluation`: held-out evaluation harnesses and the gold a run keeps aside;
- :mod:`.stats`: the clustered intervals and verdicts of docs/results.md.

The library (config, trainer, families, core, rollouts, rewards, PRM, monitor and detector, plots and dashboards of a
user's runs) imports none of it at module level; two functions load it when asked for the offline tasks it defines:
``trl_grpo_ext.rewards``' registries (the testbeds' rewards, named in the recipe's configs) and
``trl_grpo_ext.data.load_prompts("synthetic")``. ``tests/test_boundary.py`` enforces it.
"""
