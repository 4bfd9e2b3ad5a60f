"""Testbeds beyond the addition task of :mod:`trl_grpo_ext.lab.testbed`, each a task where a claim about a tool can be
measured on 2 CPU cores: :mod:`~trl_grpo_ext.lab.testbeds.forks` (many right answers)."""
