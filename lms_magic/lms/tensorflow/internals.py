"""TensorFlow's private API, in one place for the TensorFlow backend: the executed graphs collected, the graph
surgery of the rewrite (control inputs, inputs replaced, ops cloned and placed), a variable read through its handle,
a GPU's memory limit, and the Keras model's layer tree its scopes are read against.

The rest of the folder calls these helpers, never a private attribute, so a TensorFlow release that moves one of
them breaks here (``lms_magic/versions.py`` holds the tested range).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def collected_function_graphs(collected: Callable) -> Iterator[None]:
    """Calls ``collected`` with the RunMetadata of the functions instantiated inside the block, where there is one.

    Uses the eager context's graph collection, not ``enable_run_metadata``:
    once that has been enabled, disabling it does not stop TensorFlow from
    keeping every later function's graphs in memory (4,079 graphs, +108 MiB
    after 120 plain fit/predict/evaluate calls). Graph collection stops when
    disabled, and exporting drains what it kept.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_graph_collection()
    try:
        yield
    finally:
        try:
            metadata = ctx.export_run_metadata()
        finally:
            ctx.disable_graph_collection()
        if metadata is not None:
            collected(metadata)


def graph_collection_stopped() -> None:
    """Stops the graph collection ``collected_function_graphs`` started (inside its block): nothing more is kept."""
    from tensorflow.python.eager import context

    context.context().disable_graph_collection()


def tensorflow_memory_limit(gpu_index: int) -> int | None:
    """The memory limit (bytes) set on the ``gpu_index``-th GPU's logical device, or None where none was set."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpu_index >= len(gpus):
        return None
    configured = tf.config.get_logical_device_configuration(gpus[gpu_index]) or []
    limit = getattr(configured[0], "memory_limit", None) if configured else None
    return None if limit is None else int(limit) * 2**20  # TensorFlow takes it in MiB


def in_function_graph() -> bool:
    """Whether code runs while TensorFlow traces a ``tf.function`` (not eagerly)."""
    import tensorflow as tf
    from tensorflow.python.framework import func_graph

    return isinstance(tf.compat.v1.get_default_graph(), func_graph.FuncGraph)


def add_control_input(op, trigger) -> None:
    """``op`` runs only after ``trigger`` (in a graph still being built)."""
    op._add_control_input(trigger)


def remove_control_input(op, trigger) -> None:
    """``op`` no longer waits for ``trigger`` (its other control inputs stay)."""
    kept = [control for control in op.control_inputs if control is not trigger]
    op._remove_all_control_inputs()
    op._add_control_inputs(kept)


def replace_input(op, index: int, tensor) -> None:
    """``op``'s input ``index`` becomes ``tensor``."""
    op._update_input(index, tensor)


def clone_op(graph, op, inputs, name: str):
    """A copy of ``op`` in ``graph`` (its type, attributes and device) that reads ``inputs``."""
    attrs = {key: value for key, value in op.node_def.attr.items() if not key.startswith("_")}
    clone = graph._create_op_internal(op.type, list(inputs), dtypes=[t.dtype for t in op.outputs], name=name,
                                      attrs=attrs, op_def=op.op_def)
    if op.device:
        clone._set_device(op.device)
    return clone


def pass_through_op(graph, op_type: str, tensor, name: str, shape=None):
    """``tf.raw_ops.<op_type>(input=tensor, name=name)`` (and ``shape=shape``: ``EnsureShape``) in ``graph``, made
    without the op-definition library's argument handling (most of the swap ops' making, under a profiler): the
    same node, device and name. Its output."""
    from tensorflow.core.framework import attr_value_pb2

    attrs = {"T": attr_value_pb2.AttrValue(type=tensor.dtype.as_datatype_enum)}
    if shape is not None:
        attrs["shape"] = attr_value_pb2.AttrValue(shape=shape.as_proto())
    return graph._create_op_internal(op_type, [tensor], [tensor.dtype], name=name, attrs=attrs).outputs[0]


def variable_of_handle(tensor):
    """The (dtype, shape) of the variable a resource ``tensor`` of a traced graph holds (a captured variable's
    placeholder), or None where the graph did not record it."""
    import tensorflow as tf
    from tensorflow.python.ops import handle_data_util

    data = handle_data_util.get_resource_handle_data(tensor)
    if not data.shape_and_type:
        return None
    shape_and_type = data.shape_and_type[0]
    return tf.dtypes.as_dtype(shape_and_type.dtype), tf.TensorShape(shape_and_type.shape)


def output_itemsizes(node) -> tuple[int, ...] | None:
    """The bytes an element of each output of an executed graph's ``node`` (a NodeDef) takes, read from its op's
    registered definition and its type attributes; None where the op or a type is not known (a function's own
    op, a variant, a string)."""
    from tensorflow.python.framework import dtypes, op_def_registry

    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return None
    types = []
    for arg in op_def.output_arg:
        if arg.type_list_attr:
            found = list(node.attr[arg.type_list_attr].list.type) if arg.type_list_attr in node.attr else None
        else:
            kind = arg.type or (node.attr[arg.type_attr].type if arg.type_attr in node.attr else None)
            count = node.attr[arg.number_attr].i if arg.number_attr and arg.number_attr in node.attr else 1
            found = None if kind is None else [kind] * count
        if found is None:
            return None
        types += found
    try:
        sizes = tuple(dtypes.as_dtype(kind).size for kind in types)
    except TypeError:
        return None
    return sizes if all(sizes) else None


def set_op_device(op, device: str) -> None:
    """Places ``op`` on ``device``."""
    op._set_device(device)


def layer_tree(model) -> tuple[str, dict]:
    """``model``'s name and its layers as a tree: ``{name: (class name, {child name: ...})}``, each layer's
    direct sublayers under it (a name is unique among a parent's children, not across the model)."""
    def children(layer) -> dict:
        found: dict = {}
        for child in layer._flatten_layers(include_self=False, recursive=False):
            found.setdefault(child.name, (type(child).__name__, children(child)))
        return found

    return model.name, children(model)


@contextlib.contextmanager
def step_profiled(recorded: Callable, deferred: bool = False) -> Iterator[Callable[[], None]]:
    """Calls ``recorded`` with what TensorFlow's profiler saw in the block (a train step): a
    ``core.scratch.StepProfile`` of the busiest allocator's events in time order (each allocation with the op that made it and its region:
    "output", "temp"...; each free; the bytes in use after each) and each op's run (its first start and last end).
    Where the profiler cannot run (another session is on, as a ``TensorBoard(profile_batch=...)`` holds one), the
    block runs and ``recorded`` is not called.

    The block gets a function that starts the profiler where it has not started yet. ``deferred``: the profiler
    starts only when the block calls it (once the step's trace has ended: a trace makes tens of thousands of
    events that are not the step's, and the profiler's stop and reading cost in proportion), and where the block
    never does, nothing is recorded.

    The events are read from the profile the public ``tf.profiler.experimental`` writes, with the profiler's
    ``XSpace`` message (a TensorFlow proto outside its public API).
    """
    import glob
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="lms_profile_") as folder:
        running = None  # once start() is called: whether the profiler started

        def start() -> None:
            nonlocal running
            if running is None:
                running = _profiler_started(folder)

        if not deferred:
            start()
        try:
            yield start
        finally:
            if running:
                tf.profiler.experimental.stop()
        if not running:
            return
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        from ..core.scratch import StepProfile
        from ..core.simulate import collector_paused

        events, runs = [], {}
        with collector_paused():  # tens of thousands of events, read into small objects
            for path in glob.glob(f"{folder}/plugins/profile/*/*.xplane.pb"):
                with open(path, "rb") as file:
                    _read_space(xplane_pb2.XSpace.FromString(file.read()), events, runs)
        allocators: dict = {}
        for _, allocator, event in events:
            if not event.freed:
                allocators[allocator] = allocators.get(allocator, 0) + 1
        busiest = max(allocators, key=allocators.get, default=None)
        ours = {event.address for _, allocator, event in events if allocator == busiest and not event.freed}
        recorded(StepProfile([event for _, allocator, event in sorted(events, key=lambda found: found[0])
                              if allocator == busiest or event.freed and not allocator and event.address in ours],
                             runs))


def _profiler_started(folder: str) -> bool:
    """Whether TensorFlow's profiler started, to write into ``folder`` (not where another session is on, or the
    build has none)."""
    import tensorflow as tf

    try:
        tf.profiler.experimental.start(folder)
    except Exception:
        return False
    return True


def _read_space(space, events: list, runs: dict) -> None:
    """Adds ``space``'s (an XSpace) allocator events to ``events`` as (time in ps, allocator,
    ``core.scratch.Allocation``) and each op's run to ``runs`` (its name in the step: its first start and last end
    in ps), from the first run of a traced function on (``RUN_EVENT``): the first call of a function builds its
    graphs first (Grappler's constant folding alone allocates tens of thousands of times), and none of that is the
    step. The fields are read by their stats' metadata ids (a step has tens of thousands of events)."""
    from ..core.scratch import Allocation

    started_ps = _run_started_ps(space)
    for plane in space.planes:
        kinds = {key: value.name == "MemoryDeallocation" for key, value in plane.event_metadata.items()
                 if value.name in ("MemoryAllocation", "MemoryDeallocation")}
        op_names = {key: value.name.rsplit(":", 1)[0] for key, value in plane.event_metadata.items()
                    if ":" in value.name and "::" not in value.name}
        ids = {value.name: key for key, value in plane.stat_metadata.items()}
        wanted = {ids.get(name): name for name in ("tf_op", "region_type", "allocation_bytes", "addr",
                                                   "bytes_allocated", "allocator_name", "requested_bytes")}
        names = plane.stat_metadata
        for line in plane.lines:
            start_ps = line.timestamp_ns * 1000
            for event in line.events:
                time_ps = start_ps + event.offset_ps
                if time_ps < started_ps:
                    continue
                freed = kinds.get(event.metadata_id)
                if freed is None:
                    op = op_names.get(event.metadata_id)
                    if op is not None:
                        first, last = runs.get(op, (time_ps, time_ps))
                        runs[op] = (min(first, time_ps), max(last, time_ps + event.duration_ps))
                    continue
                read = {}
                for stat in event.stats:
                    name = wanted.get(stat.metadata_id)
                    if name is not None:
                        kind = stat.WhichOneof("value")
                        value = getattr(stat, kind)
                        read[name] = names[value].name if kind == "ref_value" and value in names else value
                events.append((time_ps, read.get("allocator_name", ""), Allocation(
                    "" if freed else str(read.get("tf_op", "")), "" if freed else str(read.get("region_type", "")),
                    int(read.get("allocation_bytes", 0) or 0), int(read.get("addr", 0) or 0), freed, time_ps,
                    int(read.get("bytes_allocated", 0) or 0), int(read.get("requested_bytes", 0) or 0))))


# the profiler's event of a traced function's run (TensorFlow's eager runtime), after its graphs are built
RUN_EVENT = "KernelAndDeviceFunc::Run"


def _run_started_ps(space) -> int:
    """When (ps) the first run of a traced function began in ``space``; 0 where none ran (everything is read)."""
    started = []
    for plane in space.planes:
        run_ids = {key for key, value in plane.event_metadata.items() if value.name == RUN_EVENT}
        if run_ids:
            started += [line.timestamp_ns * 1000 + event.offset_ps for line in plane.lines for event in line.events
                        if event.metadata_id in run_ids]
    return min(started, default=0)
