"""Write the evidence part of docs/results.md from the saved runs (no training): the verdict table, the table against
TRL's own knobs, and one section per study with its command, its time, its report and its plot.

    python benchmarks/evidence_pages.py            # rewrites the block between the evidence markers of docs/results.md
    python benchmarks/evidence_pages.py --print    # prints it instead

Everything in the block is printed by ``benchmarks/evidence_study.py`` (``--verdicts``, ``--verdicts --against``,
``--study S --report``) from ``docs/images/evidence/runs``; the plots are redrawn. The prose around the block is
written by hand and says what the numbers mean.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import evidence_study as ev  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- evidence -->", "<!-- /evidence -->"
#: Baselines besides vanilla, each with the studies whose arms are paired with it (None: every forks arm): the knobs a
#: user already has (EVIDENCE.md), and the tools already here for the exploration methods of issue 28.
AGAINST = {
    "fixed beta 0.04": None,
    "temperature 1.0": None,
    "vanilla, 150 steps": None,  # is the diversity more than "trained less"? vanilla stopped earlier on its schedule
    "default tools": ("forks_pkpo", "forks_explore", "forks_dynamic"),
    # issue 47: DPPO against clip-higher (TRL's own clip is vanilla's), TRL's adaptive entropy bonus against AEPO
    "epsilon_high=0.28": ("forks_dppo",),
    "AEPO (target 0.2)": ("forks_entropy",),
    # ... and the two entropy members against TRL's bonus (an entry that is not a study names one arm)
    "TRL adaptive entropy (target 0.2)": ("AEPO (target 0.2)", "entropy-shaped advantages"),
}
#: Studies on another testbed whose arms are paired with a baseline too (the reference reset against the fixed anchor
#: it moves, on the length-biased reward).
ALSO = {"fixed beta 0.04": ("length_reference",)}
#: How a baseline's table is titled (default: by whether it pairs every forks arm or a few studies').
TITLES = {
    "epsilon_high=0.28": "clip-higher",
    "AEPO (target 0.2)": "the entropy control already here",
    "TRL adaptive entropy (target 0.2)": "TRL's adaptive entropy bonus",
}


def study_minutes(out: Path, study: str, warm_starts, seeds) -> tuple[float, int]:
    """(minutes on 2 workers, runs) of a study's own arms from the runs' recorded seconds (vanilla is shared)."""
    testbed = ev.TESTBED_OF[study]
    seconds = [
        run["seconds"]
        for name in ev.studies()[study]
        for run in ev.collect(out, "test", name, warm_starts, seeds, testbed).values()
    ]
    return sum(seconds) / 60 / 2, len(seconds)


def block(out: Path, warm_starts, seeds) -> str:
    lines = [BEGIN, "", "### Every verdict (test prompts, paired with vanilla)", ""]
    rows = ev.verdict_rows(out, "test", warm_starts, seeds)
    lines += rows
    arms = len({(row.split(" | ")[0], row.split(" | ")[2].split(",")[0]) for row in rows[2:]})
    lines += [
        "",
        f'{arms} arms (each on its testbed), {len(rows) - 2} comparisons in this table: read a lone "helps" or '
        '"hurts" whose interval nearly touches 0 as exploratory until a second study on new warm starts confirms it.',
    ]
    for baseline, only in AGAINST.items():
        table = ev.verdict_rows(out, "test", warm_starts, seeds, baseline=baseline)
        names = None if only is None else {name for entry in only for name in ev.studies().get(entry, {entry: 0})}
        also = {name for study in ALSO.get(baseline, ()) for name in ev.studies().get(study, {})}
        rows = table[:2] + [
            r
            for r in table[2:]
            if ("| forks," in r and (names is None or r.split(" | ")[0].lstrip("| ") in names))
            or r.split(" | ")[0].lstrip("| ") in also
        ]
        what = "the tools already here" if only is not None else "a knob a user already has"
        if baseline.startswith("vanilla,"):
            what = "vanilla stopped earlier"
        what = TITLES.get(baseline, what)
        if len(rows) > 2:
            where = "forks and length_bias" if also else "forks"
            lines += ["", f"### Against {what}: {baseline} ({where}, test)", "", *rows]
    for study in ev.studies():
        testbed = ev.TESTBED_OF[study]
        if not ev.collect(out, "test", next(iter(ev.studies()[study])), warm_starts, seeds, testbed):
            continue
        minutes, runs = study_minutes(out, study, warm_starts, seeds)
        vanilla = ev.collect(out, "test", "vanilla", warm_starts, seeds, testbed).values()
        vanilla_minutes = sum(run["seconds"] for run in vanilla) / 60 / 2
        ev.plot(out, study, "test", warm_starts, seeds)
        lines += [
            "",
            f"### `{study}`",
            "",
            f"`python benchmarks/evidence_study.py --study {study}`: {runs} runs of its own arms, about "
            f"{minutes:.0f} minutes on 2 cores, plus the {len(vanilla)} vanilla runs it shares with every study on "
            f"{testbed} (about {vanilla_minutes:.0f} minutes) and the warm starts (built once, cached).",
            "",
            ev.report(out, study, "test", warm_starts, seeds),
            "",
            f"![{study}](images/evidence/{study}.png)",
        ]
    lines += ["", END]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "evidence"))
    args = parser.parse_args(argv)
    text = block(Path(args.out), ev.parse_list("0-5"), ev.parse_list("0,1"))
    if args.print:
        print(text)
        return
    page = RESULTS.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{RESULTS} has no {BEGIN} ... {END} block to rewrite")
    start, end = page.index(BEGIN), page.index(END) + len(END)
    RESULTS.write_text(page[:start] + text + page[end:])
    print(f"rewrote the evidence block of {RESULTS}")


if __name__ == "__main__":
    main()
