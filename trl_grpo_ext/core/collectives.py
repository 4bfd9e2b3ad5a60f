"""The two collective operations the core functions need to work on statistics that span processes.

Core functions stay free of accelerate / torch.distributed: they take an optional ``collectives`` object and default to
the single-process :data:`LOCAL`. The trainer passes an implementation backed by accelerate.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    """What a core function may ask of the process group.

    Attributes:
        rank: this process's index (0 for a single process).
    """

    rank: int

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of ``tensor`` over all processes (same shape on every process)."""
        ...

    def all_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenation of the 1-D ``tensor`` of every process, in rank order; lengths may differ between processes."""
        ...


class _Local:
    rank = 0

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


#: The single-process collectives: sums and concatenations are the identity.
LOCAL: Collectives = _Local()
