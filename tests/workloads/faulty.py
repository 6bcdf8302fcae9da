"""Two tasks, one whose loss fails on rank 1 at its third call as FAULT says: raise,
kill, kill-forked, hang, hang-forked (or none)."""
import functools
import os
import signal
import time

import torch
import torch.distributed as dist

from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

FAULT = os.environ.get("FAULT", "none")
calls = 0

def loss(output, target):
    global calls
    calls += 1
    if dist.get_rank() == 1 and calls == 3:
        if FAULT == "raise":
            raise ValueError("injected failure on rank 1")
        if FAULT == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if FAULT == "kill-forked":  # a child it forked holds its connection and sockets
            if os.fork() == 0:
                time.sleep(3600)
                os._exit(0)
            os.kill(os.getpid(), signal.SIGKILL)
        if FAULT == "hang":
            if os.environ.get("HANG_MARKER"):  # tells the test the rank hangs now
                open(os.environ["HANG_MARKER"], "w").close()
            time.sleep(3600)
        if FAULT == "hang-forked":  # a helper it forked (a data-loading pool, say)
            if os.fork() == 0:
                with open(os.environ["HELPER_PID_FILE"], "w") as file:
                    file.write(str(os.getpid()))
                time.sleep(3600)
                os._exit(0)
            time.sleep(3600)
    return torch.nn.functional.cross_entropy(output, target)

def task(name, loss_fn):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=loss_fn,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16, steps=6)

workload = Workload([task("good", torch.nn.functional.cross_entropy), task("faulty", loss)])
