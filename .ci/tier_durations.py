"""Sum the measured time of each test tier from a JUnit XML of a whole-suite run.

    python -m pytest -q tests --full --junitxml=all.xml      # once, on the machine that matters
    python .ci/tier_durations.py all.xml [--slowest 30]

Collects the default tier (``pytest --co -q tests``), maps each JUnit test case to its node id and prints
each tier's summed duration (setup, call and teardown, as JUnit's ``time`` holds them) and the slowest tests
of the default tier: what to move to the full tier (tests/tiers.py) when the default tier outgrows its
budget. Test cases of the XML that no longer exist are counted apart.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def junit_durations(path: Path) -> dict[str, float]:
    """``{node id: seconds}`` of every test case; the class name's dotted path is mapped back to a file."""
    durations: dict[str, float] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        for split in range(len(parts), 0, -1):
            file = Path(*parts[:split]).with_suffix(".py")
            if file.exists():
                node = "::".join([file.as_posix(), *parts[split:], case.get("name", "")])
                durations[node] = durations.get(node, 0.0) + float(case.get("time", 0.0))
                break
    return durations


def default_tier() -> set[str]:
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--co", "tests", "-p", "no:cacheprovider"],
        capture_output=True, text=True, check=True,
    )
    return {line.strip() for line in listing.stdout.splitlines() if "::" in line}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--slowest", type=int, default=30)
    args = parser.parse_args()
    durations = junit_durations(args.junit)
    selected = default_tier()
    default = {node: seconds for node, seconds in durations.items() if node in selected}
    full = {node: seconds for node, seconds in durations.items() if node not in selected}
    print(f"default tier: {len(default)} tests measured, {sum(default.values()) / 60:.1f} min")
    print(f"full tier:    {len(full)} tests measured, {sum(full.values()) / 60:.1f} min")
    unmeasured = selected - set(durations)
    if unmeasured:
        print(f"default tier: {len(unmeasured)} tests not in {args.junit} (new since it was measured)")
    for node, seconds in sorted(default.items(), key=lambda item: -item[1])[: args.slowest]:
        print(f"{seconds:8.2f} s  {node}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
