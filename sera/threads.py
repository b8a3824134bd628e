"""Torch thread count as a setting: 'auto' takes the idle cores (oversubscribing a busy 2-core box ran 2-25x slower)."""

from __future__ import annotations

import os


def resolve_threads(setting: int | str = "auto") -> int:
    """'auto' -> cores not busy now (from the 1-minute load average), at least 1, shared among the processes torchrun
    started on this machine (LOCAL_WORLD_SIZE; each would otherwise take every idle core); an int is taken as given."""
    if setting != "auto":
        threads = int(setting)
        if threads < 1:
            raise ValueError(f"threads must be >= 1 or 'auto', got {setting}")
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, (cores - round(os.getloadavg()[0])) // processes)


def set_torch_threads(setting: int | str = "auto") -> int:
    """Apply resolve_threads to torch's intra-op pool and return the count used."""
    import torch

    threads = resolve_threads(setting)
    torch.set_num_threads(threads)
    return threads
