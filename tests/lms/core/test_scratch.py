"""Each kernel's scratch: read off an allocator's events, held at its op in the replay, sized at other batches."""

from lms_magic.lms.core.peak import SCRATCH_KIND, LiveTensor, explain_peak
from lms_magic.lms.core.scratch import Allocation, KernelScratch, kernel_scratch
from lms_magic.lms.core.simulate import Node, replay

MiB = 2**20


def test_an_ops_scratch_is_the_most_its_temporaries_held_at_once_and_outputs_are_not_scratch():
    events = [Allocation("step/conv/Conv2DBackpropFilter", "temp", 8 * MiB, 1, False),
              Allocation("step/conv/Conv2DBackpropFilter", "temp", 4 * MiB, 2, False),
              Allocation("step/conv/Conv2DBackpropFilter", "output", 64 * MiB, 3, False),
              Allocation("", "", 8 * MiB, 1, True),
              Allocation("step/conv/Conv2DBackpropFilter", "temp", 6 * MiB, 1, False),  # the address used again
              Allocation("", "", 6 * MiB, 1, True),
              Allocation("", "", 4 * MiB, 2, True),
              Allocation("step/dense/MatMul", "temp", 1024, 4, False)]  # under the smallest scratch counted
    found = kernel_scratch(events, op_name=lambda name: name.removeprefix("step/"))
    assert found == {"conv/Conv2DBackpropFilter": 12 * MiB}


def test_scratch_that_grows_with_the_batch_follows_its_line_and_scratch_sized_otherwise_the_nearest_measured():
    found = KernelScratch({4: {"workspace": 40 * MiB, "blocking": 32 * MiB, "once": 3 * MiB},
                           8: {"workspace": 80 * MiB, "blocking": 27 * MiB}})
    assert found.at(16) == {"blocking": 27 * MiB, "once": 3 * MiB, "workspace": 160 * MiB}
    assert found.at(2) == {"blocking": 32 * MiB, "once": 3 * MiB, "workspace": 40 * MiB}  # never below the smaller
    assert found.at(6)["blocking"] == int(29.5 * MiB)
    assert KernelScratch({8: {"blocking": 27 * MiB}}).at(64) == {"blocking": 27 * MiB}


def test_scratch_held_as_an_output_nobody_reads_counts_while_its_kernel_runs_and_is_named_as_scratch():
    def graph(scratch: int) -> list[Node]:
        return [Node("x", (10 * MiB,)), Node("grad", (10 * MiB, scratch) if scratch else (10 * MiB,), (("x", 0),)),
                Node("update", (MiB,), (("grad", 0),))]

    without, held = replay(graph(0), explain=True), replay(graph(30 * MiB), explain=True)
    assert held.peak_bytes - without.peak_bytes == 30 * MiB
    assert held.live_bytes[-1] == without.live_bytes[-1]  # gone once the kernel is done

    def describe(tensor):
        name, index = tensor
        return LiveTensor(name, "conv", None, 0, SCRATCH_KIND if (name, index) == ("grad", 1) else "gradients")

    peak = explain_peak(held, describe, [], "backward", "grad")
    assert peak["by_kind"][SCRATCH_KIND] == 30 * MiB


def test_the_words_name_the_layers_whose_kernels_hold_the_most():
    found = KernelScratch({8: {"model/conv2d_3/Conv2DBackpropFilter": 24 * MiB, "model/conv2d_1/Conv2D": MiB,
                               "model/conv2d_3/Conv2DBackpropInput": 9 * MiB}})
    words = found.words(8, lambda op: op.split("/")[1], top=2)
    assert words == "conv2d_3's kernel scratch 24.0 MiB, conv2d_1's kernel scratch 1.0 MiB"
