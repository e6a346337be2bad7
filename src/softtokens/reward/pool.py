"""Math grading in worker processes, each answer with a hard wall-clock budget.

Why: ``reward.grader.grade`` times an answer with SIGALRM, which interrupts Python code (sympy, mpmath)
but not one C-level operation: ``\\boxed{9^{9^{9}}}`` and kin can hold the process for minutes,
and a 48-hour, 8-GPU training job with it. Here each answer goes to a worker process; a worker
that has not answered within ``timeout_s`` plus a margin is killed and replaced, and that answer
counts as a time-out (wrong; boxed if it had a box), as ``reward.grader.grade`` counts its own.

Workers start with the ``spawn`` method (a parent holding CUDA state must not fork) once per
pool; a training run or an evaluation job keeps one pool for its life. Each worker takes a share of
the answers at once and reports each as it finishes, so no answer waits for a round trip
(benchmarks/grading_speed.py measures the pool against in-process grading).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import wait

from softtokens.reward.grader import GRADING_TIMEOUT_S, Grade, grade, warm_up

KILL_MARGIN_S = 1.0   # past a worker's own (SIGALRM) budget, before it is killed
CHUNK = 64            # answers handed to a worker at once
MAX_DEAD = 3          # workers lost in a row with no answer graded: grading cannot run here
START_TIMEOUT_S = 300.0  # a worker's start-up (interpreter, imports, math-verify), before it is given up
READY = "ready"       # what a worker sends once started: its first answer's clock starts then


# Stop signals are the parent's to act on: SLURM signals every process of a job (scancel, a
# preemption, the time-limit warning) and a terminal's Ctrl-C the whole process group. A worker
# they killed would turn the answer it was grading into a time-out, and a resumed run's rewards
# would then differ from an uninterrupted one's. The parent ends its workers itself (close).
WORKER_IGNORES = ("SIGINT", "SIGTERM", "SIGUSR1")


def _worker(conn, timeout_s: float, grade_fn) -> None:
    """Grade lists of (index, completion, gold) until None, answering (index, Grade) for each
    answer as it is graded (the parent times each answer from the previous one's result)."""
    for name in WORKER_IGNORES:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    warm_up()
    conn.send(READY)
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone
            return
        if batch is None:
            return
        for i, completion, gold in batch:
            conn.send((i, tuple(grade_fn(completion, gold, timeout_s))))


def _end(proc, conn) -> None:
    """A worker killed (it ignores the stop signals) and reaped, its pipe closed."""
    proc.kill()
    proc.join()
    conn.close()


MAX_WORKERS = 8   # past this the answers of a step (64 rows of the paper, split over the GPUs) wait for none


def pool_size(cpus: int) -> int:
    """Grading workers for a process with ``cpus`` CPUs: one CPU left to the process itself (its host work, the
    GPU's launches), the rest grading, at most MAX_WORKERS; at least one."""
    return max(1, min(MAX_WORKERS, cpus - 1))


class GradingPool:
    def __init__(self, workers: int = 1, timeout_s: float = GRADING_TIMEOUT_S, grade_fn=grade):
        """``grade_fn(completion, gold, timeout_s) -> Grade``, a module-level function (the workers
        import it): the paper's reward."""
        self.workers, self.timeout_s, self.grade_fn = max(1, workers), timeout_s, grade_fn
        self._ctx = mp.get_context("spawn")
        self._procs: list = []
        self.killed = 0  # workers replaced after running past the budget
        self._dead_in_a_row = 0
        # before multiprocessing's own exit handler, which would SIGTERM (ignored) and wait forever
        atexit.register(self.close)

    # ------------------------------------------------------------ workers
    def _spawn(self):
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.timeout_s, self.grade_fn), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _started(self, proc, conn) -> bool:
        """Whether a spawned worker reported ready: its start-up (seconds under load, more from a
        network file system) is not on any answer's clock. One that is not ready is ended."""
        try:
            if conn.poll(START_TIMEOUT_S) and conn.recv() == READY:
                return True
        except (EOFError, OSError):  # it died starting (an import error, no memory)
            pass
        _end(proc, conn)
        self._dead_in_a_row += 1
        if self._dead_in_a_row >= MAX_DEAD:
            self.close()
            raise RuntimeError(f"grading workers failed to start {MAX_DEAD} times in a row (see the errors above)")
        return False

    def _start_all(self, count: int) -> list:
        """``count`` ready workers, started side by side."""
        ready: list = []
        while len(ready) < count:
            spawned = [self._spawn() for _ in range(count - len(ready))]
            ready += [w for w in spawned if self._started(*w)]
        return ready

    def _ensure(self) -> None:
        self._procs += self._start_all(self.workers - len(self._procs))

    def _replace(self, k: int) -> None:
        _end(*self._procs[k])
        self._procs[k] = self._start_all(1)[0]
        self.killed += 1

    # ------------------------------------------------------------ grading
    def grade_many(self, pairs: list[tuple[str, str]]) -> list[Grade]:
        """One Grade per (completion, gold), in order; a pair that repeats (the same answer sampled twice for
        one question) is graded once: the grade is a function of the pair."""
        unique = list(dict.fromkeys(pairs))
        if len(unique) == len(pairs):
            return self._grade_each(pairs)
        graded = dict(zip(unique, self._grade_each(unique)))
        return [graded[p] for p in pairs]

    def _grade_each(self, pairs: list[tuple[str, str]]) -> list[Grade]:
        """Each worker gets a share of the answers at once (no round trip per answer) and reports each as it
        finishes; an answer's budget runs from the previous report, and a worker past it is killed: that answer
        is a time-out, the rest of its share goes back to the queue."""
        from softtokens.reward.grader import last_boxed

        self._ensure()
        out: list[Grade | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))[::-1]
        share = max(1, min(CHUNK, -(-len(pairs) // len(self._procs))))
        queued: dict[int, list[int]] = {}   # worker -> its answers not yet reported, in order
        since: dict[int, float] = {}        # worker -> when its current answer started
        budget = self.timeout_s + KILL_MARGIN_S if self.timeout_s else float("inf")
        while pending or queued:
            for k in range(len(self._procs)):
                if k not in queued and pending:
                    take = [pending.pop() for _ in range(min(share, len(pending)))]
                    self._procs[k][1].send([(i, *pairs[i]) for i in take])
                    queued[k], since[k] = take, time.monotonic()
            conns = {self._procs[k][1]: k for k in queued}
            soonest = min(since[k] for k in queued) + budget
            wait_s = None if soonest == float("inf") else max(0.0, soonest - time.monotonic())
            for conn in wait(list(conns), timeout=wait_s):
                k = conns[conn]
                while k in queued and conn.poll():
                    try:
                        i, g = conn.recv()
                    except (EOFError, OSError):  # the worker died (an exception, out of memory, a signal)
                        self._fail(k, queued, pending, out, pairs, last_boxed, crashed=True)
                        break
                    out[i] = Grade(*g)
                    self._dead_in_a_row = 0
                    queued[k].remove(i)
                    since[k] = time.monotonic()
                    if not queued[k]:
                        del queued[k]
            now = time.monotonic()
            for k in [k for k in queued if now - since[k] >= budget]:  # stuck in one C call
                self._fail(k, queued, pending, out, pairs, last_boxed, crashed=False)
        return out

    def _fail(self, k: int, queued: dict, pending: list, out: list, pairs: list, last_boxed, crashed: bool) -> None:
        """Worker k's current answer is a time-out; it is replaced; its other answers are queued again.
        A worker killed past its budget is the answer's doing (however many in a row); workers that
        crash (an exception in the grader, no memory) MAX_DEAD times in a row with no answer graded
        between cannot grade here: the job stops, saying so, rather than score every answer zero."""
        if crashed:
            self._dead_in_a_row += 1
            if self._dead_in_a_row >= MAX_DEAD:
                self.close()
                raise RuntimeError(f"grading workers died {MAX_DEAD} times in a row without grading an answer: "
                                   "they cannot run here (see the errors above)")
        current, *rest = queued.pop(k)
        out[current] = Grade(last_boxed(pairs[current][0]) is not None, False, True)
        pending.extend(reversed(rest))
        self._replace(k)

    def grade(self, completion: str, gold: str, timeout_s: float | None = None) -> Grade:
        return self.grade_many([(completion, gold)])[0]

    def close(self) -> None:
        for proc, conn in self._procs:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for proc, conn in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
            conn.close()
        self._procs = []

    def __enter__(self) -> "GradingPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
