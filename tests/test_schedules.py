"""Pipeline schedules as data, their simulator, and the partitioning of models (pure)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dione.schedules import (
    Action,
    PartitionError,
    Schedule,
    ScheduleError,
    StageTimes,
    Timeline,
    balance,
    gpipe,
    one_f_one_b,
    simulate,
    xpipe,
)
from dione.techniques import get_technique
from dione.techniques.pipeline.partition import partition_model
from dione.zoo import CharGPT, digits_mlp
from helpers import char_task


@pytest.mark.parametrize("make", [gpipe, one_f_one_b], ids=["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "micro"), list(itertools.product([2, 3, 4], [1, 2, 4, 8])))
def test_equal_stages_have_the_textbook_bubble(make, stages: int, micro: int) -> None:
    """GPipe's bubble is (K-1)/(m+K-1) for equal stage times (Huang et al. 2019); 1F1B
    reorders the same work and has the same bubble."""
    timeline = simulate(make(stages, micro), StageTimes.uniform(stages, 1.0, 2.0))
    assert timeline.bubble_fraction == pytest.approx((stages - 1) / (micro + stages - 1))
    assert timeline.makespan == pytest.approx((micro + stages - 1) * 3.0)


@pytest.mark.parametrize(("stages", "micro"), list(itertools.product([2, 3, 4], [1, 2, 4, 8])))
def test_one_f_one_b_holds_at_most_k_micro_batches(stages: int, micro: int) -> None:
    f1b, pipe = one_f_one_b(stages, micro), gpipe(stages, micro)
    for k in range(stages):
        assert f1b.in_flight_peak(k) == min(stages - k, micro) <= stages
        assert pipe.in_flight_peak(k) == micro


def test_timeline_renders_one_row_per_stage() -> None:
    timeline = simulate(gpipe(2, 2), StageTimes.uniform(2, 1.0, 2.0))
    assert timeline.render() == (
        "stage 0: F0 F1 .. .. .. B0 B0 B1 B1\n"
        "stage 1: .. F0 F1 B0 B0 B1 B1 .. .."
    )
    assert one_f_one_b(2, 2).text() == "stage 0: F0 F1 B0 B1 U0\nstage 1: F0 B0 F1 B1 U0"


def test_several_minibatches_flush_between_them() -> None:
    one = simulate(gpipe(2, 4), StageTimes.uniform(2, 1.0, 2.0, update=0.5, transfer=0.25))
    three = simulate(gpipe(2, 4, minibatches=3),
                     StageTimes.uniform(2, 1.0, 2.0, update=0.5, transfer=0.25))
    # Stage 0 is the first to start a mini-batch and the last to finish one (its last
    # backward waits on every stage): with a flush, mini-batches cannot overlap.
    assert three.per_minibatch == pytest.approx(one.makespan)
    assert [three.busy(k) for k in range(2)] == pytest.approx([3 * one.busy(k) for k in (0, 1)])
    stage0 = three.spans[0]
    update, next_forward = stage0[2 * 4], stage0[2 * 4 + 1]
    assert (update.action, next_forward.action) == (Action("U", 0), Action("F", 1, 0))
    assert next_forward.start == update.end


def test_transfers_delay_the_receiver() -> None:
    slow = simulate(gpipe(3, 2), StageTimes.uniform(3, 1.0, 1.0, transfer=0.5))
    fast = simulate(gpipe(3, 2), StageTimes.uniform(3, 1.0, 1.0))
    # Two links crossed forward and two backward on the critical path.
    assert slow.makespan == pytest.approx(fast.makespan + 4 * 0.5)


def test_per_action_overhead_lengthens_every_forward_and_backward() -> None:
    plain = simulate(gpipe(2, 4), StageTimes.uniform(2, 1.0, 2.0, update=1.0))
    slow = simulate(gpipe(2, 4), StageTimes((1.0, 1.0), (2.0, 2.0), (1.0, 1.0), overhead=0.5))
    # The same as stage times 1.5 and 2.5: (m + K - 1) forwards and backwards, one update.
    assert slow.makespan == pytest.approx(plain.makespan + (4 + 1) * 2 * 0.5)


def test_action_times_read_back_what_a_timeline_ran() -> None:
    times = StageTimes((1.0, 3.0), (2.0, 6.0), (0.5, 0.25), transfer=0.1)
    assert simulate(gpipe(2, 4, 2), times).action_times(transfer=0.1) == times


def test_uneven_stages_are_bound_by_the_slowest() -> None:
    timeline = simulate(gpipe(2, 8), StageTimes((1.0, 3.0), (2.0, 6.0), (0.0, 0.0)))
    assert timeline.makespan == pytest.approx(1.0 + 8 * 9.0 + 2.0)


def _stage_zero_update_gaps(timeline: Timeline) -> list[float]:
    ends = [span.end for span in timeline.spans[0] if span.action.kind == "U"]
    return [b - a for a, b in itertools.pairwise(ends)]


def test_a_weight_two_stages_share_stalls_xpipe_at_each_update() -> None:
    """Tied embeddings (stages 0 and K-1): xpipe sums their gradients at each update, so
    the last stage waits there until the mini-batch's last gradient is back on stage 0:
    one backward of stage 0 (K = 2) more per mini-batch than with no weight shared."""
    times = StageTimes.uniform(2, 1.0, 2.0)
    alone = simulate(xpipe(2, 2, 6), times)
    tied = simulate(xpipe(2, 2, 6), times, shared=[(0, 1)])
    assert _stage_zero_update_gaps(alone) == pytest.approx([6.0] * 5)
    assert _stage_zero_update_gaps(tied) == pytest.approx([8.0] * 5)
    # Stage 1's update starts with stage 0's, its wait idle: the work times stay.
    ups = [(a.start, b.start) for a, b in zip(tied.spans[0], tied.spans[1], strict=True)
           if a.action.kind == "U" == b.action.kind]
    assert all(zero == one for zero, one in ups)
    assert tied.action_times() == times
    deeper = StageTimes.uniform(4, 1.0, 2.0)
    assert _stage_zero_update_gaps(simulate(xpipe(4, 4, 8), deeper))[-1] == pytest.approx(12.0)
    assert _stage_zero_update_gaps(
        simulate(xpipe(4, 4, 8), deeper, shared=[(0, 3)]))[-1] == pytest.approx(18.0)


@pytest.mark.parametrize("make", [gpipe, one_f_one_b], ids=["gpipe", "1f1b"])
def test_a_flush_hides_the_wait_for_a_shared_weight(make) -> None:
    times = StageTimes.uniform(3, 1.0, 2.0, update=0.5, transfer=0.25)
    alone = simulate(make(3, 4, 4), times)
    tied = simulate(make(3, 4, 4), times, shared=[(0, 2)])
    assert tied.makespan == alone.makespan
    assert _stage_zero_update_gaps(tied) == _stage_zero_update_gaps(alone)
    with pytest.raises(ValueError, match="held by stages 0 to 2"):
        simulate(make(3, 4, 4), times, shared=[(0, 3)])


def test_bad_schedules_are_refused_with_reasons() -> None:
    f, b, u = (lambda j: Action("F", 0, j)), (lambda j: Action("B", 0, j)), Action("U", 0)
    with pytest.raises(ScheduleError, match="stage 1 does not run each micro-batch's backward"):
        Schedule("x", 1, 1, ((f(0), b(0), u), (f(0), u)))
    with pytest.raises(ScheduleError, match="runs B0 before its forward"):
        Schedule("x", 1, 1, ((b(0), f(0), u),))
    with pytest.raises(ScheduleError, match="U0 before all of its backwards"):
        Schedule("x", 2, 1, ((f(0), f(1), b(0), u, b(1)),))
    # Valid lists that wait on each other: stage 1 runs F1 before B0, but stage 0 sends F1
    # only after B0, which needs stage 1's B0.
    stuck = Schedule("stuck", 2, 1, ((f(0), b(0), f(1), b(1), u), (f(0), f(1), b(1), b(0), u)))
    with pytest.raises(ScheduleError, match="deadlocks: stage 0 at B0, stage 1 at F1"):
        simulate(stuck, StageTimes.uniform(2, 1.0, 1.0))
    with pytest.raises(ValueError, match="forward times must be 2 non-negative"):
        simulate(gpipe(2, 1), StageTimes((1.0,), (1.0, 1.0), (0.0, 0.0)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.integers(1, 4))
def test_balance_is_optimal(costs: list[int], stages: int) -> None:
    if stages > len(costs):
        return
    bounds = balance(costs, stages)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(costs)
    assert all(a < b for a, b in bounds) and all(
        bounds[k][1] == bounds[k + 1][0] for k in range(stages - 1))
    worst = max(sum(costs[a:b]) for a, b in bounds)
    brute = min(
        max(sum(costs[a:b]) for a, b in zip((0, *cut), (*cut, len(costs)), strict=True))
        for cut in itertools.combinations(range(1, len(costs)), stages - 1)
    )
    assert worst == brute


def test_partition_follows_costs_and_split_points() -> None:
    model = CharGPT(layers=4)  # embedding, 4 blocks, head
    by_parameters = partition_model(model, 2, "t")
    assert by_parameters.bounds == ((0, 3), (3, 6))
    assert by_parameters.describe(1) == "layers 3-5"
    # Measured costs move the cut; a split hint overrules both.
    assert partition_model(model, 2, "t", costs=[9, 1, 1, 1, 1, 1]).bounds == ((0, 1), (1, 6))
    hinted = partition_model(model, 2, "t", costs=[9, 1, 1, 1, 1, 1], split_points=["5"])
    assert hinted.bounds == ((0, 5), (5, 6))
    # Every stage gets trainable parameters, even where a cost of 0 would allow otherwise.
    relu = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.ReLU(), nn.Linear(4, 4))
    assert partition_model(relu, 2, "t", costs=[1, 0, 0, 1]).bounds in (
        ((0, 1), (1, 4)), ((0, 2), (2, 4)), ((0, 3), (3, 4)))


class _OneBlock(nn.Module):
    """A one-layer configuration of a model with a list of blocks (GPT-2 with n_layer=1)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(2, 2), nn.Linear(2, 2)
        self.blocks = nn.ModuleList([nn.Linear(2, 2)])


@pytest.mark.parametrize(
    ("model", "stages", "split", "message"),
    [
        (lambda: nn.Transformer(d_model=8, nhead=2), 2, None,
         "task 't': pipelines cut a model between its blocks, and its model (Transformer) "
         "has more than one list of repeated blocks (decoder.layers, encoder.layers)"),
        (lambda: digits_mlp(depth=1), 3, None,
         "its model has 2 blocks (0, 1), too few for 3 pipeline stages"),
        (lambda: CharGPT(layers=2), 2, ["block"], "split points ['block'] are not blocks"),
        (lambda: CharGPT(layers=2), 3, ["2"], "lets a pipeline cut only before ['2']: at most "
         "2 stages, not 3"),
        (lambda: nn.Sequential(nn.Linear(2, 2), nn.ReLU()), 2, None,
         "no cut of its layers (0, 1) into 2 stages gives every stage trainable parameters"),
        (lambda: _OneBlock(), 2, None,  # not "neither an nn.Sequential nor ..."
         "its model's list of blocks (blocks) holds one block: a pipeline needs at least two"),
    ],
    ids=["not-sequential", "too-few-layers", "unknown-split", "too-few-splits", "no-params",
         "one-block"],
)
def test_models_that_cannot_be_cut_say_why(model, stages, split, message) -> None:
    with pytest.raises(PartitionError) as caught:
        partition_model(model(), stages, "t", split_points=split)
    assert message in str(caught.value)


def test_pipeline_techniques_check_the_model_and_the_micro_batches() -> None:
    task = char_task(batch_size=6)
    gpipe_technique = get_technique("gpipe")
    reasons = gpipe_technique.check(task, 2, {}, "cpu")
    assert reasons == ["batch size 6 of task 'char' is not divisible by 4 micro-batches"]
    assert gpipe_technique.check(task, 2, {"micro_batches": 3}, "cpu") == []
    assert any("too few for 5 pipeline stages" in r
               for r in get_technique("1f1b").check(task, 5, {"micro_batches": 2}, "cpu"))
    assert any("needs at least 2 devices" in r for r in gpipe_technique.check(task, 1, {}, "cpu"))
    settings_ = get_technique("1f1b").knob_settings(char_task(batch_size=16), 2, "cpu")
    assert {s["micro_batches"] for s in settings_} == {2, 4, 8}


def test_minibatches_in_flight_bound_xpipes_weight_copies() -> None:
    """One weight copy per mini-batch in flight: K-k with one micro-batch per mini-batch,
    two with T = K (one finishing, one started), never above ceil(K / T) + 1."""
    from dione.schedules import xpipe

    assert [xpipe(4, 1, 12).minibatches_in_flight_peak(k) for k in range(4)] == [4, 3, 2, 1]
    assert [xpipe(4, 4, 12).minibatches_in_flight_peak(k) for k in range(4)] == [2, 2, 2, 1]
    for stages in (2, 3, 4, 8):
        for micro in (1, 2, 3, stages, 2 * stages):
            schedule = xpipe(stages, micro, 10)
            assert max(schedule.minibatches_in_flight_peak(k) for k in range(stages)) <= (
                -(-stages // micro) + 1)
