"""threads=auto: the idle cores, shared among the processes torchrun started on the machine."""

import os

import pytest

from sera.threads import resolve_threads


@pytest.mark.parametrize(("processes", "expected"), [(None, 12), ("1", 12), ("4", 3), ("16", 1)])
def test_auto_shares_the_idle_cores_among_a_machines_processes(monkeypatch, processes, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "getloadavg", lambda: (4.2, 0.0, 0.0))  # 16 cores, 4 busy: 12 idle
    if processes is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", processes)
    assert resolve_threads("auto") == expected
    assert resolve_threads(5) == 5
    with pytest.raises(ValueError, match="threads must be >= 1"):
        resolve_threads(0)
