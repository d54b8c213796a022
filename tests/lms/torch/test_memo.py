"""A second fit of the same model on PyTorch does not probe again (lms/memo.py): it offloads the plan's activations
from its first step, or, where the first fit found that nothing moves, installs no hook at all."""

from lms_magic import LMS
from lms_magic.lms.torch.backend import TorchBackend

from tests.models import small_cnn as cnn

REUSED = "the plan an earlier fit of this model checked for these batch shapes"


def watched(events, **options):
    """An LMS callback whose offloader reports what it does into ``events`` (kind, forward index)."""
    return LMS(min_bytes=0, verbose=0, **options, backend=lambda model, lms_options, stats: TorchBackend(
        model, lms_options, stats, observer=lambda event: events.append((event.kind, event.candidate.forward_index))))


def fit(model, data, callback, batch_size=16):
    return model.fit(*data, batch_size=batch_size, epochs=1, verbose=0, callbacks=[callback]).history["loss"]


def test_where_nothing_moved_a_second_fit_installs_no_hook(data):
    model, first_events, second_events = cnn(), [], []
    first = watched(first_events, budget="1GiB")
    fit(model, data, first)
    assert first.stats.steps == 1 and first.stats.swapped_tensors == 0  # the probe, then the model's own step
    assert any(kind == "offload" for kind, _ in first_events)
    second = watched(second_events, budget="1GiB")
    fit(model, data, second)
    assert second_events == [] and second.stats.steps == 1 and second.stats.swapped_tensors == 0
    assert any(REUSED in note and "no hook" in note for note in second.stats.notes)


def test_a_second_fit_offloads_the_plan_from_its_first_step(data):
    """The default plan: the first fit's first step offloads every eligible activation (the probe) and the plan
    the fewer that give the lowest predicted peak; the second fit offloads those in every step, its first too."""
    model, first_events, second_events = cnn(layers=6), [], []
    first = watched(first_events)
    fit(model, data, first)
    plan = first.stats.swapped_tensors
    assert 0 < plan < first.stats.candidates
    assert sum(kind == "offload" for kind, _ in first_events) == first.stats.candidates + 3 * plan  # 4 steps
    second = watched(second_events)
    fit(model, data, second)
    assert sum(kind == "offload" for kind, _ in second_events) == 4 * plan
    assert any(REUSED in note for note in second.stats.notes)
    assert second.stats.plan == first.stats.plan and second.stats.steps == 4


def test_another_batch_size_is_planned_again(data):
    model = cnn()
    fit(model, data, watched([], budget="1GiB"))
    second = watched([], budget="1GiB")
    fit(model, data, second, batch_size=8)
    assert not any(REUSED in note for note in second.stats.notes)
