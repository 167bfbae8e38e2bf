"""Write tests/module_seconds.json from a pytest log: each test module's seconds in the log's "slowest durations"
section (pyproject.toml's addopts asks pytest for the 60 slowest), summed over setup, call and teardown.

scripts/test.sh hands whole modules to its two workers in the order tests/conftest.py gives them: the modules that
took longest first, so that the last ones to finish are short. Stale figures change only that order, never a
result. Refresh after a suite's time changes: bash scripts/test.sh | tee /tmp/suite.log; python
scripts/module_seconds.py /tmp/suite.log

Usage: python scripts/module_seconds.py LOG
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+?\.py)::")


def module_seconds(log: str) -> dict[str, int]:
    seconds: dict[str, float] = {}
    for line in log.splitlines():
        if m := LINE.match(line):
            seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    return {name: round(s) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found = module_seconds(Path(argv[0]).read_text(errors="replace"))
    if not found:
        print(f"{argv[0]}: no 'slowest durations' lines", file=sys.stderr)
        return 1
    (ROOT / "tests" / "module_seconds.json").write_text(json.dumps(found, indent=1) + "\n")
    print(f"wrote tests/module_seconds.json: {len(found)} modules, {sum(found.values())} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
