"""What the discovery script's output means: Horovod's ``host:slots`` lines, read as a set.

Running the script is the process shell's (driver.py); this is only the reading of what it
printed, shared by the shell (which raises on a bad output) and the tests.
"""

from __future__ import annotations


class DiscoveryError(Exception):
    """The discovery script failed, hung, or printed something Horovod could not parse."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: int | None = None,
        stderr: str = "",
        timeout: bool = False,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr = stderr
        self.timeout = timeout


def parse_discovery_output(output: str, slots_per_host: int | None) -> dict[str, int]:
    """Parses ``host:slots`` lines into an ordered ``{host: slots}``.

    Horovod treats the output as a set, so duplicates are harmless when they agree. A line
    without ``:slots`` takes ``--slots-per-host``; without that flag it is an error here,
    where Horovod would silently give the host ``None`` slots and break later.
    """
    hosts: dict[str, int] = {}
    for raw in output.splitlines():
        line = raw.strip()
        if not line:
            continue
        if ":" in line:
            host, _, slots_text = line.partition(":")
            host = host.strip()
            try:
                slots = int(slots_text.strip())
            except ValueError:
                raise DiscoveryError(f"bad slots in discovery line {line!r}") from None
            if slots < 0:
                raise DiscoveryError(f"negative slots in discovery line {line!r}")
        elif slots_per_host is not None:
            host, slots = line, slots_per_host
        else:
            raise DiscoveryError(f"discovery line {line!r} has no ':slots' and no --slots-per-host")
        if not host or any(c.isspace() for c in host):
            raise DiscoveryError(f"bad host name in discovery line {line!r}")
        if host in hosts and hosts[host] != slots:
            raise DiscoveryError(f"host {host!r} listed with {hosts[host]} and {slots} slots")
        hosts[host] = slots
    return hosts
