#!/usr/bin/env bash
# Make one venv per older supported TRL (trl_grpo_ext.adapter.versions.SUPPORTED; the main environment has the newest):
# .venv-trl-<minor> at the repository root, on top of the main environment's packages (--system-site-packages: the
# same torch, transformers, accelerate, datasets and the plugin), with only TRL replaced (--no-deps). Seconds each.
# tests/test_trl_version_tier.py runs the fast tier (contract, parity, a tiny run of every family) in each.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
while read -r version; do
    venv=".venv-trl-${version%.*}"
    python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install -q --no-deps "trl==$version"
    "$venv/bin/python" -c "import trl, trl_grpo_ext.adapter as a; print('TRL venv:', trl.__version__, 'minor', a.TRL_MINOR)"
done < tests/trl_versions/versions.txt
