"""``%%lms_fit --batch-size max`` on lms_demo's CNN on a simulated 64 MiB device: the whole cell (choose, confirm,
train) against the same fit at the batch it chose, with the same LMS options, alone.

Each cell runs in a fresh process (the cell's time, not the process's), alternately, in pairs: the ratio per pair.

    python benchmarks/batch_size_max.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from common import CODE, child_env, ratio_figure, report, runs_figure

PAIRS, SAMPLES, MEMORY = 3, 2048, "64MiB"
SETUP = f"""
import lms_magic
lms_magic.simulate_accelerator(memory="{MEMORY}")
import keras, numpy as np
keras.utils.set_random_seed(2)
model = keras.Sequential([keras.Input((128, 128, 3))]
                         + [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(8)]
                         + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x, y = rng.random(({SAMPLES}, 128, 128, 3), dtype="float32"), rng.integers(0, 10, {SAMPLES})
"""


def cell(line: str, batch: int | None) -> dict:
    """Runs ``%%lms_fit`` ``line`` over one epoch's fit (at ``batch`` where given) in a fresh IPython: its time, its
    steps, and the batch and LMS options ``--batch-size max`` chose (from what it printed)."""
    import contextlib
    import io
    import re

    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "lms_magic")
    assert shell.run_cell(SETUP).success
    batch_size = "" if batch is None else f", batch_size={batch}"
    printed = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        result = shell.run_cell(f"%%lms_fit {line}\nh = model.fit(x, y, epochs=1, verbose=0{batch_size})")
    seconds = time.perf_counter() - started
    assert result.success, result.error_in_exec
    text = printed.getvalue()
    said = re.search(r"--batch-size max: batch (\d+), (with `%%lms_fit(?P<options>[^`]*)`|without LMS)", text)
    chosen = None if not said else (int(said.group(1)), (said.group("options") or "").strip()
                                    if said.group(2).startswith("with") else "--n-tensors 0")
    print(text[:3000])
    return {"seconds": seconds, "steps": shell.user_ns["h"].params["steps"], "chosen": chosen}


def child(line: str, batch: int | None = None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--cell", line] + ([str(batch)] if batch else []),
                          capture_output=True, text=True, timeout=900, env=child_env(), cwd=CODE)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    print(done.stdout[-3000:], flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    chosen = None
    whole, alone, ratios = [], [], []
    for _ in range(PAIRS):
        found = child("--batch-size max")
        chosen = chosen or found["chosen"]
        fixed = child(chosen[1], chosen[0])
        assert fixed["steps"] == found["steps"]  # the same fit
        whole.append(found["seconds"])
        alone.append(fixed["seconds"])
        ratios.append(found["seconds"] / fixed["seconds"])
    what = f"batch {chosen[0]}, %%lms_fit {chosen[1]}".rstrip()
    report([runs_figure("%%lms_fit --batch-size max, the whole cell (lms_demo's CNN, 64 MiB)", whole, "s"),
            runs_figure(f"the same fit alone ({what})", alone, "s"),
            ratio_figure("--batch-size max over the fit at its batch alone", ratios, goal="under 2")])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cell"]:
        print(json.dumps(cell(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)))
    else:
        main()
