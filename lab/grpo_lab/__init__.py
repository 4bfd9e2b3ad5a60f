"""The lab: what the project uses to study its own tools, apart from the library a user trains with.

- :mod:`.testkit`: tiny models, tokenizers and datasets built locally (no Hub), for tests and the offline tasks;
- :mod:`.testbed`: the addition testbed (a careless teacher's warm start, held-out evaluation);
- :mod:`.testbeds`: the other testbeds (forks, and the reward hacks: length_bias, keyword_bias, round_bias,
  restate_bias);
- :mod:`.evaluation`: held-out evaluation harnesses and the gold a run keeps aside;
- :mod:`.stats`: the clustered intervals and verdicts of docs/results.md.

- :mod:`.offline`: the offline tasks' rewards and the ``"synthetic"`` dataset, registered by name in the library's
  registries (``register()``; ``recipes/math_grpo.py`` calls it).

The lab is its own package (``lab/`` in the repository, ``pip install -e lab``), never in the library's wheel. The
library (config, trainer, families, core, rollouts, rewards, PRM, monitor and detector, plots and dashboards of a
user's runs) imports none of it; ``tests/test_boundary.py`` enforces it.
"""
