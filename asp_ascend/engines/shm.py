"""Shared memory that a rollout instance's vLLM processes leave in /dev/shm (Linux).

vLLM's engine-core process creates its message queues as POSIX shared memory
(``/dev/shm/psm_*``) and unlinks them only when their Python objects are garbage-collected,
which a process that is terminated never does: every run used to leave one or two 160-250 MiB
segments behind. :func:`segments_of_children` lists the segments this process's descendants
have mapped; after the engine has shut down, :func:`unlink` removes those still named (a
process that still maps one keeps its memory until it exits; only the name goes).
Elsewhere (no /proc) both do nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

SHM = Path("/dev/shm")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def segments_of_children(pid: int | None = None) -> set[str]:
    """Names of the /dev/shm files (``psm_*``, ``sem.*``) mapped by the descendants of ``pid``."""
    names: set[str] = set()
    if not SHM.is_dir():
        return names
    for p in _descendants(os.getpid() if pid is None else pid):
        try:
            with open(f"/proc/{p}/maps") as fh:
                for line in fh:
                    if "/dev/shm/" in line:
                        names.add(line.split("/dev/shm/", 1)[1].split()[0])
        except OSError:
            continue
    return {n for n in names if n.startswith(("psm_", "sem."))}


def unlink(names: set[str]) -> list[str]:
    """Remove the named segments that still exist; returns those removed."""
    gone = []
    for n in sorted(names):
        try:
            (SHM / n).unlink()
            gone.append(n)
        except OSError:
            pass
    return gone
