"""exit-note: what a workflow job's exit status means, said where a user looks (the console and the job's log).

Why: a job the kernel killed for memory ends with exit status 137 and nothing in its log (its last line is
mid-step), and Snakemake's console says "message: None". The rules run it only when their command fails
(`COMMAND || python -m softtokens exit-note $? ...`), so a job that succeeds pays nothing."""

from __future__ import annotations

import sys
from pathlib import Path

SIGKILL_STATUSES = (137, -9)   # 128 + SIGKILL, as the shell reports it; -9 as Python's subprocess does


def oom_kills() -> int | None:
    """The cgroup's count of processes the OOM killer ended (cgroup v2 memory.events), None where not readable."""
    try:
        for line in Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def exit_note(status: int, job: str, declared_mb: int | None) -> str | None:
    """The note for a job's exit status (None: nothing to add to what the job printed)."""
    if status not in SIGKILL_STATUSES:
        return None
    from softtokens.sizing.host import MB, machine_memory

    total, available = machine_memory()
    kills = oom_kills()
    evidence = (f"; this cgroup's OOM killer has ended {kills} process(es) so far (memory.events)" if kills
                else "")
    declared = f"it declared mem_mb={declared_mb:,}" if declared_mb else "it declared no memory"
    return (f"softtokens: {job} was killed by SIGKILL (exit status {status}): most likely out of memory (the kernel's "
            f"OOM killer){evidence}. {declared}; this machine has {total / MB:,.0f} MB ({available / MB:,.0f} MB "
            "available now). Run fewer jobs at once (--resources mem_mb=N bounds their sum), or lower the job's "
            "micro_batch_size / batch_size; `softtokens plan` prints what each job needs.")


def cmd_exit_note(a) -> int:
    note = exit_note(a.status, a.job, a.mem_mb)
    if note:
        print(note, file=sys.stderr, flush=True)
        for log in a.log:
            with open(log, "a") as f:
                f.write(note + "\n")
    return a.status if 0 < a.status < 256 else 1


def register(sub) -> None:
    c = sub.add_parser("exit-note", help="(workflow rules) say what a failed job's exit status means, then exit "
                                         "with it")
    c.add_argument("status", type=int)
    c.add_argument("--job", required=True)
    c.add_argument("--mem-mb", type=int, default=None)
    c.add_argument("--log", action="append", default=[], help="a log to append the note to (repeatable)")
    c.set_defaults(func=cmd_exit_note)
