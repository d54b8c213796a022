"""What the host held of the simulated device's allocator along each swap's route, read off a step's profile (no
TensorFlow: a stand-in profile with the profiler's names)."""

from lms_magic.lms.core.scratch import Allocation, StepProfile
from lms_magic.lms.tensorflow.partitions import SwapRoute
from lms_magic.lms.tensorflow.shared_host import host_held, lms_step_held

MiB = 2**20
CALL = "StatefulPartitionedCall/"  # the scope the profiler puts before each op of the step
ROUTE = SwapRoute("model/relu", "Relu", 0, ("model/pool",), ("lms_swap_in/model/relu_0",),
                  ("grad/model/relu/lms_landed_0",))


def allocated(op, time_ps, address, in_use_mib, nbytes=MiB):
    return Allocation(CALL + op, "output", nbytes, address, False, time_ps, int(in_use_mib * MiB))


def freed(time_ps, address, in_use_mib, nbytes=MiB):
    return Allocation("", "", nbytes, address, True, time_ps, int(in_use_mib * MiB))


RUNS = {CALL + "model/relu": (10, 20), CALL + "model/pool": (20, 30), CALL + "lms_swap_in/model/relu_0": (60, 65),
        CALL + "grad/model/relu/lms_landed_0": (70, 75), CALL + "grad/model/relu_grad": (75, 80)}


def test_a_tensor_the_host_passed_on_is_the_hosts_from_its_last_device_reader_until_it_lands():
    # 1 MiB before the step; relu's output, then pool's; a 2 MiB gradient while the host holds relu's output
    events = [allocated("model/relu", 12, 1, 2), allocated("model/pool", 22, 2, 3),
              allocated("grad/model/pool_grad", 50, 6, 5, nbytes=2 * MiB), freed(55, 6, 3, nbytes=2 * MiB),
              freed(70, 2, 2), allocated("grad/model/relu_grad", 76, 3, 3), freed(90, 1, 2)]
    held, unseen = host_held(StepProfile(events, RUNS), [ROUTE], lambda name, op, index: MiB - 100)
    assert unseen == 0 and [(h.start_ps, h.end_ps, h.nbytes) for h in held] == [(30, 70, MiB)]  # landed in place
    assert lms_step_held(StepProfile(events, RUNS), [ROUTE], lambda *_: MiB) == (MiB, 4 * MiB, 0)  # 5 in use at 50


def test_where_the_host_copied_it_the_original_is_the_hosts_until_the_copy_and_the_copy_until_it_is_freed():
    events = [allocated("model/relu", 12, 1, 2), allocated("lms_swap_in/model/relu_0", 61, 4, 3), freed(66, 1, 2),
              allocated("grad/model/relu/lms_landed_0", 71, 5, 3), freed(76, 4, 2)]
    held, _ = host_held(StepProfile(events, RUNS), [ROUTE], lambda *_: MiB)
    assert sorted((h.start_ps, h.end_ps) for h in held) == [(30, 65), (61, 75)]  # the copy freed after landing


def test_a_route_the_profile_did_not_see_is_counted_not_guessed():
    events = [allocated("other", 12, 1, 2)]
    held, unseen = host_held(StepProfile(events, {}), [ROUTE], lambda *_: MiB)
    assert held == [] and unseen == 1


def test_a_tensor_grappler_made_in_place_of_the_traced_one_is_sized_by_the_tensor_its_swap_in_names():
    """Grappler rewrote the producer (``ArithmeticOptimizer/AddOpsRewrite_add``: not in the trace); the swap-in still
    names the traced tensor it brings back (``model/relu_0``: ``model/relu``'s output 0)."""
    renamed = ROUTE._replace(producer="model/ArithmeticOptimizer/AddOpsRewrite_add")
    runs = {**RUNS, CALL + renamed.producer: (10, 20)}
    events = [allocated("model/pool", 22, 2, 3)]
    traced = {("model/relu", 0): 3 * MiB}
    held, unseen = host_held(StepProfile(events, runs), [renamed], lambda name, op, index: traced.get((name, index)))
    assert unseen == 0 and [h.nbytes for h in held] == [3 * MiB]
