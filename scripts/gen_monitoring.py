"""Write monitoring/prometheus.yml and monitoring/grafana-dashboard.json from the run's metric list
(grpo_launch/analysis/live_metrics.py, through grpo_launch/render/monitoring.py). ``tests/test_live_metrics.py`` checks
the shipped files equal what this writes.

Usage: python scripts/gen_monitoring.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_launch.render.monitoring import files  # noqa: E402

OUT = ROOT / "monitoring"


def main(argv: list[str]) -> int:
    stale = [name for name, text in files().items() if not (OUT / name).is_file() or (OUT / name).read_text() != text]
    if "--check" in argv:
        for name in stale:
            print(f"monitoring/{name} differs from what scripts/gen_monitoring.py writes: run it", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for name, text in files().items():
        (OUT / name).write_text(text)
        print(f"wrote monitoring/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
