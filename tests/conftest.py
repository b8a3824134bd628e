"""Test-session settings: hubs and wandb offline, and the output of a child process a failed test ran."""

import os
import subprocess

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

# The numeric kernel level before anything loads torch (sera.numerics): the tests run at the level the runs do.
from sera.numerics import pin  # noqa: E402

pin()

CHILD_OUTPUT_CHARS = 20_000  # the tail of a failed child's output that a report shows


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails on a child process (subprocess.run(..., check=True, capture_output=True) raising
    CalledProcessError, or a TimeoutExpired) shows the child's captured stderr and stdout in its report: the exception's
    own message has only the command and the exit status."""
    outcome = yield
    error = call.excinfo.value if call.excinfo is not None else None
    if not isinstance(error, subprocess.CalledProcessError | subprocess.TimeoutExpired):
        return
    report = outcome.get_result()
    for name in ("stderr", "stdout"):
        text = getattr(error, name, None)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if text:
            report.sections.append((f"child process {name} (last {CHILD_OUTPUT_CHARS} characters)",
                                    text[-CHILD_OUTPUT_CHARS:]))  # fmt: skip
