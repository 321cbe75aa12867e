"""What a process holds, read from /proc (Linux): resident memory, open files, threads. The soak bench
reads them at the start and the end of a run: a server or engine that leaks shows here first."""

import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def process_figures(pid: int) -> dict[str, int | None]:
    """{"rss_bytes", "open_files", "threads"} of `pid`, None where the process is gone or unreadable."""
    figures: dict[str, int | None] = {"rss_bytes": None, "open_files": None, "threads": None}
    try:
        with open(f"/proc/{pid}/statm") as f:
            figures["rss_bytes"] = int(f.read().split()[1]) * PAGE
        figures["open_files"] = len(os.listdir(f"/proc/{pid}/fd"))
        figures["threads"] = len(os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError, IndexError):
        pass
    return figures


def children(pid: int) -> list[int]:
    """The direct children of `pid` (the engine's grammar worker, for one)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []
