"""The step-time model (lms_magic/lms/core/costs.py) against the GPU runs stored in benchmarks/results/.

Reads each LMS trial of benchmarks/lms_gpu_torch.py's output (its JSON: step_s, swapped_bytes and, where
the trial measured it, h2d / d2h bandwidth; else the median of the trials that did), takes the plain
step's compute per sample from the same model's plain trials, and prints the predicted and measured
step time of each trial and their ratio. No GPU needed: it reads logs.

    python benchmarks/cost_model_check.py benchmarks/results/h100-2026-11-23
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from lms_magic.lms.core.costs import StepCost

LINE = re.compile(r"^(?P<model>\w+) (?:batch )?(?P<batch>\d+) (?P<kind>plain|lms)(?: \{[^}]*\}:)? (?P<json>\{.*\})$")


def trials(folder: Path) -> list[dict]:
    found = []
    for path in sorted(folder.glob("*.log")):
        for line in path.read_text().splitlines():
            match = LINE.match(line.strip())
            if match:
                row = json.loads(match["json"])
                if row.get("ok") and row.get("step_s"):
                    found.append({**row, "model": match["model"], "batch": int(match["batch"]),
                                  "kind": match["kind"], "file": path.name})
    return found


def main(folder: str) -> None:
    rows = trials(Path(folder))
    plain = {}
    for row in rows:
        if row["kind"] == "plain":
            plain.setdefault(row["model"], []).append(row["step_s"] / row["batch"])
    links = [(row["h2d"], row["d2h"]) for row in rows if "h2d" in row]
    default_link = (statistics.median(h for h, _ in links), statistics.median(d for _, d in links))
    ratios = []
    for row in rows:
        if row["kind"] != "lms" or row["model"] not in plain or not row.get("swapped_bytes"):
            continue
        h2d, d2h = (row["h2d"], row["d2h"]) if "h2d" in row else default_link
        cost = StepCost(statistics.mean(plain[row["model"]]) * row["batch"], "measured", d2h, h2d)
        predicted = cost.step_s(row["swapped_bytes"])
        ratios.append(row["step_s"] / predicted)
        print(f"{row['file']}: {row['model']} batch {row['batch']}: {row['swapped_bytes'] / 1e9:.1f} GB each way at "
              f"{d2h / 1e9:.1f} / {h2d / 1e9:.1f} GB/s{'' if 'h2d' in row else ' (median of the others)'}, "
              f"predicted {predicted:.3f} s (ratio {cost.ratio(row['swapped_bytes']):.2f} of plain), measured "
              f"{row['step_s']:.3f} s: measured / predicted {ratios[-1]:.2f}")
    print(f"measured / predicted: {min(ratios):.2f} to {max(ratios):.2f}, median {statistics.median(ratios):.2f} "
          f"over {len(ratios)} trials")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/h100-2026-11-23")
