"""What a weight shared by the first and last stage costs each pipeline, in the simulator.

    python benchmarks/tied_weights_sim.py

Stage 0's steady interval between updates (forward 1, backward 2, update 0.2, transfer
0.1 per stage, 16 mini-batches), with the stages' updates independent and with stages
0 and K-1 summing a tied weight's gradients at each update. No clock: the figures are
the simulator's, the same on any machine.
"""

from __future__ import annotations

import itertools
import statistics

import dione.techniques  # noqa: F401 - registers the built-in techniques
from dione.schedules.simulate import StageTimes, simulate
from dione.techniques.registry import get_technique


def update_interval(technique: str, stages: int, micro_batches: int, tied: bool) -> float:
    """Stage 0's median interval between updates over the second half of the run."""
    times = StageTimes.uniform(stages, 1.0, 2.0, 0.2, 0.1)
    shared = [[0, stages - 1]] if tied else []
    timeline = simulate(get_technique(technique).schedule(stages, micro_batches, 16), times,
                        shared)
    ends = [s.end for s in timeline.spans[0] if s.action.kind == "U"]
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    return statistics.median(gaps[len(gaps) // 2:])


def main() -> None:
    print("| K | T | technique | untied | tied | the tie costs | step vs gpipe, untied / tied |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for stages, micro_batches in ((2, 2), (2, 4), (4, 4), (4, 16)):
        gpipe = [update_interval("gpipe", stages, micro_batches, tied) for tied in (False, True)]
        for technique in ("xpipe", "gpipe", "1f1b"):
            untied, tied = (update_interval(technique, stages, micro_batches, t)
                            for t in (False, True))
            versus = f"{untied / gpipe[0] - 1:+.0%} / {tied / gpipe[1] - 1:+.0%}"
            print(f"| {stages} | {micro_batches} | {technique} | {untied:.2f} | {tied:.2f} "
                  f"| {tied / untied - 1:+.0%} | {versus} |")


if __name__ == "__main__":
    main()
