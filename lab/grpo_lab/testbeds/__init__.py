"""Testbeds beyond the addition task of :mod:`grpo_lab.testbed`, each a task where a claim about a tool can be
measured on 2 CPU cores: :mod:`~grpo_lab.testbeds.forks` (many right answers)."""
