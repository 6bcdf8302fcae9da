"""A hand-written PyTorch training loop: the baseline dione's per-step overhead is measured against.

Run as ``python benchmarks/plain_loop.py MODEL WORLD STEPS OUT.json``; with WORLD > 1 it
starts WORLD processes itself and trains with DistributedDataParallel over gloo, each
rank indexing its share of the batch, exactly what a careful user writes by hand.
Rank 0 writes each step's wall time to OUT.json.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS


def run_steps(setup: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              steps: int, rank: int = 0, world: int = 1) -> tuple[list[float], torch.Tensor]:
    """The loop itself: rank's share of each batch of a seeded permutation per epoch,
    forward, loss, backward, step; each step's wall time and the last loss."""
    inputs, targets = setup.data().tensors
    share = setup.batch_size // world
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(inputs), generator=generator)
    position = 0
    times = []
    last = time.perf_counter()
    for _ in range(steps):
        if position + setup.batch_size > len(order):
            order, position = torch.randperm(len(inputs), generator=generator), 0
        index = order[position + rank * share: position + (rank + 1) * share]
        position += setup.batch_size
        loss = setup.loss(model(inputs[index]), targets[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times, loss


def train(rank: int, world: int, name: str, steps: int, out: str, port: int, threads: int,
          cores: list[list[int]] | None) -> None:
    if cores:
        os.sched_setaffinity(0, set(cores[rank]))
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    setup = MODELS[name]
    torch.manual_seed(0)
    model = setup.model()
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = setup.optimizer(model.parameters())
    times, loss = run_steps(setup, model, optimizer, steps, rank, world)
    if rank == 0:
        with open(out, "w") as file:
            json.dump({"step_seconds": times, "final_loss": float(loss.detach())}, file)
    if world > 1:
        # The DDP wrapper must go before its process group, or its destructor can hang.
        del model, optimizer
        dist.destroy_process_group()


def main() -> None:
    name, world, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    threads = int(sys.argv[5])
    cores = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
    with socket.socket() as probe:  # a port free right now, for the gang's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if world == 1:
        train(0, 1, name, steps, out, port, threads, cores)
    else:
        mp.start_processes(train, args=(world, name, steps, out, port, threads, cores),
                           nprocs=world, start_method="spawn")


if __name__ == "__main__":
    main()
