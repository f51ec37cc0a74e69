"""The live child processes of a process, read from /proc (the multi-process service's tests
find its front-ends and engine cores this way)."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> dict[int, str]:
    """The live child processes of ``pid``: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(entry.name)] = command
    return found
