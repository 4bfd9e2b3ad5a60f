"""Module-level scorers for tests/test_rewards.py: scoring workers import them by name."""

import os
import time


def exact(completion, gold, *, timeout_seconds=None):
    """1.0 when the completion is the gold string."""
    return 1.0 if completion == gold else 0.0


def dies_on_poison(completion, gold, *, timeout_seconds=None):
    """Kills its own process on the completion "poison" (a crash in C code, say); exact match otherwise."""
    if completion == "poison":
        os._exit(3)
    return exact(completion, gold)


def sleeps(completion, gold, *, timeout_seconds=None):
    """Takes 30 s (only a time bound ends it), except on the workers' warm-up call."""
    if gold != "1":
        time.sleep(30)
    return 1.0
