"""A test that fails on a child process shows the child's stderr and stdout (tests/conftest.py): an FSDP2 failure's
message under torchrun was once lost because subprocess.CalledProcessError carries only the command and exit code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the messages are joined at run time, so the command line (which the exception's message shows) does not hold them
CHILD = "import sys; print('-'.join(['child', 'stdout'])); sys.exit('-'.join(['child', 'stderr', 'reason']))"


def test_a_failed_child_process_reports_its_output(tmp_path):
    (tmp_path / "test_child.py").write_text(
        "import subprocess, sys\n\n\ndef test_child():\n"
        f"    subprocess.run([sys.executable, '-c', {CHILD!r}], check=True, capture_output=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:]
    assert "child-stderr-reason" in out.stdout and "child-stdout" in out.stdout
