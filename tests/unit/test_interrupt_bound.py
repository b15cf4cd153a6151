"""The interrupt's bound (cli/main.py, deployer/interrupts.py): a clean-up after Ctrl-C or SIGTERM that hangs is
given up when its time is over, saying so, exit 130; a step that must not be left half done can ask for more."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HANGING = textwrap.dedent("""
    import signal, sys, time
    from deployer import interrupts
    from deployer.cli import main
    main.INTERRUPT_GRACE_S = 1.5
    signal.signal(signal.SIGINT, main._interrupted)
    signal.signal(signal.SIGTERM, main._interrupted)
    print("READY", flush=True)
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        interrupts.allow(float(sys.argv[1]))   # e.g. bringing back a stopped version
        time.sleep(60)                        # a clean-up that never ends (a channel lock held by paramiko)
    print("NOT REACHED", flush=True)
""")


@pytest.mark.parametrize(("how", "allowed", "low", "high"), [(signal.SIGINT, 0.0, 1.4, 4.5),
                                                             (signal.SIGTERM, 0.0, 1.4, 4.5),
                                                             (signal.SIGINT, 4.0, 3.9, 7.0)])
def test_a_hanging_clean_up_is_given_up_within_its_bound(how: signal.Signals, allowed: float, low: float,
                                                         high: float) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HANGING, str(allowed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO), env={"PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        time.sleep(0.5)  # inside the try
        sent = time.monotonic()
        proc.send_signal(how)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "NOT REACHED" not in out, (proc.returncode, err)
    assert err.strip().splitlines()[-1].startswith("interrupted: the clean-up did not finish in time; leaving now")
    assert low < took < high, took
