"""TRL's own GRPO test suite, run once as TRL ships it and once per plugin family member switched on, compared test by
test: does any member fail a test plain TRL passes?

    python benchmarks/trl_suite.py --trl_tests PATH/TO/trl/tests            # every arm, 2 at a time (~40 min, 2 CPUs)
    python benchmarks/trl_suite.py --trl_tests ... --arms clip_cov,aepo -k "test_train and not vlm"

``--trl_tests`` is the ``tests`` folder of a TRL checkout (TRL's wheels and sdists ship no tests; nothing of TRL's
is copied here). The tests load tiny models and datasets from the Hub by name; they run from a folder of local
stand-ins (:mod:`grpo_lab.hub_standins`), with ``HF_HUB_OFFLINE=1``: a test needing anything else fails in
every arm alike. Each arm replaces ``trl.GRPOTrainer`` / ``trl.GRPOConfig`` (``benchmarks/trl_suite_plugin.py``) and
runs the tests plain TRL passed. A test an arm fails is a *refusal* when the error is the plugin's own config or
member-contract error (``GRPOExtConfig.<field>=...: ... Fix: ...``, a documented combination the member cannot run),
otherwise a *regression*. ``--write`` writes the table to docs/trl_suite.md and the outcomes to
docs/images/evidence/trl_suite.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = Path(__file__).resolve().parent
DOC = ROOT / "docs" / "trl_suite.md"
RECORD = ROOT / "docs" / "images" / "evidence" / "trl_suite.json"
#: The plugin's own errors: a config refusal (trl_grpo_ext.names.config_error) or a member contract error.
REFUSAL_MARKS = ("GRPOExtConfig.", "MemberContractError", "cannot run with")


def arms() -> dict[str, dict]:
    """arm name -> the settings it applies: every registered family member but the off ones and PRM (TRL's tests
    give outcome rewards only, PRM needs step rewards), with its ``example_config`` (PKPO with its default k); the
    collapse monitor with every diversity metric and the drift detector; and ``off``, the plugin's trainer with every
    family off."""
    import trl_grpo_ext.families  # noqa: F401  (registers the members)
    from trl_grpo_ext.families.base import services_of
    from trl_grpo_ext.names import DIVERSITY_METRICS, FAMILIES

    out: dict[str, dict] = {"off": {}}
    for switch, registry in FAMILIES.items():
        for name in registry.names():
            member = registry.get(name)
            if member.is_off or name == "grpo" or "scoring" in services_of(member):
                continue
            out[name if name not in out else f"{switch}:{name}"] = {switch: name, **member.example_config}
    out["pass_at_k"].pop("pkpo_k", None)  # the default k, min(4, num_generations): TRL's tests use 2-8 generations
    out["monitor"] = {"diversity_metrics": list(DIVERSITY_METRICS), "collapse_detector": "drift"}
    return out


def run_arm(
    name: str,
    settings: dict | None,
    *,
    tests: Path,
    standins: Path,
    work: Path,
    only: list[str] | None,
    keyword: str | None,
) -> dict:
    report = work / f"{name.replace(':', '_')}.json"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_GRPO_EXT_SUITE_REPORT": str(report),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGIN_DIR), os.environ.get("PYTHONPATH")])),
    }
    env.pop("TRL_GRPO_EXT_SUITE_SETTINGS", None)
    if settings is not None:
        env["TRL_GRPO_EXT_SUITE_SETTINGS"] = json.dumps(settings)
    if only is not None:
        selection = work / f"{name.replace(':', '_')}.only"
        selection.write_text("\n".join(only))
        env["TRL_GRPO_EXT_SUITE_ONLY"] = str(selection)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(tests / "test_grpo_trainer.py"),
        "-p",
        "trl_suite_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "-W",
        "ignore",
        f"--basetemp={work / ('tmp_' + name.replace(':', '_'))}",
    ]
    if keyword:
        cmd += ["-k", keyword]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=standins, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not report.exists():
        raise RuntimeError(f"arm {name}: pytest wrote no report (rc {proc.returncode}):\n{proc.stdout[-3000:]}")
    record = json.loads(report.read_text())
    return {"seconds": seconds, "outcomes": record["tests"], "built": record["__arm__"]}


def compare(plain: dict, arm: dict) -> dict:
    """The arm's failures among the tests plain TRL passed, split into refusals and regressions."""
    passed = {k for k, v in plain.items() if v["outcome"] == "passed"}
    lost = {k: v["error"] for k, v in arm.items() if k in passed and v["outcome"] in ("failed", "error")}
    refusals = {k: e for k, e in lost.items() if any(mark in e for mark in REFUSAL_MARKS)}
    regressions = {k: e for k, e in lost.items() if k not in refusals}
    counts = {o: sum(v["outcome"] == o for v in arm.values()) for o in ("passed", "failed", "error", "skipped")}
    return {"ran": len(arm), **counts, "refusals": refusals, "regressions": regressions}


def _with_member(result: dict) -> str:
    """How many of the arm's trainers built its member (a test passing no args gets TRL's default GRPOConfig, which
    switches nothing on)."""
    from trl_grpo_ext.families import OBSERVERS
    from trl_grpo_ext.names import FAMILIES

    settings = result["settings"]
    switches = [k for k in settings if k in FAMILIES]
    if switches:
        key = f"{switches[0]}:{FAMILIES[switches[0]].get(settings[switches[0]]).__name__}"
    elif settings:
        key = f"collapse_monitor:{OBSERVERS.get('collapse_monitor').__name__}"
    else:
        return "-"
    return str(result["built"]["members"].get(key, 0))


def table(results: dict) -> list[str]:
    lines = [
        "| arm | settings | tests run | passed | failed where plain passed: refused (documented) | regressions | "
        "trainers built (with the member) | minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        settings = ", ".join(f"{k}={v!r}" for k, v in r["settings"].items()) if r["settings"] is not None else "TRL"
        if name == "plain":
            lines.append(f"| plain TRL | - | {r['ran']} | {r['passed']} | - | - | - | {r['seconds'] / 60:.1f} |")
            continue
        lines.append(
            f"| {name} | `{settings or 'every family off'}` | {r['ran']} | {r['passed']} | {len(r['refusals'])} | "
            f"{len(r['regressions'])} | {r['built']['trainers']} ({_with_member(r)}) | "
            f"{r['seconds'] / 60:.1f} |"
        )
    return lines


def _commit() -> str:
    """The checkout's commit (with "+changes" when the working tree differs from it), or "an unknown commit"."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "an unknown commit"
    if commit.returncode != 0:
        return "an unknown commit"
    return commit.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl_tests", type=Path, required=True, help="the tests/ folder of a TRL checkout")
    parser.add_argument("--arms", default="all", help="comma-separated arm names (see arms()); default all")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression for every arm")
    parser.add_argument("--jobs", type=int, default=2, help="arms run at once (each single-threaded)")
    parser.add_argument("--standins", type=Path, default=Path.home() / ".cache" / "trl_grpo_ext" / "hub_standins")
    parser.add_argument("--write", action="store_true", help="write docs/trl_suite.md and the JSON record")
    args = parser.parse_args()

    from grpo_lab.hub_standins import build_standins

    tests = args.trl_tests.resolve()
    if not (tests / "test_grpo_trainer.py").exists():
        parser.error(f"--trl_tests {tests}: no test_grpo_trainer.py there (give the tests/ folder of a TRL checkout)")
    standins = build_standins(args.standins)
    every = arms()
    chosen = every if args.arms == "all" else {a: every[a] for a in args.arms.split(",")}
    work = Path(tempfile.mkdtemp(prefix="trl_suite_"))
    kwargs = {"tests": tests, "standins": standins, "work": work, "keyword": args.keyword}

    plain = run_arm("plain", None, only=None, **kwargs)
    passed = sorted(k for k, v in plain["outcomes"].items() if v["outcome"] == "passed")
    results = {
        "plain": {
            "settings": None,
            "seconds": plain["seconds"],
            "ran": len(plain["outcomes"]),
            "passed": len(passed),
            "outcomes": plain["outcomes"],
        }
    }
    print(f"plain TRL: {len(passed)} of {len(plain['outcomes'])} passed in {plain['seconds'] / 60:.1f} min", flush=True)

    def one(item):
        name, settings = item
        run = run_arm(name, settings, only=passed, **kwargs)
        r = {"settings": settings, "seconds": run["seconds"], "built": run["built"]}
        r.update(compare(plain["outcomes"], run["outcomes"]))
        print(
            f"{name}: {r['passed']}/{r['ran']} passed, {len(r['refusals'])} refused, {len(r['regressions'])} "
            f"regressions; {run['built']['trainers']} trainers built, members {run['built']['members']} "
            f"({r['seconds'] / 60:.1f} min)",
            flush=True,
        )
        return name, r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results.update(dict(pool.map(one, chosen.items())))

    import trl

    lines = table(results)
    details = []
    for name, r in results.items():
        for kind in ("regressions", "refusals"):
            for test, error in sorted(r.get(kind, {}).items()):
                details.append(f"- {name}, {kind[:-1]}: `{test.split('::', 1)[1]}`: {error.splitlines()[0][:300]}")
    print("\n".join(lines + [""] + details))
    if args.write:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        record = {"trl": trl.__version__, "commit": _commit(), "keyword": args.keyword, "arms": results}
        RECORD.write_text(json.dumps(record, indent=1))
        header = DOC.read_text().split("<!-- table -->")[0] if DOC.exists() else ""
        DOC.write_text(
            header
            + "<!-- table -->\n"
            + f"TRL {trl.__version__}, trl-grpo-ext at {_commit()}; "
            + "`python benchmarks/trl_suite.py --trl_tests ... --write`"
            + (f" with `-k {args.keyword!r}`" if args.keyword else "")
            + ".\n\n"
            + "\n".join(lines)
            + "\n\n"
            + ("\n".join(details) if details else "No test plain TRL passes fails in any arm.")
            + "\n"
        )


if __name__ == "__main__":
    main()
