"""Point-to-point plans: both ends of a link post in one order, so NCCL cannot cross them."""

from __future__ import annotations

import itertools

import pytest

from dione.schedules import gpipe, one_f_one_b, xpipe
from dione.schedules.messages import (
    LinkOp,
    Message,
    link_order,
    link_plan,
    posted_as_listed,
    run_in_order,
    unwaited_sends_peak,
)

SIZES = [(k, t) for k, t in itertools.product((2, 3, 4, 8), (1, 2, 3, 4, 8)) if t <= 2 * k]
MAKERS = {"xpipe": xpipe, "gpipe": gpipe, "1f1b": one_f_one_b}


@pytest.mark.parametrize("name", MAKERS)
def test_every_plan_completes_under_nccl_pairing(name: str) -> None:
    for stages, micro in SIZES:
        schedule = MAKERS[name](stages, micro, 5)
        plans = [link_plan(schedule, k) for k in range(stages)]
        assert run_in_order(plans) is None, (name, stages, micro)


def test_xpipe_posted_as_listed_crosses() -> None:
    """The order xpipe posted in before: stage k sends its second warm-up activation
    while k+1 sends its first gradient; two sends face each other (the classic NCCL
    point-to-point hang for large messages)."""
    for stages, micro in SIZES:
        schedule = xpipe(stages, micro, 5)
        found = run_in_order([posted_as_listed(schedule, k) for k in range(stages)])
        assert found == (f"link {stages - 2} crosses: stage {stages - 2} posted send A1 "
                         f"where stage {stages - 1} posted send G0")


def test_both_ends_of_a_link_post_its_messages_in_one_order() -> None:
    for stages, micro in SIZES:
        schedule = xpipe(stages, micro, 4)
        plans = [link_plan(schedule, k) for k in range(stages)]
        for link in range(stages - 1):
            ends = [[op.message for op in plans[k].flat()
                     if op is not None and op.verb in ("send", "recv")
                     and op.message.link == link] for k in (link, link + 1)]
            assert ends[0] == ends[1] == list(link_order(schedule, link))


def test_gradient_receives_are_posted_ahead_of_the_sends_that_follow_them() -> None:
    """K = 2, T = 1: stage 0 posts G0's receive before it sends A1, where stage 1 meets
    them (its backward of 0 comes before its forward of 1), and waits on A0's send only
    once G0 arrived."""
    plan = link_plan(xpipe(2, 1, 2), 0)
    a0, a1 = Message("activation", 0, 0), Message("activation", 1, 0)
    g0, g1 = Message("gradient", 0, 0), Message("gradient", 1, 0)
    assert [op for op in plan.flat() if op is not None] == [
        LinkOp("send", a0),                                             # after F0
        LinkOp("recv", g0), LinkOp("send", a1),                         # after F1
        LinkOp("wait", g0), LinkOp("done", a0),                         # before B0
        LinkOp("recv", g1), LinkOp("wait", g1), LinkOp("done", a1),     # before B1
    ]


def test_unwaited_sends_stay_within_the_documented_bound() -> None:
    """At most the stage's in-flight micro-batches' activations (their data is the output
    the stage keeps for the backward anyway) plus one gradient."""
    for stages, micro in SIZES:
        for name, make in MAKERS.items():
            schedule = make(stages, micro, 5)
            for k in range(stages):
                peak = unwaited_sends_peak(link_plan(schedule, k))
                assert 1 <= peak <= schedule.in_flight_peak(k) + 1, (name, stages, micro, k)
