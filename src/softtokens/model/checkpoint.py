"""A training checkpoint directory: the consolidated weights (``save_pretrained``), the tokenizer,
for resume the optimizer and schedule, and ``trainer_state.json``, the one file that says what
the checkpoint is. ``TrainerState`` owns that file's format: training writes it, resume, noise
scaling (sigma comes from the base model's E, recorded here), checkpoint selection and the
analysis scripts read it through this type, never by key on raw JSON.

The state is the checkpoint's manifest: it is written last, with the size and sha256 of every other
file, so a directory without it was never finished, a truncated file is caught by its size before
it is read, and a file of the right size with other bytes (a flipped sector, a power loss's zeros)
by its hash (``checkpoint_problem``; ``ContentCheck`` hashes while a loader reads the same bytes).
The directory's own sha256, which its provenance record holds, follows from the manifest
(``manifest_sha256``) without a second read of its files."""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from softtokens.store.files import directory_sha256, hashed_files, sha256_file, sha256_files, write_text

STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    step: int                           # the last trained step the weights include
    best_val: float                     # best greedy validation among trained steps so far (-1: none)
    base_val: float | None              # greedy validation of the base model (step 0)
    embedding_scale: dict               # model.scale.EmbeddingScale of the base model: sets sigma
    sigma: float
    noise: dict                         # train.config.noise_record: what is noised, sigma's rule
    config: dict                        # the run's TrainConfig
    base_model: str
    base_revision: str | None           # the hub commit of the base weights (None: a local base)
    processes: int
    val_greedy_accuracy: float | None = None  # the best checkpoint's own score
    best_step: int | None = None        # the step the run's best checkpoint holds at this state (resume)
    # every other file: {"bytes": size, "sha256": hash} (a bare size in checkpoints written before hashes)
    files: dict[str, dict | int] = field(default_factory=dict)

    @classmethod
    def read(cls, checkpoint: str | Path) -> "TrainerState":
        path = Path(checkpoint) / STATE_FILE
        data = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown keys {', '.join(unknown)} (written by another version?)")
        return cls(**data)

    @classmethod
    def exists(cls, checkpoint: str | Path) -> bool:
        return (Path(checkpoint) / STATE_FILE).is_file()

    def write(self, checkpoint: str | Path, durable: bool = False) -> None:
        """Record the size and sha256 of every file already in ``checkpoint`` (hashed in parallel),
        then write the state, last; ``durable``: fsync'd with its directory."""
        checkpoint = Path(checkpoint)
        files = [f for f in sorted(checkpoint.rglob("*")) if f.is_file() and f.name != STATE_FILE]
        self.files = {str(f.relative_to(checkpoint)): {"bytes": f.stat().st_size, "sha256": h}
                      for f, h in zip(files, sha256_files(files))}
        write_text(checkpoint / STATE_FILE, json.dumps(dataclasses.asdict(self), indent=1), durable)

    def drop_files(self, checkpoint: str | Path, *prefixes: str) -> None:
        """Forget the files under ``prefixes`` (removed from the checkpoint: a finished run's optimizer and
        schedule) and rewrite the state, once."""
        self.files = {n: f for n, f in self.files.items()
                      if not any(n == p or n.startswith(p + "/") for p in prefixes)}
        write_text(Path(checkpoint) / STATE_FILE, json.dumps(dataclasses.asdict(self), indent=1))


def _expected(entry: dict | int) -> tuple[int, str | None]:
    return (entry, None) if isinstance(entry, int) else (entry["bytes"], entry.get("sha256"))


def _state_or_problem(checkpoint: Path) -> tuple[TrainerState | None, str | None]:
    state_path = checkpoint / STATE_FILE
    try:
        return TrainerState.read(checkpoint), None
    except FileNotFoundError:
        return None, f"{state_path} is missing"
    except (OSError, ValueError, TypeError) as err:
        return None, f"{state_path} is unreadable ({type(err).__name__}: {err})"


def size_problem(checkpoint: Path, state: TrainerState) -> str | None:
    for name, entry in state.files.items():
        f = checkpoint / name
        size, _ = _expected(entry)
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} were written"
    return None


def hash_problem(checkpoint: Path, name: str, want: str | None, got: str) -> str | None:
    if want is None or want == got:
        return None
    return (f"{checkpoint / name} has other bytes than were written (sha256 {got[:12]}, the manifest "
            f"{checkpoint / STATE_FILE} says {want[:12]}): damaged on disk or edited")


def checkpoint_problem(checkpoint: str | Path, content: bool = False) -> str | None:
    """Why a saved checkpoint directory cannot be used (None if it can): its state file is missing or
    unreadable, a file it lists is missing or has another size, or (``content``) other bytes than its
    sha256 says."""
    from softtokens.model.data_only import data_only_problem

    checkpoint = Path(checkpoint)
    state, problem = _state_or_problem(checkpoint)
    if problem:
        return problem
    problem = size_problem(checkpoint, state) or data_only_problem(checkpoint)   # data only: before any byte is read
    if problem or not content:
        return problem
    named = [(n, _expected(e)[1]) for n, e in state.files.items() if _expected(e)[1]]
    for (name, want), got in zip(named, sha256_files([checkpoint / n for n, _ in named])):
        problem = hash_problem(checkpoint, name, want, got)
        if problem:
            return problem
    return None


def manifest_files(checkpoint: str | Path) -> dict[str, str] | None:
    """Every file the directory's hash covers (store.files.hashed_files) -> its sha256, from the manifest
    and the state file's own hash; None where the manifest holds no hashes or does not list every file."""
    checkpoint = Path(checkpoint)
    state, problem = _state_or_problem(checkpoint)
    if problem:
        return None
    hashes = {name: _expected(e)[1] for name, e in state.files.items()}
    on_disk = {f.relative_to(checkpoint).as_posix() for f in hashed_files(checkpoint)} - {STATE_FILE}
    if None in hashes.values() or set(hashes) != on_disk:
        return None
    return {**hashes, STATE_FILE: sha256_file(checkpoint / STATE_FILE)}


def manifest_sha256(checkpoint: str | Path, parts: tuple[str, ...] = ()) -> str | None:
    """The directory's sha256 (store.files.sha256_path) from its manifest, without a second read of its
    files; ``parts``: a directory of checkpoints instead (a run's ``checkpoints/``: best, latest)."""
    checkpoint = Path(checkpoint)
    if not parts:
        files = manifest_files(checkpoint)
        return None if files is None else directory_sha256(files)
    listed = {part: manifest_files(checkpoint / part) for part in parts}
    on_disk = {f.relative_to(checkpoint).parts[0] for f in hashed_files(checkpoint)}
    if None in listed.values() or on_disk != set(parts):
        return None
    return directory_sha256({f"{part}/{rel}": h for part, files in listed.items() for rel, h in files.items()})


class ContentCheck:
    """A checkpoint's files hashed in background threads while a loader reads the same bytes (hashlib
    releases the GIL; the second read comes from the page cache). ``problem()`` waits for the hashes; call it
    before anything computed from the load is kept. Measured (benchmarks/checkpoint_check.py, 2 CPUs): sha256
    at 1.36 GB/s on one core, 12x a warm page-cache load of 4.9 GB when waited for at once, 1.6 % of a job
    that evaluates for 20 s when it runs beside the evaluation (model.loading.load_model's defer_check)."""

    def __init__(self, checkpoint: str | Path, content: bool = True):
        """``content`` False: the manifest and the sizes only (its bytes were hashed just before)."""
        self.checkpoint = Path(checkpoint)
        from softtokens.model.data_only import data_only_problem

        state, self._problem = _state_or_problem(self.checkpoint)
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[str, tuple[str, Future]] = {}
        if self._problem is None:
            self._problem = size_problem(self.checkpoint, state) or data_only_problem(self.checkpoint)
        if self._problem is None and content:
            named = {n: _expected(e)[1] for n, e in state.files.items() if _expected(e)[1]}
            if named:
                self._pool = ThreadPoolExecutor(max_workers=min(len(named), os.cpu_count() or 1))
                self._futures = {n: (want, self._pool.submit(sha256_file, self.checkpoint / n))
                                 for n, want in named.items()}

    def early_problem(self) -> str | None:
        """What is wrong before any byte is hashed: the manifest, a file's size, a file that is not data-only."""
        return self._problem

    def problem(self) -> str | None:
        if self._problem is None:
            for name, (want, future) in self._futures.items():
                self._problem = hash_problem(self.checkpoint, name, want, future.result())
                if self._problem:
                    break
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        return self._problem
