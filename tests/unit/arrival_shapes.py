"""Steps of training, simulated: when each rank reaches each collective, for the shapes real jobs have.

A step is a program every rank runs (SPMD): work (ms, and whether the slow rank does it slower), a
collective issued (blocking: the rank waits for it; overlapped: it goes on), and a wait for every
overlapped one issued so far (DDP's end of backward, FSDP's end of step). A collective completes once
its last rank has arrived and the one before it completed (one stream per group), plus ``comm`` ms.
Each piece of work takes up to ``jitter`` ms more, at random. The step-time ratio a user would measure is
the same program's time with the slow rank against all ranks even (``expected``). Pure: tests and
benchmarks/arrivals.py replay these arrivals through gang/arrival_cost.py and the gang's records.
"""

from __future__ import annotations

import random
from typing import List, NamedTuple, Tuple

WORK, BLOCKING, OVERLAPPED, WAIT = "work", "blocking", "overlapped", "wait"
Op = Tuple  # (WORK, ms, slowed) | (BLOCKING,) | (OVERLAPPED,) | (WAIT,)


def program(shape: str, n: int) -> List[Op]:
    """One step of ``shape`` with ``n`` collectives (about: FSDP's come in threes); 100 ms of work."""
    work: List[Op] = []
    if shape == "blocking":  # one all-reduce a step, its work slowed: the first version's shape
        return [(WORK, 100.0, True), (BLOCKING,)]
    if shape == "chain":  # tensor parallel: a blocking all-reduce after each part of the work
        for _ in range(n):
            work += [(WORK, 100.0 / n, True), (BLOCKING,)]
        return work
    if shape in ("ddp", "ddp-metric", "ddp-barrier"):  # buckets all-reduced while the backward runs
        work = [(WORK, 35.0, shape == "ddp")]  # data and forward (a slower device: slower too)
        for _ in range(n):
            work += [(WORK, 60.0 / n, True), (OVERLAPPED,)]
        work += [(WAIT,), (WORK, 5.0, shape == "ddp")]  # the optimizer
        if shape == "ddp-metric":
            work += [(BLOCKING,)]  # the loss, all-reduced to print it
        if shape == "ddp-barrier":
            work += [(BLOCKING,), (WORK, 1.0, False), (BLOCKING,)]
        return work
    if shape == "ddp-loader":  # its data loading slower, its device not: late by as much at every bucket
        work = [(WORK, 35.0, True)]
        for _ in range(n):
            work += [(WORK, 60.0 / n, False), (OVERLAPPED,)]
        return work + [(WAIT,), (WORK, 5.0, False)]
    if shape == "fsdp":  # an all-gather before each layer, forward and backward; a reduce-scatter after
        layers = max(1, n // 3)
        for _ in range(layers):
            work += [(BLOCKING,), (WORK, 30.0 / layers, True)]
        for _ in range(layers):
            work += [(BLOCKING,), (WORK, 65.0 / layers, True), (OVERLAPPED,)]
        return work + [(WAIT,), (WORK, 5.0, True)]
    raise ValueError(shape)


class Run(NamedTuple):
    arrivals: List[List[float]]  # per collective, per rank: ms
    steps: List[float]  # when each step ended (its slowest rank), ms


def simulate(ops: List[Op], slow: float, ranks: int = 4, slow_ranks: Tuple[int, ...] = (3,), steps: int = 30,
             jitter: float = 0.3, comm: float = 0.2, seed: int = 1) -> Run:
    rng = random.Random(seed)
    clock = [0.0] * ranks
    arrivals: List[List[float]] = []
    done, ends = 0.0, []
    for _ in range(steps):
        pending: List[float] = []
        for op in ops:
            if op[0] == WORK:
                clock = [t + op[1] * (slow if op[2] and r in slow_ranks else 1.0) + rng.uniform(0, jitter)
                         for r, t in enumerate(clock)]
                continue
            if op[0] == WAIT:
                clock = [max([t] + pending) for t in clock]
                pending = []
                continue
            arrivals.append(list(clock))
            done = max(max(clock), done) + comm
            if op[0] == BLOCKING:
                clock = [max(t, done) for t in clock]
            else:
                pending.append(done)
        ends.append(max(clock))
    return Run(arrivals, ends)


def expected(ops: List[Op], slow: float, **kw) -> float:
    """The step-time ratio: the second half's steps with the slow rank(s) against all even."""
    late, even = simulate(ops, slow, **kw).steps, simulate(ops, 1.0, **kw).steps
    half = len(late) // 2
    return (late[-1] - late[half]) / (even[-1] - even[half])


def steps_for(ops: List[Op], pairs: int = 400) -> int:
    """Enough steps for about ``pairs`` intervals (the gang's window), at least 8."""
    return max(8, pairs // max(1, sum(op[0] in (BLOCKING, OVERLAPPED) for op in ops)) + 4)
