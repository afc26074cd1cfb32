"""torchrun support shared by extract, train and bench: join the process group when launched by torchrun, and
this process's rank and the world size (0, 1 otherwise). GPUs use NCCL with one GPU per local rank; CPUs gloo."""
from __future__ import annotations

import atexit
import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist


BARRIER_TIMEOUT = timedelta(hours=24)


def rank_world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> bool:
    """Join the torchrun process group when launched by torchrun (env WORLD_SIZE > 1); True if joined now.

    SIGTERM (torchrun stopping the other ranks when one dies) becomes ``KeyboardInterrupt``, so every rank ends
    with the CLI's one line "interrupted; rerun the same command to resume" instead of a traceback."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():  # before init, so NCCL binds each rank to its own GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        # ranks wait at barriers for unequal work (one more seed stack, rank 0's budget calibration): hours on a CPU,
        # past the default 10-30 min collective timeout
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=BARRIER_TIMEOUT)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminate)
        return True
    return False


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def barrier() -> None:
    """Wait for every rank (nothing outside torchrun)."""
    if rank_world()[1] > 1:
        dist.barrier()


def local_device() -> torch.device:
    """This rank's default device: its local GPU when there is one (``LOCAL_RANK``), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")
