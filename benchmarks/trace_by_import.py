"""Whether a second trace of the train step can be had without tracing: the first trace's GraphDef with its batch
size changed, imported (TensorFlow's own shape inference), against a real trace at that batch.

Traced at a prime batch size ``--first``, every int constant that is a multiple of it (the static shapes TensorFlow
bakes into the gradient's ops) and the inputs' batch dimension are scaled to ``--second``; each variable read
becomes a placeholder of its shape (an imported resource loses its shape). Printed: the seconds of the trace, the
rewrite and the import, and how many tensors' shapes differ from a real trace at ``--second``. At a batch size
with common multiples (64: the channel counts) the constants cannot be told apart, so this holds for a prime first
batch only. The first measurement of it: ``explain_fit`` uses ``lms_magic/lms/tensorflow/batch_import.py``'s
version (each variable a handle of its shape, constants of one value resized, the shapes checked;
``benchmarks/explain_import_check.py``).

    python benchmarks/trace_by_import.py --first 61 --second 67
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ResNet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--first", type=int, default=61)
    parser.add_argument("--second", type=int, default=67)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    from lms_magic import internals

    model = getattr(keras.applications, args.model)(weights=None, input_shape=(args.size, args.size, 3))
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")

    def trace(batch: int):
        specs = (tf.TensorSpec([batch, args.size, args.size, 3], tf.float32), tf.TensorSpec([batch], tf.int32))
        internals.build_before_trace(model, specs)
        started = time.perf_counter()
        graph = tf.function(model.train_step, autograph=False).get_concrete_function(specs).graph
        return graph, time.perf_counter() - started

    def shapes(graph) -> dict:
        return {t.name: t.shape.as_list() if t.shape.rank is not None else None
                for op in graph.get_operations() for t in op.outputs}

    first, trace_s = trace(args.first)
    started = time.perf_counter()
    graph_def, read_shapes = first.as_graph_def(), {op.name: op.outputs[0].shape for op in first.get_operations()
                                                     if op.type == "ReadVariableOp"}
    scaled = 0
    for node in graph_def.node:
        if node.op == "ReadVariableOp":  # a placeholder of the variable's shape
            dtype = node.attr["dtype"].type
            node.op = "Placeholder"
            del node.input[:]
            node.attr.clear()
            node.attr["dtype"].type = dtype
            node.attr["shape"].shape.CopyFrom(read_shapes[node.name].as_proto())
        elif node.op == "Placeholder":
            for dim in node.attr["shape"].shape.dim:
                if dim.size > 0 and dim.size % args.first == 0:
                    dim.size = dim.size // args.first * args.second
                    scaled += 1
        elif node.op == "Const" and node.attr["dtype"].type in (tf.int32.as_datatype_enum, tf.int64.as_datatype_enum):
            value = tensor_util.MakeNdarray(node.attr["value"].tensor)
            hit = (value % args.first == 0) & (value != 0)
            if hit.any():
                value = np.where(hit, value // args.first * args.second, value).astype(value.dtype)
                node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
                scaled += 1
    rewrite_s = time.perf_counter() - started
    started = time.perf_counter()
    imported = tf.Graph()
    try:
        with imported.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except ValueError as error:  # a constant scaled that was not the batch: shapes that cannot meet
        print(f"traced at {args.first}: the import at {args.second} fails: {str(error).splitlines()[0][:300]}")
        return
    import_s = time.perf_counter() - started
    second, second_s = trace(args.second)
    got, real = shapes(imported), shapes(second)
    differ = [name for name in real if got.get(name, "missing") != real[name]]
    print(f"TensorFlow {tf.__version__}, {args.model} {args.size}x{args.size}: traced at {args.first} in {trace_s:.1f} s; "
          f"{scaled} inputs and constants scaled to {args.second} in {rewrite_s:.2f} s, imported in {import_s:.2f} s; "
          f"a real trace at {args.second} took {second_s:.1f} s")
    print(f"{len(real)} tensors, the same names: {set(got) == set(real)}; shapes that differ: {len(differ)} "
          f"{differ[:5]}")


if __name__ == "__main__":
    main()
