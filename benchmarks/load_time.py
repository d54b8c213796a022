"""Time of `%load_ext lms_magic` in a fresh interpreter (goal: under 0.3 s).

Each run starts a new Python, creates an IPython shell, and times only the
load_ext call. Prints the median and the worst of N runs.
"""

import statistics
import subprocess
import sys

from common import child_env, report, runs_figure

CODE = """
import time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
start = time.perf_counter()
shell.run_line_magic("load_ext", "lms_magic")
print(time.perf_counter() - start)
"""


def main(runs: int = 10) -> None:
    times_s = [float(subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                                    env=child_env()).stdout.split()[-1]) for _ in range(runs)]
    print(f"load_ext lms_magic: median {statistics.median(times_s) * 1000:.1f} ms, "
          f"max {max(times_s) * 1000:.1f} ms over {runs} fresh interpreters (goal < 300 ms)")
    report([runs_figure("%load_ext lms_magic in a fresh interpreter", times_s, "ms", 1000, "< 300 ms")])


if __name__ == "__main__":
    main()
