"""The per-command shell cost every other SSH figure was measured with: `ssh host true` on the bench's target.

The bench's sshd gives each session a login shell whose `.bashrc` costs about `rc_cost` seconds (a Python
hook eval'ed the way conda/pyenv init do; tests/sshbed.py), as on a real GPU image. `ssh host true` (plain
OpenSSH, a full handshake each) is timed on it, and on a second sshd whose sessions skip the rc file
(SHLVL=1): the difference is what the rc file adds to every exec channel and SFTP session.
"""

from __future__ import annotations

from pathlib import Path

from common import LINK, SSHD, Figure, median, ssh_argv, timed
from sshbed import make_sshd


def run(bed: SSHD, tmp: Path, reps: int) -> Figure:
    plain = make_sshd(tmp / "sshd-no-rc")
    try:
        timed(ssh_argv(bed, "true"))
        timed(ssh_argv(plain, "true"))
        ours, base = [], []
        for _ in range(max(reps, 5)):                       # interleaved, so drift hits both
            ours.append(timed(ssh_argv(bed, "true"))[0])
            base.append(timed(ssh_argv(plain, "true"))[0])
    finally:
        plain.stop()
    fig = Figure("ssh host true (shell cost)", median(ours), "s", median(base), "the same, rc file skipped",
                 samples=ours, baseline_samples=base,
                 notes=f".bashrc calibrated to {bed.rc_cost * 1000:.0f} ms; adds "
                       f"{(median(ours) - median(base)) * 1000:+.0f} ms to every exec channel and SFTP session"
                       + (f"; every connection through bench/link.py: {2000 * float(LINK['delay_s']):.0f} ms round "
                          "trips" if LINK["delay_s"] else ""))
    return fig
