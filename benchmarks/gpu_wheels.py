"""Download the wheels benchmarks/gpu_check.py needs on a GPU machine that has PyTorch but no network and no trl.

    python benchmarks/gpu_wheels.py WHEELS                 # on a networked machine, same Python version as the GPU one
    python benchmarks/gpu_wheels.py WHEELS --list          # only write WHEELS/requirements.txt (no download)
    # then, on the GPU machine, with WHEELS and this repository copied over:
    pip install --no-index --find-links WHEELS -r WHEELS/requirements.txt

The list is this environment's installed versions of everything ``trl_grpo_ext`` requires, recursively (with the
``extras`` asked for), except PyTorch and its CUDA libraries (the GPU machine keeps its own). This project goes in as
a wheel built from the checkout. ``--python-version`` / ``--platform`` download for another interpreter or OS than
this one (binary wheels only then).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import subprocess
import sys

from packaging.requirements import Requirement

#: Provided by the GPU machine: PyTorch and what its CUDA build brings.
EXCLUDED = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_requirements(root: str = "trl_grpo_ext", extras: tuple[str, ...] = ()) -> list[str]:
    """``name==version`` of every installed distribution ``root`` needs (markers evaluated here), sorted, without
    ``root`` itself and without :data:`EXCLUDED`."""
    seen: dict[str, str] = {}
    stack = [(root, set(extras))]
    while stack:
        name, wanted = stack.pop()
        dist = md.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            env_ok = [req.marker is None or req.marker.evaluate({"extra": e}) for e in (wanted or {""})]
            if not any(env_ok):
                continue
            key = _norm(req.name)
            if EXCLUDED.match(key) or key in seen:
                continue
            try:
                seen[key] = md.version(req.name)
            except md.PackageNotFoundError:
                raise SystemExit(f"{req.name} (needed by {name}) is not installed here: install it first") from None
            stack.append((req.name, set(req.extras)))
    return sorted(f"{name}=={version}" for name, version in seen.items())


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="folder for the wheels and requirements.txt")
    parser.add_argument("--extras", nargs="*", default=["plot"], help="extras of trl_grpo_ext to include")
    parser.add_argument("--list", action="store_true", help="write requirements.txt only, download nothing")
    parser.add_argument("--python-version", help="e.g. 3.11, when the GPU machine runs another Python")
    parser.add_argument("--platform", default=None, help="e.g. manylinux2014_x86_64 (with --python-version)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    reqs = pinned_requirements(extras=tuple(args.extras))
    version = md.version("trl_grpo_ext")
    with open(os.path.join(args.out, "requirements.txt"), "w") as f:
        f.write("\n".join([*reqs, f"trl_grpo_ext=={version}"]) + "\n")
    print(f"{len(reqs)} dependencies pinned in {os.path.join(args.out, 'requirements.txt')}")
    if args.list:
        return reqs
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pip = [sys.executable, "-m", "pip"]
    target = []
    if args.python_version:
        target = ["--only-binary=:all:", "--python-version", args.python_version]
        target += ["--platform", args.platform or "manylinux2014_x86_64"]
    download = [*pip, "download", "--no-deps", "-d", args.out, *target, *reqs]
    subprocess.run(download, check=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", args.out, repo], check=True)
    return reqs


if __name__ == "__main__":
    main()
