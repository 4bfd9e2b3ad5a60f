"""Which TRL versions the plugin runs on, and every difference between them the plugin needs to know.

The plugin hooks private methods of ``trl.GRPOTrainer``; each minor version of TRL in :data:`SUPPORTED` is tested in CI
(``.ci/run``: the contract, parity and fast tiers and a tiny run of every family per version, the full suite on the
newest). Outside that range :func:`check_installed` refuses at import, saying which versions work; setting the
environment variable :data:`ALLOW_UNTESTED` to 1 turns the refusal into a warning (to try a new TRL release: the
contract tests in ``tests/test_trl_contract.py`` then say what changed).

Differences between the supported versions, all handled here:

- TRL 1.14 routes ``_get_per_token_logps_and_entropies(model, *args, batch_size=None, compute_aux_loss=False,
  **kwargs)`` to ``_full_logits_logps`` (or ``_chunked_logps`` with Liger); 1.15 and 1.16 take the arguments
  themselves. The plugin passes them positionally and by the same keywords, so both work;
  :func:`logps_signature_source` names the function whose parameters the contract test pins.
- TRL 1.15's fused LM head (``add_fused_lm_head``) calls a Triton kernel, ``trl.kernels.ChunkedLogProbFunction``,
  that is ``None`` when Triton is missing (CPU-only PyTorch, macOS): every GRPOTrainer forward then fails with
  ``'NoneType' object has no attribute 'apply'``. TRL 1.16 ships a PyTorch path. :func:`install_fallbacks` gives
  1.15 the plain-PyTorch :class:`~trl_grpo_ext.adapter.kernels.TorchChunkedLogProb` in that case (same outputs, full
  logits in memory: fine for the CPU runs it serves).
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings

from packaging.version import Version

logger = logging.getLogger(__name__)

#: The TRL minor versions tested in CI (oldest first). ``pyproject.toml`` accepts exactly this range.
SUPPORTED = ("1.14", "1.15", "1.16")
#: The newest supported minor: the one the copied TRL code (``adapter/compat.py``) comes from.
NEWEST = SUPPORTED[-1]
#: Set to 1 to run on a TRL outside :data:`SUPPORTED` (with a warning instead of an ImportError).
ALLOW_UNTESTED = "TRL_GRPO_EXT_ALLOW_UNTESTED_TRL"


def minor(version: str) -> str:
    """``"1.15.0"`` -> ``"1.15"`` (pre-releases and local versions included: ``"1.17.0.dev0"`` -> ``"1.17"``)."""
    release = Version(version).release
    return f"{release[0]}.{release[1] if len(release) > 1 else 0}"


def supported_range() -> str:
    """The pip specifier of :data:`SUPPORTED`: ``">=1.14,<1.17"``."""
    last = Version(SUPPORTED[-1]).release
    return f">={SUPPORTED[0]},<{last[0]}.{last[1] + 1}"


def check_installed(version: str | None = None) -> str:
    """The installed TRL's minor version (``version`` when given), after checking it is in :data:`SUPPORTED`.

    Raises ImportError outside the range, naming the installed version, the supported ones and the fix, unless the
    environment variable :data:`ALLOW_UNTESTED` is ``1`` (then a warning)."""
    if version is None:
        import trl

        version = trl.__version__
    installed = minor(version)
    if installed not in SUPPORTED:
        message = (
            f"trl_grpo_ext supports TRL {', '.join(SUPPORTED)} (it hooks private GRPOTrainer methods, tested per "
            f"version), but TRL {version} is installed. Fix: pip install 'trl{supported_range()}'; or set "
            f"{ALLOW_UNTESTED}=1 to try this TRL anyway (tests/test_trl_contract.py then says what changed)."
        )
        if os.environ.get(ALLOW_UNTESTED) != "1":
            raise ImportError(message)
        warnings.warn(message, stacklevel=2)
    return installed


def logps_signature_source(trainer_cls) -> object:
    """The function that receives ``_get_per_token_logps_and_entropies``'s arguments in the installed TRL:
    ``_full_logits_logps`` on TRL 1.14 (where the method forwards ``*args``), the method itself on 1.15 and 1.16."""
    method = trainer_cls._get_per_token_logps_and_entropies
    forwarded = getattr(trainer_cls, "_full_logits_logps", None)
    parameters = inspect.signature(method).parameters
    takes_varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values())
    return forwarded if takes_varargs and forwarded is not None else method


_INSTALLED = False


def install_fallbacks() -> list[str]:
    """Give the installed TRL what it lacks on this machine (see the module docstring); returns what was installed.
    Idempotent."""
    global _INSTALLED
    installed: list[str] = []
    from trl.trainer import utils

    if hasattr(utils, "_ChunkedLogProbFunction") and utils._ChunkedLogProbFunction is None:
        from .kernels import TorchChunkedLogProb

        utils._ChunkedLogProbFunction = TorchChunkedLogProb
        installed.append("TorchChunkedLogProb")
        if not _INSTALLED:
            logger.info(
                "trl_grpo_ext: TRL's chunked log-prob kernel needs Triton, which is missing; using a PyTorch "
                "fallback (trl_grpo_ext.adapter.kernels.TorchChunkedLogProb)."
            )
    _INSTALLED = True
    return installed
