"""The output lock of `extract` dies with the process that took it, even while a forked child (a DataLoader
worker) that inherited its file descriptor lingers; a live writer is still refused."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mr2probe.errors import UserError
from mr2probe.extract import output_lock

HOLDER = """
import os, sys, time
from pathlib import Path
from mr2probe.extract import output_lock
with output_lock(Path(sys.argv[1])):
    if os.fork() == 0:          # a child that inherits the lock file's descriptor and outlives its parent
        time.sleep(30)
        os._exit(0)
    print("locked", flush=True)
    time.sleep(60)
"""


def test_lock_is_released_by_sigkill_while_a_forked_child_lives(tmp_path: Path) -> None:
    out = tmp_path / "f.h5"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=r"another process is already writing .*f\.h5 \(lock .* is held\)"):
            with output_lock(out):
                pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        start = time.monotonic()
        with output_lock(out):  # at once: the orphaned child still has the descriptor open, not the lock
            assert time.monotonic() - start < 1.0
    finally:
        proc.kill()
        subprocess.run(["pkill", "-f", f"{out}"], check=False)


def test_one_process_cannot_take_its_own_lock_twice(tmp_path: Path) -> None:
    out = tmp_path / "g.h5"
    with output_lock(out):
        with pytest.raises(UserError, match="already writing"):
            with output_lock(out):
                pass
    with output_lock(out):  # released: free again
        pass
    assert not Path(f"{out}.lock").exists()
