"""Keras's private API (and tf.data's, which Keras's data adapters hand on) and the checks of whether TensorFlow's
and JAX's runtimes have started: the package's private framework access outside the backend folders, whose own is
in ``lms/tensorflow/internals.py`` (graph collection, graph surgery, the model's layer tree),
``lms/torch/internals.py`` (the layers being called, cuBLAS's workspaces) and ``lms/jax/internals.py`` (a jaxpr
equation bound again). Its sections, one job each: attributes replaced and restored, the model's private parts,
graph release, the calling ``fit``'s frames, a fit's data as Keras reads it, the runtimes. The one interceptor of
``keras.Model.fit`` is ``fit_interceptor.py`` (it reaches nothing private).

The rest of the package calls these helpers, never a private attribute, so a framework release that moves one
of them breaks here (``versions.py`` holds the tested range). Importing this module imports no framework:
each helper imports what it needs.
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from typing import Callable, Iterator

MISSING = object()  # an attribute the owner did not have


# -- attributes replaced inside a block, exactly restored after it ----------------------------------------
@contextlib.contextmanager
def instance_attribute_replaced(owner, name: str, value) -> Iterator[None]:
    """Inside the block ``owner.name`` is ``value``, an attribute of the instance over its class's (set past
    Keras's tracking); after it, exactly as before (the instance's own value, or none), however the block ends.

    Example:
        >>> import types
        >>> box = types.SimpleNamespace()
        >>> with instance_attribute_replaced(box, "call", print):
        ...     inside = box.call is print
        >>> inside, hasattr(box, "call")
        (True, False)
    """
    saved = owner.__dict__.get(name, MISSING)
    object.__setattr__(owner, name, value)
    try:
        yield
    finally:
        if saved is MISSING:
            owner.__dict__.pop(name, None)
        else:
            object.__setattr__(owner, name, saved)


@contextlib.contextmanager
def train_step_replaced(model, train_step: Callable, jit_off: bool = True) -> Iterator[None]:
    """``model.train_step`` is ``train_step`` and XLA is off (``jit_off``) inside the block; exactly as before
    after it.

    Keras reads ``train_step`` when it makes the train function (Keras 3.15) or
    when it traces it (Keras 3.5), and ``jit_compile`` when it makes it, so
    both are set for the making and for every call of an LMS train function.
    """
    saved_jit = model._jit_compile
    if jit_off:
        model._jit_compile = False
    try:
        with instance_attribute_replaced(model, "train_step", train_step):
            yield
    finally:
        model._jit_compile = saved_jit


@contextlib.contextmanager
def layer_calls_replaced(layers: list, make: Callable) -> Iterator[None]:
    """Inside the block each layer's ``call`` is ``make(layer, call)`` (an attribute of the instance, over its
    class's); after it, each is exactly as before, however the block ends.

    Example:
        >>> import keras
        >>> layer = keras.layers.ReLU()
        >>> with layer_calls_replaced([layer], lambda layer, call: (lambda *args, **kwargs: "replaced")):
        ...     inside = layer.call(None)
        >>> inside, "call" in vars(layer)
        ('replaced', False)
    """
    with contextlib.ExitStack() as stack:
        for layer in layers:
            stack.enter_context(instance_attribute_replaced(layer, "call", make(layer, layer.call)))
        yield


# -- a Keras model's private parts: its layer tree, XLA, its state built before tracing ---------------------
def layers_of(model) -> list:
    """Every layer of ``model``, nested ones included."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def layer_types(model) -> dict[str, str]:
    """Every layer of ``model``, nested ones included: layer name -> class name (the first of a name wins)."""
    found: dict[str, str] = {}
    for layer in layers_of(model):
        found.setdefault(layer.name, type(layer).__name__)
    return found


def jit_compile_requested(model) -> bool:
    """Whether the model would compile its train step with XLA / torch.compile."""
    return bool(model.jit_compile)


def build_for_training(model, data_batch) -> bool:
    """Builds the model's metrics and loss on ``data_batch`` as a first ``fit`` does; False where Keras can't."""
    build = getattr(model, "_symbolic_build", None)
    if build is None:
        return False
    build(data_batch=data_batch)
    return True


def build_before_trace(model, element_spec) -> bool:
    """Builds the model's metrics, loss and optimizer state on the batch's ``element_spec`` (the train function's
    iterator's) before its first trace, as Keras does itself under a distribution strategy. Without one, Keras builds
    them inside the first trace, and TensorFlow traces a function whose first trace made variables a second time.

    False where nothing was built: nothing left to build, a distribution strategy (Keras builds them in its scope
    before a fit's first trace), a layer not built yet (its initial weights are drawn in the trace, as Keras draws
    them), a batch not of dense tensors, or a build that failed (the trace builds what this did not, as without it).
    """
    import tensorflow as tf

    if getattr(model, "_distribute_strategy", None) is not None:
        return False
    leaves = tf.nest.flatten(element_spec) if element_spec is not None else []
    if not leaves or not all(type(leaf) is tf.TensorSpec for leaf in leaves):
        return False
    parts = (getattr(model, "optimizer", None), getattr(model, "_compile_metrics", None),
             getattr(model, "_compile_loss", None))
    if all(part is None or part.built for part in parts):
        return False
    if not all(layer.built for layer in model._flatten_layers()):
        return False
    try:
        return _built_from_outputs(model, element_spec) or build_for_training(model, element_spec)
    except Exception:  # a best effort: the first trace builds what this did not
        return False


def _built_from_outputs(model, element_spec) -> bool:
    """``Trainer._symbolic_build`` without the symbolic forward pass: the metrics and loss built on the outputs
    a Functional (or a Sequential's) graph holds; False (nothing built) for any other model, or outputs whose
    dimensions past the first are not all known."""
    import keras
    from keras.src.models.functional import Functional
    from keras.src.trainers import data_adapters

    graph = model._functional if type(model).call is keras.Sequential.call else model
    if not isinstance(graph, Functional) or type(graph).call is not Functional.call:
        return False
    outputs = graph._outputs_struct
    flat = keras.tree.flatten(outputs)
    if not all(None not in tuple(tensor.shape)[1:] for tensor in flat):
        return False
    batch = keras.tree.map_structure(lambda spec: keras.KerasTensor(spec.shape, spec.dtype.name), element_spec)
    x, y, sample_weight = data_adapters.data_adapter_utils.unpack_x_y_sample_weight(batch)
    first = keras.tree.flatten(x)[0].shape[0]
    y_pred = keras.tree.map_structure(
        lambda tensor: keras.KerasTensor((first if tensor.shape[0] is None else tensor.shape[0], *tensor.shape[1:]),
                                         tensor.dtype), outputs)
    compute_output_spec = keras.src.backend.compute_output_spec
    if model._compile_metrics is not None and not model._compile_metrics.built:
        compute_output_spec(model.compute_metrics, x, y, y_pred, sample_weight=sample_weight)
    if model._compile_loss is not None and not model._compile_loss.built:
        compute_output_spec(model._compute_loss, x, y, y_pred, sample_weight=sample_weight, training=False)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    getattr(model, "_post_build", lambda: None)()
    return True


# -- Keras's Functional graphs, each intermediate released after its last reader --------------------------
def _graphs_of(model) -> list:
    """Every Keras graph (Functional) that runs when ``model`` is called: its own, a Sequential's, nested ones."""
    graphs = []
    for layer in [model, *model._flatten_layers(include_self=False, recursive=True)]:
        graph = getattr(layer, "_functional", None) or layer  # a Sequential keeps its graph in _functional
        if hasattr(graph, "_nodes_by_depth") and all(graph is not seen for seen in graphs):
            graphs.append(graph)
    return graphs


def _release_plan(graph) -> list[tuple[object, tuple[int, ...]]]:
    """(node arguments, ids of the tensors no later node reads) for each node of ``graph``, in Keras's run order."""
    outputs = {id(tensor) for tensor in graph.outputs}
    last_reader: dict[int, object] = {}
    for depth in sorted(graph._nodes_by_depth, reverse=True):  # the order Function._run_through_graph runs
        for node in graph._nodes_by_depth[depth]:
            if node.operation and not node.is_input:
                for tensor in node.input_tensors:
                    last_reader[id(tensor)] = node
    dropped: dict[int, list[int]] = defaultdict(list)
    for key, node in last_reader.items():
        if key not in outputs:
            dropped[id(node)].append(key)
    return [(node.arguments, tuple(dropped[id(node)])) for node in last_reader.values() if dropped[id(node)]]


def graph_release_plan(model) -> list:
    """What ``graph_intermediates_released`` drops, for every Keras graph of ``model`` (made once per fit)."""
    return [entry for graph in _graphs_of(model) for entry in _release_plan(graph)]


@contextlib.contextmanager
def graph_intermediates_released(plan: list) -> Iterator[None]:
    """Inside the block, a Keras graph drops each intermediate tensor once the last layer that reads it has it.

    ``Function._run_through_graph`` keeps every layer's output in a dict
    until the whole forward pass is over: harmless where a graph compiler
    frees tensors by use (TensorFlow, JAX), but in eager PyTorch it keeps
    every activation on the device to the end of the forward pass, so
    activations offloaded to the host could not free their device memory
    before the peak. Only references are dropped: the values are the same.
    ``plan`` is ``graph_release_plan(model)``.
    """
    patched = []
    try:
        for arguments, keys in plan:
            if "fill_in" in arguments.__dict__:
                continue  # a node shared by two plans (a nested graph seen twice): patched once
            original = arguments.fill_in

            def fill_in(tensor_dict, _original=original, _keys=keys):
                filled = _original(tensor_dict)
                for key in _keys:
                    tensor_dict.pop(key, None)
                return filled

            arguments.fill_in = fill_in
            patched.append(arguments)
        yield
    finally:
        for arguments in patched:
            arguments.__dict__.pop("fill_in", None)


# -- the Keras fit that called a callback, read from its stack frames ---------------------------------------
def calling_frames(depth: int = 8) -> tuple:
    """The frames that called the caller (a callback's hook: Keras's fit among them).

    The frames themselves, not their ids: a frame of a fit that ended is
    freed, and a later fit's frame can take its address (a plain fit was
    once taken for the LMS fit that way). Holding them keeps that from
    happening; the holder lets go of them at the next call.
    """
    frame, found = sys._getframe(2), []
    while frame is not None and len(found) < depth:
        found.append(frame)
        frame = frame.f_back
    return tuple(found)


def called_from(frames: tuple) -> bool:
    """Whether the caller's caller is one of ``frames`` (the same fit that armed a train function)."""
    caller = sys._getframe(2)
    return any(frame is caller for frame in frames)


def fit_batch_size(frames) -> tuple[int | None, str]:
    """The batch size of the Keras ``fit`` among ``frames`` (a callback's callers), and where it was read.

    The largest batch the data yields: the fit call's ``batch_size`` for arrays, the leading dimension of
    the first batch of a generator (which Keras has already drawn) or of a PyDataset (read once here),
    the batch of a ``tf.data`` pipeline's ``batch()``. ``(None, "")`` where none is found.
    """
    for frame in frames:
        iterator = frame.f_locals.get("epoch_iterator") if frame.f_code.co_name == "fit" else None
        adapter = getattr(iterator, "data_adapter", None)
        if adapter is not None:
            return _adapter_batch_size(adapter)
    return None, ""


def close_stopped_epoch(frames) -> bool:
    """Closes the epoch of the Keras ``fit`` among ``frames`` (a callback's callers) that a callback stopped with
    ``model.stop_training``; whether one was closed. Stopped at a step, Keras's epoch generator stays suspended,
    in a cycle with its epoch iterator and the data's iterator (tf.data's threads with it): only a full collection
    of Python's collector would free them, and many freed at once stall the process for seconds."""
    for frame in frames:
        iterator = frame.f_locals.get("epoch_iterator") if frame.f_code.co_name == "fit" else None
        generator = getattr(iterator, "_epoch_iterator", None)
        if generator is not None and hasattr(generator, "close"):
            generator.close()
            return True
    return False


def _leading_dimension(batch) -> int | None:
    leaf = batch
    while isinstance(leaf, (tuple, list, dict)) and leaf:
        leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
    shape = getattr(leaf, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) and shape[0] is not None else None


def _adapter_batch_size(adapter) -> tuple[int | None, str]:
    try:
        size = adapter.batch_size
    except Exception:  # an adapter kind that cannot say
        size = None
    if size:
        kind = type(adapter).__name__
        source = "the dataset's batch" if "TFDataset" in kind else "the fit call's batch_size"
        return int(size), source
    first_batches = getattr(adapter, "_first_batches", None)  # a generator: Keras drew these already
    if first_batches:
        return _leading_dimension(first_batches[0]), "the generator's first batch"
    py_dataset = getattr(adapter, "py_dataset", None)
    if py_dataset is not None:
        try:
            return _leading_dimension(py_dataset[0]), "the PyDataset's first batch"
        except Exception:
            return None, ""
    dataset = getattr(adapter, "_dataset", None)
    while dataset is not None:  # a tf.data pipeline: the batch() that made its batches
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            try:
                return int(size), "the dataset's batch()"
            except (TypeError, ValueError):
                return None, ""
        dataset = getattr(dataset, "_input_dataset", None)
    return None, ""


# -- a fit's data, as Keras's own adapters read it --------------------------------------------------------
def reshuffles_each_iteration(data) -> bool:
    """Whether ``data`` is a tf.data pipeline with a shuffle that draws a new order for each pass.

    Such a shuffle keeps its seed state inside the dataset, beyond
    ``keras.utils.set_random_seed``: two passes from the same seed see
    different orders (measured with and without ``seed=``).
    """
    if not type(data).__module__.startswith("tensorflow"):
        return False
    pending, seen = [data], set()
    while pending:
        dataset = pending.pop()
        if id(dataset) in seen:
            continue
        seen.add(id(dataset))
        if getattr(dataset, "_reshuffle_each_iteration", False) is True:
            return True
        inputs = getattr(dataset, "_inputs", None)
        if callable(inputs):
            try:
                pending.extend(inputs())
            except Exception:  # a dataset kind without inputs to walk
                pass
    return False


def numpy_batches(x, y=None, sample_weight=None, class_weight=None):
    """The batches ``fit(x, y, sample_weight=..., class_weight=...)`` trains on, as NumPy, from Keras's own data
    adapter: arrays (in batches of Keras's default 32), dicts of arrays, ``tf.data``, ``PyDataset``, grain
    datasets, whatever Keras accepts. Each is ``x`` or ``(x, y)`` or ``(x, y, sample_weight)``."""
    from keras.src.trainers.data_adapters import get_data_adapter

    adapter = get_data_adapter(x, y=y, sample_weight=sample_weight, class_weight=class_weight, shuffle=False)
    return adapter.get_numpy_iterator()


# -- runtimes, asked without starting them -----------------------------------------------------------------
def tensorflow_started(modules) -> bool:
    """Whether TensorFlow's runtime has started (asking it anything would start it and fix its GPU settings)."""
    context_module = modules.get("tensorflow.python.eager.context")
    return context_module is not None and bool(getattr(context_module.context(), "_initialized", False))


def jax_started(modules) -> bool:
    """Whether JAX's backends exist (asking for devices would create them and take GPU memory)."""
    bridge = modules.get("jax._src.xla_bridge")
    return bridge is not None and bool(getattr(bridge, "_backends", None))
