"""What a person chooses for the dashboard (the address to listen on, the refresh interval), checked: a
`ValueError` whose text is one line, for the command to show and exit 2 with. Shared by `deploy dashboard` and
`python -m deployer.dashboard`.

- `listen_address`: an IP address (v4 or v6) or `localhost`; not empty (an empty host binds every interface).
- `beyond_loopback`: whether an address is reachable from other machines, and the warning to say on stderr when
  a person asked for one.
- `refresh_interval`: a finite number of seconds from `MIN_REFRESH_S` to `MAX_REFRESH_S` (not nan, not inf).
"""

from __future__ import annotations

import ipaddress
import math

MIN_REFRESH_S = 1.0
MAX_REFRESH_S = 3600.0


def listen_address(text: str) -> str:
    """`text` as an address to listen on, or ValueError saying why not."""
    value = text.strip()
    if not value:
        raise ValueError("--address is empty (that would listen on every interface); give an IP address such as "
                         "127.0.0.1, or 0.0.0.0 to be reachable from everywhere")
    if value == "localhost":
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"--address {ascii(value[:80])} is not an IP address (such as 127.0.0.1, ::1 or "
                         "0.0.0.0) nor localhost") from None


def beyond_loopback(address: str) -> bool:
    if address == "localhost":
        return False
    return not ipaddress.ip_address(address).is_loopback


def loud_warning(address: str, port: int) -> str:
    """What to say on stderr when the dashboard listens beyond loopback."""
    everywhere = address in ("0.0.0.0", "::")
    where = "every interface of this machine" if everywhere else address
    return (f"WARNING: the dashboard listens on {where} (port {port}), not only on loopback: anyone who can reach "
            "this machine can try it, and its token travels in clear text (plain HTTP); use an SSH tunnel "
            "(ssh -L) to 127.0.0.1 instead where you can")


def refresh_interval(text: str | float) -> float:
    """`text` as the page's refresh interval in seconds, or ValueError saying why not."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"--refresh {ascii(str(text)[:40])} is not a number of seconds") from None
    if not math.isfinite(value) or not MIN_REFRESH_S <= value <= MAX_REFRESH_S:
        raise ValueError(f"--refresh {ascii(str(text)[:40])}: expected seconds from {MIN_REFRESH_S:g} to "
                         f"{MAX_REFRESH_S:g}")
    return value


__all__ = ["MAX_REFRESH_S", "MIN_REFRESH_S", "beyond_loopback", "listen_address", "loud_warning",
           "refresh_interval"]
