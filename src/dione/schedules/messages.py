"""Point-to-point messages of a pipeline schedule, posted in an order no stream can cross.

Stage k sends micro-batch u's activation to k+1 after its F(u) and receives u's
gradient from k+1 before its B(u). NCCL ignores tags and runs the operations of one
pair of ranks in the order they were posted, so the n-th operation stage k posts on
the link (k, k+1) meets the n-th one stage k+1 posts there. Posted as each stage's own
list falls, the two orders cross (K = 2, T = 1, XPipe)::

    stage 0:  send A0   send A1   recv G0  ...     (two warm-up forwards)
    stage 1:  recv A0   send G0   recv A1  ...
                        ^^^^^^^^^^^^^^^^^ two sends face each other: a large message
                                          waits for a receive that never comes

So both ends of a link post its messages in one order, the **link order**: the order
in which the downstream stage (k+1) meets them in its own list (F(u): activation u,
B(u): gradient u). Stage k+1 then posts as its list falls; stage k, whose sends follow
its own forwards, posts the gradient receives that come first in the link order ahead,
as soon as it knows their shape (the activation it sent), which is what lets its
sends meet a posted receive. A send is waited on only once a receive posted after it
on the same link has arrived: by then the peer has posted the send's receive (it
follows the same order), so the wait returns at once on gloo as on NCCL.

``link_plan`` gives each stage's operations around each of its actions;
``run_in_order`` plays all stages' plans with NCCL's rules (in-order pairing per link,
waits block) and names the first crossing or deadlock; ``posted_as_listed`` is the old
plan, kept to show that it crosses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dione.schedules.actions import Schedule, ScheduleError

__all__ = [
    "LinkOp",
    "LinkPlan",
    "Message",
    "link_order",
    "link_plan",
    "posted_as_listed",
    "run_in_order",
    "unwaited_sends_peak",
]

MessageKind = Literal["activation", "gradient"]
# send: post a send (never blocks); recv: post a receive; wait: block until a posted
# receive has arrived; done: wait on a posted send (it has arrived: see above).
Verb = Literal["send", "recv", "wait", "done"]


@dataclass(frozen=True)
class Message:
    """Micro-batch ``micro``'s activation (``link`` -> ``link + 1``) or gradient (back)."""

    kind: MessageKind
    micro: int
    link: int

    @property
    def sender(self) -> int:
        return self.link if self.kind == "activation" else self.link + 1

    def label(self) -> str:
        return f"{'A' if self.kind == 'activation' else 'G'}{self.micro}"


@dataclass(frozen=True)
class LinkOp:
    """One point-to-point operation of a stage."""

    verb: Verb
    message: Message

    def label(self) -> str:
        return f"{self.verb} {self.message.label()}"


@dataclass(frozen=True)
class LinkPlan:
    """A stage's operations before and after the work of each action of its list, and
    the sends waited on once the list is done."""

    before: tuple[tuple[LinkOp, ...], ...]
    after: tuple[tuple[LinkOp, ...], ...]
    final: tuple[LinkOp, ...]

    def flat(self) -> list[LinkOp | None]:
        """Every operation in order; None marks an action's work."""
        ops: list[LinkOp | None] = []
        for before, after in zip(self.before, self.after, strict=True):
            ops.extend(before)
            ops.append(None)
            ops.extend(after)
        ops.extend(self.final)
        return ops


def _micro(schedule: Schedule, minibatch: int, micro: int | None) -> int:
    assert micro is not None
    return minibatch * schedule.micro_batches + micro


def link_order(schedule: Schedule, link: int) -> tuple[Message, ...]:
    """The messages between stages ``link`` and ``link + 1``, in the order the downstream
    stage meets them: both ends post them so."""
    order = []
    for a in schedule.stages[link + 1]:
        if a.kind == "F":
            order.append(Message("activation", _micro(schedule, a.minibatch, a.micro), link))
        elif a.kind == "B":
            order.append(Message("gradient", _micro(schedule, a.minibatch, a.micro), link))
    return tuple(order)


class _PlanBuilder:
    """Builds one stage's plan: posts in link order, waits sends once safe."""

    def __init__(self, schedule: Schedule, stage: int) -> None:
        self.schedule = schedule
        self.stage = stage
        last = schedule.depth - 1
        self.orders = {link: link_order(schedule, link)
                       for link in (stage - 1, stage) if 0 <= link < last}
        self.posted = dict.fromkeys(self.orders, 0)  # messages posted, per link
        self.unwaited: dict[int, list[Message]] = {link: [] for link in self.orders}
        self.sent: set[Message] = set()  # sends this stage has the data for

    def _post_through(self, message: Message, ops: list[LinkOp]) -> None:
        """Post every message of the link up to ``message`` (included) not posted yet."""
        order = self.orders[message.link]
        end = order.index(message) + 1
        for m in order[self.posted[message.link]:end]:
            if m.sender == self.stage:
                if m not in self.sent:  # the peer needs it first: the schedule deadlocks
                    raise ScheduleError(
                        f"stage {self.stage} of {self.schedule.name!r} would have to send "
                        f"{m.label()} before it has computed it, to keep the link order")
                ops.append(LinkOp("send", m))
                self.unwaited[m.link].append(m)
            else:
                if m.kind == "activation" and m != message:
                    # Its shape travels with it, so it cannot be posted ahead; the link
                    # order never asks for that (the downstream stage posts it itself).
                    raise ScheduleError(f"stage {self.stage} cannot post {m.label()} ahead")
                ops.append(LinkOp("recv", m))
        self.posted[message.link] = max(self.posted[message.link], end)

    def send(self, message: Message, ops: list[LinkOp]) -> None:
        self.sent.add(message)
        self._post_through(message, ops)

    def receive(self, message: Message, ops: list[LinkOp]) -> None:
        order = self.orders[message.link]
        if order.index(message) >= self.posted[message.link]:
            self._post_through(message, ops)
        ops.append(LinkOp("wait", message))
        # Every send posted before this receive has arrived (see the module's notes).
        position = order.index(message)
        still = []
        for m in self.unwaited[message.link]:
            if order.index(m) < position:
                ops.append(LinkOp("done", m))
            else:
                still.append(m)
        self.unwaited[message.link] = still

    def drain(self) -> list[LinkOp]:
        return [LinkOp("done", m) for link in sorted(self.unwaited) for m in self.unwaited[link]]


def link_plan(schedule: Schedule, stage: int) -> LinkPlan:
    """``stage``'s point-to-point operations around each action of its list, in link order."""
    builder = _PlanBuilder(schedule, stage)
    last = schedule.depth - 1
    befores, afters = [], []
    for a in schedule.stages[stage]:
        before: list[LinkOp] = []
        after: list[LinkOp] = []
        if a.kind == "F":
            u = _micro(schedule, a.minibatch, a.micro)
            if stage > 0:
                builder.receive(Message("activation", u, stage - 1), before)
            if stage < last:
                builder.send(Message("activation", u, stage), after)
        elif a.kind == "B":
            u = _micro(schedule, a.minibatch, a.micro)
            if stage < last:
                builder.receive(Message("gradient", u, stage), before)
            if stage > 0:
                builder.send(Message("gradient", u, stage - 1), after)
        befores.append(tuple(before))
        afters.append(tuple(after))
    return LinkPlan(tuple(befores), tuple(afters), tuple(builder.drain()))


def posted_as_listed(schedule: Schedule, stage: int) -> LinkPlan:
    """The plan dione's xpipe ran before issue 19: each receive posted (and waited) when
    its action comes, each send when its data is ready, whatever the peer's order."""
    last = schedule.depth - 1
    befores, afters = [], []
    sends: list[Message] = []
    for a in schedule.stages[stage]:
        before: list[LinkOp] = []
        after: list[LinkOp] = []
        if a.kind in "FB":
            u = _micro(schedule, a.minibatch, a.micro)
            forward = a.kind == "F"
            if (stage > 0) if forward else (stage < last):
                m = Message("activation" if forward else "gradient", u,
                            stage - 1 if forward else stage)
                before += [LinkOp("recv", m), LinkOp("wait", m)]
            if (stage < last) if forward else (stage > 0):
                m = Message("activation" if forward else "gradient", u,
                            stage if forward else stage - 1)
                after.append(LinkOp("send", m))
                sends.append(m)
        befores.append(tuple(before))
        afters.append(tuple(after))
    return LinkPlan(tuple(befores), tuple(afters), tuple(LinkOp("done", m) for m in sends))


def run_in_order(plans: Sequence[LinkPlan]) -> str | None:
    """Play every stage's plan under NCCL's rules; None if all of it completes, else why
    not. Per link, the n-th operations the two ends post are paired: a pair must be a
    send and a receive of one message, and completes once both are posted and every
    earlier pair of the link has completed. ``wait`` and ``done`` block until their pair
    completes; posting never blocks; an action's work takes no time."""
    ops = [p.flat() for p in plans]
    cursor = [0] * len(plans)
    posted: dict[tuple[int, int], list[LinkOp]] = {}  # (link, stage) -> posted in order
    completed: dict[int, int] = {}  # link -> pairs completed

    def pair_index(stage: int, op: LinkOp) -> int:
        mine = posted[(op.message.link, stage)]
        return next(n for n, o in enumerate(mine)
                    if o.message == op.message and o.verb in ("send", "recv"))

    def advance_links() -> str | None:
        for link in sorted({link for link, _ in posted}):
            mine, theirs = posted.get((link, link), []), posted.get((link, link + 1), [])
            n = completed.get(link, 0)
            while n < min(len(mine), len(theirs)):
                a, b = mine[n], theirs[n]
                if a.message != b.message or {a.verb, b.verb} != {"send", "recv"}:
                    return (f"link {link} crosses: stage {link} posted {a.label()} where "
                            f"stage {link + 1} posted {b.label()}")
                n += 1
            completed[link] = n
        return None

    while True:
        moved = False
        for stage, mine in enumerate(ops):
            while cursor[stage] < len(mine):
                op = mine[cursor[stage]]
                if op is not None and op.verb in ("send", "recv"):
                    posted.setdefault((op.message.link, stage), []).append(op)
                elif op is not None:  # wait or done: blocks until its pair completed
                    problem = advance_links()
                    if problem:
                        return problem
                    if pair_index(stage, op) >= completed.get(op.message.link, 0):
                        break
                cursor[stage] += 1
                moved = True
        problem = advance_links()
        if problem:
            return problem
        if all(c == len(m) for c, m in zip(cursor, ops, strict=True)):
            return None
        if not moved:
            stuck = [f"stage {k} at {mine[c].label()}"  # type: ignore[union-attr]
                     for k, (c, mine) in enumerate(zip(cursor, ops, strict=True))
                     if c < len(mine)]
            return "deadlock: " + ", ".join(stuck)


def unwaited_sends_peak(plan: LinkPlan) -> int:
    """The most sends the stage has posted and not yet waited on, at any point of its plan
    (an activation's header and data count as one)."""
    live = peak = 0
    for op in plan.flat():
        if op is not None and op.verb == "send":
            live += 1
            peak = max(peak, live)
        elif op is not None and op.verb == "done":
            live -= 1
    return peak
