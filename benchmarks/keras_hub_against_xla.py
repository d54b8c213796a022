"""The JAX replay's peak without LMS against XLA's own figure for the compiled loss and gradient, on KerasHub's
GPT-2 and BERT backbones (4 layers, hidden 128, sequence 128, batch 8; tests/hub.py): the replay less the
optimizer state (the loss and gradient read none of it) over ``memory_analysis()``'s arguments + outputs +
temporaries - aliased.

    python benchmarks/keras_hub_against_xla.py
"""
import os, sys
os.environ["KERAS_BACKEND"] = "jax"; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, numpy as np
from lms_magic.lms.jax.predictor import JaxStepPredictor
from lms_magic.lms.jax.residuals import differentiated, named_residuals
from tests.hub import language_model, tokens
MIB = 2**20
for kind in ("gpt2", "bert"):
    model = language_model(kind, layers=4, hidden=128, sequence=128)
    x, y = tokens(kind, n=8)
    p = JaxStepPredictor(model, (x, y))
    plain = p.predict(0, 1, 8)
    inner, args = p._inner_and_args(8)
    function, specs = differentiated(named_residuals(inner), args)
    a = jax.jit(function).lower(*specs).compile().memory_analysis()
    xla = a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes
    opt = sum(t.nbytes for t in p._persistent if t.kind == "optimizer_state")
    comparable = plain.peak_bytes - opt
    print(f"{kind}: replay without LMS {plain.peak_bytes / MIB:.1f} MiB, {comparable / MIB:.1f} without the optimizer state; XLA's compiled loss-and-gradient {xla / MIB:.1f} MiB (temp {a.temp_size_in_bytes / MIB:.1f}); replay/XLA {comparable / xla:.3f}")
