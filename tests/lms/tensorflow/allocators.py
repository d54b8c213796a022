"""Stand-ins for a device's allocator as LMS reads it after a checked step (``LMS.allocator``), for the tests of
what LMS does with the reading (a GPU's is read on a GPU; the simulated device is read off the step's profile)."""


class Allocator:
    """A device's allocator as LMS reads it: each step holds ``step_bytes(swapped tensors)`` over the ``held``
    before it (``swapped``: the count of the plan running, from its callback's stats)."""

    framework, device, gpu_index, resettable = "TensorFlow", "GPU:0", 0, True

    def __init__(self, step_bytes, held: int = 1 << 20):
        self.bytes_for, self.held, self.stats = step_bytes, held, None
        self.step_bytes: list[int] = []

    def reset(self):
        pass

    def read(self):
        self.step_bytes.append(self.bytes_for(self.stats().swapped_tensors))
        return self.held, self.held + self.step_bytes[-1]


class AsPredicted(Allocator):
    """A device whose checked step held what the plan predicted: the plan stands, whatever this machine's
    allocator would read (the tests of the planner's own choice)."""

    def __init__(self):
        super().__init__(lambda swapped: 0, held=0)

    def read(self):
        stats = self.stats()
        self.step_bytes.append((stats.device_peak_bytes or 0) - (stats.persistent_bytes or 0))
        return 0, self.step_bytes[-1]
