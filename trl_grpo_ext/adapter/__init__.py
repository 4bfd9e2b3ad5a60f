"""The plugin's boundary with TRL: what depends on the installed TRL version and on its private surface.

- :mod:`.versions`: the supported TRL versions (checked when this package is imported: an ImportError outside them),
  the differences between them and the fallbacks the older ones need;
- :mod:`.compat`: the lines copied from TRL where it offers no hook (each names its TRL source; parity tests in
  ``tests/test_trl_contract.py``), and the list of TRL members the plugin touches (``TRL_SURFACE``);
- :mod:`.kernels`: a PyTorch stand-in for TRL 1.15's Triton-only log-prob kernel.
"""

from __future__ import annotations

from . import versions

#: The installed TRL's minor version ("1.14", "1.15" or "1.16"); importing this package refuses any other.
TRL_MINOR = versions.check_installed()
versions.install_fallbacks()

__all__ = ["TRL_MINOR", "versions"]
