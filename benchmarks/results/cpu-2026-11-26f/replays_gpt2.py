"""Walks (TracedStep.replay calls) and seconds in explain_fit's frontier of a KerasHub GPT-2 from a config (12 layers,
768 wide, 512 tokens, AdamW), batch 8, 16 batch sizes 8-128, 16 GiB. Run: python replays_gpt2.py <repository root>."""
import os, sys, collections, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, sys.argv[1])
import lms_magic
from tests.hub import language_model, tokens
from lms_magic.lms.tensorflow.predict import TracedStep
from lms_magic.lms.tensorflow.predictor import StepPredictor
assert lms_magic.__file__.startswith(sys.argv[1]), lms_magic.__file__
walks, seconds, traces = collections.Counter(), collections.Counter(), []
replay, trace = TracedStep.replay, StepPredictor._trace
def counted(self, swaps=(), explain=False, resized=None):
    started = time.perf_counter()
    try:
        return replay(self, swaps, explain, resized)
    finally:
        kind = "lines (two sizes, one walk)" if resized is not None else "one batch size"
        walks[kind] += 1
        seconds[kind] += time.perf_counter() - started
TracedStep.replay = counted
StepPredictor._trace = lambda self, batch: traces.append((self.lean_ops, batch)) or trace(self, batch)
model = language_model("gpt2", layers=12, hidden=768, sequence=512)
data = tokens("gpt2", n=2, sequence=512)
started = time.perf_counter()
found = lms_magic.explain_fit(model, data, batch_size=8, capacity="16GiB", batch_sizes=list(range(8, 129, 8)))
print(f"explain_fit {time.perf_counter() - started:.1f} s; traces (lean_ops, batch): {traces}")
for kind in walks:
    print(f"  walks over {kind}: {walks[kind]}, {seconds[kind]:.1f} s")
print(found)
