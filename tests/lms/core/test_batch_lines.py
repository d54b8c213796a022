"""A step's peak at any batch size read off two replays (core/batch_lines.py), against a replay at that batch:
the frontier's searches over batch sizes take the one for the other."""

import random

import pytest

from lms_magic.lms.core.batch_lines import lines_hold, live_lines, resized_lines, size_coincidences
from lms_magic.lms.core.indexed import IndexedGraph
from lms_magic.lms.core.simulate import Node, Swap, replay_with_swaps, with_swaps

from .reference_walk import reference_replay


def graph_at(seed: int, size: int = 60):
    """A random graph whose node sizes are lines in the batch size (per-sample bytes, and a fixed part such as a
    weight's), with aliasing and in-place nodes, control edges and tied priorities: a function of the batch."""
    rng = random.Random(seed)
    shape = []
    for index in range(size):
        sources = rng.sample(range(index), k=min(index, rng.randint(0, 3)))
        controls = tuple(f"n{s}" for s in rng.sample(range(index), k=min(index, rng.randint(0, 1))))
        lines = tuple((rng.choice([0, 0, 40, 96]), rng.choice([0, 8, 16, 64])) for _ in range(rng.choice([1, 1, 2])))
        shape.append((f"n{index}", lines, tuple((f"n{s}", 0) for s in sources), controls, rng.random() > 0.1,
                      rng.choice([None, None, None, 0, -1]) if sources else None, rng.randint(0, size // 2),
                      rng.random() < 0.4))

    def at(batch: int) -> list[Node]:
        return [Node(name, tuple(fixed + per_sample * batch for fixed, per_sample in lines), inputs, controls, on_device,
                     alias, priority, forwards) for name, lines, inputs, controls, on_device, alias, priority, forwards in shape]

    return at


SEEDS = range(40)


def test_the_peak_at_any_batch_is_the_replay_at_that_batch():
    """Lines through the reference walk's live bytes at two batch sizes give the reference walk's peak at every other
    (but where an in-place choice could differ: there the caller replays)."""
    checked = 0
    for seed in SEEDS:
        at = graph_at(seed)
        coincidences = size_coincidences(4, at(4), 9, at(9))
        if coincidences is None:  # an in-place choice differs between the two batch sizes: no lines (a test below)
            continue
        lines = live_lines(4, reference_replay(at(4)), 9, reference_replay(at(9)))
        assert lines is not None, seed
        for batch in range(1, 200):
            if batch not in coincidences:
                assert lines.peak_bytes(batch) == reference_replay(at(batch)).peak_bytes, (seed, batch)
        checked += 1
    assert checked >= len(SEEDS) // 2  # most random graphs have lines: the assertions ran


def test_one_walk_with_the_sizes_of_another_batch_gives_that_batchs_replay_and_its_lines():
    """What the frontier's plan searches replay: the engine's one walk at the first batch, resized to the second,
    for the lines of a set of swaps, held to the reference walk of the step at the second batch with those swaps."""
    checked = 0
    for seed in SEEDS:
        at = graph_at(seed)
        if lines_hold(4, IndexedGraph(at(4)), 9, IndexedGraph(at(9))) is None:
            continue
        low, high = IndexedGraph(at(4)), IndexedGraph(at(9))

        def swaps(batch: int) -> list[Swap]:  # the same tensors at each batch, their bytes there
            nodes, picked = at(batch), random.Random(seed).sample(range(1, 59), k=3)
            readers = [[node.name for node in nodes if (nodes[p].name, 0) in node.inputs] for p in picked]
            return [Swap((nodes[p].name, 0), tuple(r), nodes[p - 1].name, nodes[p].outputs[0])
                    for p, r in zip(picked, readers) if r]

        for moved in ([], swaps):
            first = replay_with_swaps(low, moved(4) if moved else [], explain=True,
                                      resized=(high, moved(9) if moved else []))
            second = reference_replay(with_swaps(at(9), moved(9) if moved else []))
            assert first.order == second.order and first.resized_live_bytes == second.live_bytes, seed
            assert resized_lines(4, first, 9) == live_lines(4, reference_replay(with_swaps(at(4), moved(4) if moved
                                                                                           else [])), 9, second)
        checked += 1
    assert checked >= len(SEEDS) // 2
    with pytest.raises(ValueError, match="resized"):
        replay_with_swaps(IndexedGraph(graph_at(0)(4)), [], explain=True, resized=(IndexedGraph(graph_at(0)(9)[::-1]), []))


def test_an_order_that_depends_on_sizes_gives_no_lines():
    """The rule the lines rest on: the replay's order does not depend on sizes. A scheduler that weighed sizes (here,
    the larger of two ready nodes first) walks the step otherwise at another batch size: no lines then."""
    def at(batch, size_aware):
        grows, fixed = 10 * batch, 120  # the larger until batch 12, the smaller after
        order = (-grows, -fixed) if size_aware else (0, 1)
        return [Node("grows", (grows,), priority=order[0]), Node("fixed", (fixed,), priority=order[1]),
                Node("sum", (4,), (("grows", 0), ("fixed", 0)), priority=2)]

    assert lines_hold(4, IndexedGraph(at(4, False)), 20, IndexedGraph(at(20, False))) == set()
    assert lines_hold(4, IndexedGraph(at(4, True)), 20, IndexedGraph(at(20, True))) is None


def test_where_sizes_meet_at_one_batch_the_in_place_choice_changes_there_and_that_batch_is_left_to_a_replay():
    def at(batch):  # "y" may take over the buffer of "w" (fixed) or of "x" (grows): sizes meet at batch 25
        return [Node("w", (1000,), priority=0), Node("x", (24 * batch,), priority=1),
                Node("y", (40 * batch,), (("w", 0), ("x", 0)), priority=2, forwards_input=True),
                Node("z", (8,), (("y", 0),), priority=3)]

    assert size_coincidences(8, at(8), 16, at(16)) == {25}
    lines = live_lines(8, reference_replay(at(8)), 16, reference_replay(at(16)))
    assert lines.peak_bytes(25) != reference_replay(at(25)).peak_bytes  # the replay at 25 shares w's buffer
    assert all(lines.peak_bytes(batch) == reference_replay(at(batch)).peak_bytes for batch in (1, 24, 26, 100))


def test_an_in_place_choice_that_differs_between_the_two_batch_sizes_gives_no_lines():
    def at(batch):
        return [Node("w", (1000,), priority=0),
                Node("y", (125 * batch,), (("w", 0),), priority=1, forwards_input=True)]

    assert size_coincidences(8, at(8), 16, at(16)) is None  # y takes w's buffer at 8, not at 16


def test_two_walks_of_different_orders_or_bytes_not_whole_per_sample_give_no_lines():
    at = graph_at(1)
    first, second = reference_replay(at(4)), reference_replay(at(9))
    assert live_lines(4, first, 9, second) is not None
    assert live_lines(4, first, 10, second) is None  # 5 batch sizes apart, not 6: not whole bytes per sample
    second.order = list(reversed(second.order))
    assert live_lines(4, first, 9, second) is None
