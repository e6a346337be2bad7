"""The paper's datasets, read from the Hugging Face hub or from a local copy, normalised to the
project's row schemas: math ``{"id", "question", "answer"}``, multiple choice
``{"id", "context", "choices", "label"}``.

One ``Source`` per dataset says where it lives (hub id, config, which source split feeds our
``train`` and ``test``) and how one raw row becomes ours. A raw row without a usable answer is
dropped and counted by reason, never silently; a malformed local file fails naming file and
line. The same reader serves the hub, a local file and a local directory, so the fixture tests
under ``tests/fixtures/`` exercise the code a cluster run uses."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from tqdm import tqdm

from softtokens.data.rows import DataFormatError, jsonl_objects
from softtokens.reward.grader import last_boxed


class DropRow(Exception):
    """A raw row with no usable answer; the message is the reason it is counted under."""


def _gsm8k_gold(answer: str) -> str:
    if "####" not in answer:
        raise DropRow("no '####' in answer")
    gold = clean_gold(answer.rsplit("####", 1)[1].replace(",", ""))
    if not gold:
        raise DropRow("empty answer after '####'")
    return gold


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


_SUBSCRIPT_OPERATOR = re.compile(r"_\{\s*\\(max|min)\s*\}")


def clean_gold(answer: str) -> str:
    """A gold answer as plain LaTeX math: every unescaped ``$`` removed (OlympiadBench writes
    several answers as ``$69$,$84$``; ``\\$`` stays a dollar sign), one trailing sentence period
    dropped, and ``m_{\\max}`` written ``m_{max}`` (LaTeX's operator does not parse as a name)."""
    a = _UNESCAPED_DOLLAR.sub("", answer).strip()
    if a.endswith(".") and not a.endswith("\\."):
        a = a[:-1].rstrip()
    return _SUBSCRIPT_OPERATOR.sub(r"_{\1}", a)


def _gold(value, reason: str) -> str:
    """A cleaned gold answer, or DropRow(reason) when nothing is left."""
    gold = clean_gold(_require(value, reason))
    if not gold:
        raise DropRow(reason)
    return gold


def _require(value, reason: str) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DropRow(reason)
    return str(value).strip()


# ---------------------------------------------------------------- row normalisers
def norm_gsm8k(raw: dict) -> dict:
    return {"question": _require(raw.get("question"), "empty question"), "answer": _gsm8k_gold(raw.get("answer") or "")}


def norm_math(raw: dict) -> dict:
    gold = last_boxed(raw.get("solution") or "")
    if gold is None:
        raise DropRow("no \\boxed{} in solution")
    extra = {k: raw[k] for k in ("level", "type") if k in raw}
    return {"question": _require(raw.get("problem"), "empty problem"), "answer": clean_gold(gold), **extra}


def norm_problem_answer(raw: dict) -> dict:
    """DeepScaleR and MATH-500: ``problem`` and ``answer`` fields."""
    extra = {k: raw[k] for k in ("level", "subject", "unique_id") if k in raw}
    return {"question": _require(raw.get("problem"), "empty problem"),
            "answer": _gold(raw.get("answer"), "empty answer"), **extra}


def norm_olympiadbench(raw: dict) -> dict:
    """``final_answer`` is a list (several answers for multi-answer problems, joined by ', ');
    answers come wrapped in $...$, sometimes several in one string (``$69$,$84$``)."""
    finals = raw.get("final_answer")
    if isinstance(finals, str):
        finals = [finals]
    answers = [g for g in (clean_gold(a) for a in finals or [] if isinstance(a, str)) if g]
    if not answers:
        raise DropRow("empty final_answer")
    if raw.get("image_1") or raw.get("images"):
        raise DropRow("has an image")
    return {"question": _require(raw.get("question"), "empty question"), "answer": ", ".join(answers),
            **({"unit": raw["unit"]} if raw.get("unit") else {})}


def _hellaswag_text(text: str) -> str:
    """lm-evaluation-harness's HellaSwag preprocessing (WikiHow artefacts removed)."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def norm_hellaswag(raw: dict) -> dict:
    if str(raw.get("label", "")).strip() == "":
        raise DropRow("no label")
    ctx = f"{raw.get('ctx_a', '')} {str(raw.get('ctx_b', '')).capitalize()}"
    endings = list(raw.get("endings") or [])
    label = int(raw["label"])
    if not 0 <= label < len(endings):
        raise DropRow("label out of range")
    context = _hellaswag_text(f"{raw.get('activity_label', '')}: {ctx}")
    return {"context": context, "question": f"Which ending completes the passage best?\n{context} ...",
            "choices": [_hellaswag_text(e) for e in endings], "label": label}


def _question_answer_context(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer:"


def norm_arc(raw: dict) -> dict:
    """Labels are A-E or 1-4; the gold index is the position of ``answerKey`` among them."""
    choices = raw.get("choices") or {}
    labels, texts = list(choices.get("label") or []), list(choices.get("text") or [])
    key = str(raw.get("answerKey", "")).strip()
    if key not in labels:
        raise DropRow("answerKey not among choice labels")
    question = _require(raw.get("question"), "empty question").strip()
    return {"context": _question_answer_context(question), "question": question, "choices": texts,
            "label": labels.index(key)}


def norm_mmlu(raw: dict) -> dict:
    choices = list(raw.get("choices") or [])
    label = raw.get("answer")
    if isinstance(label, str) and label.strip() in "ABCD" and label.strip():
        label = "ABCD".index(label.strip())
    if not isinstance(label, int) or not 0 <= label < len(choices):
        raise DropRow("answer not an index into choices")
    question = _require(raw.get("question"), "empty question").strip()
    return {"context": _question_answer_context(question), "question": question, "choices": choices, "label": label,
            **({"subject": raw["subject"]} if raw.get("subject") else {})}


# ---------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    hub_id: str
    hf_config: str | None
    splits: dict[str, str]              # our split ('train' / 'test') -> the source's split name
    normalise: Callable[[dict], dict]
    kind: str = "math"                  # math | multiple_choice
    id_field: str | None = None         # raw field kept as the row's source id
    notes: str = ""
    # questions in the test set as the paper (and this loader) evaluates it: the reproduction's standard
    # errors and the cost forecast (cost.forecast) count them; None for a training-only set
    test_size: int | None = None
    gold: str = ""                      # how the gold answer (or label) is read: docs/data-and-reward.md's table
    train_size: int | None = None       # rows of the source's training split, where it has one
    # a training set's typical question, in characters: what the cost forecast assumes a prompt holds before
    # the data is prepared (an estimate of the order of the set's questions: short word problems, competition
    # statements; once the data is on disk the forecast measures it: cost.forecast.prompt_tokens)
    question_chars: int | None = None


SOURCES: dict[str, Source] = {
    "gsm8k": Source("openai/gsm8k", "main", {"train": "train", "test": "test"}, norm_gsm8k, test_size=1319,
                    train_size=7473, gold="text after `####`, commas removed", question_chars=250),
    "math": Source("DigitalLearningGmbH/MATH-lighteval", "default", {"train": "train", "test": "test"}, norm_math,
                   notes="Hendrycks MATH mirror; the original hub id was taken down", train_size=7500,
                   question_chars=250,
                   gold="last `\\boxed{}` of `solution` (balanced braces; `\\boxed 5`, `\\fbox{}`)"),
    "deepscaler": Source("agentica-org/DeepScaleR-Preview-Dataset", None, {"train": "train"}, norm_problem_answer,
                         train_size=40315, gold="`answer` (`$` removed)", question_chars=300),
    "math500": Source("HuggingFaceH4/MATH-500", None, {"test": "test"}, norm_problem_answer, id_field="unique_id",
                      test_size=500, gold="`answer`"),
    "olympiadbench": Source("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", {"test": "train"}, norm_olympiadbench,
                            id_field="id", notes="675 English, text-only, open-ended math problems", test_size=675,
                            gold="`final_answer` list, every `$` removed (`$69$,$84$` → `69,84`), several answers "
                                 "joined by `, `"),
    "hellaswag": Source("Rowan/hellaswag", None, {"test": "validation"}, norm_hellaswag, kind="multiple_choice",
                        id_field="ind", test_size=10042,
                        gold="`label`; context and endings preprocessed as lm-evaluation-harness does"),
    "arc": Source("allenai/ai2_arc", "ARC-Challenge", {"test": "test"}, norm_arc, kind="multiple_choice", id_field="id",
                  notes="the AI2 Reasoning Challenge set the paper names (docs/protocol.md); the paper's own "
                        "accuracies admit 1,165 questions, not the split's 1,172 (docs/protocol.md)", test_size=1172,
                  gold="index of `answerKey` among the labels (A–E or 1–4)"),
    "mmlu": Source("cais/mmlu", "all", {"test": "test"}, norm_mmlu, kind="multiple_choice", test_size=14042,
                   gold="`answer` (0–3)"),
}
# the loaders whose rows the workflow generates (data.toy), and every loader a config may name
GENERATED = {"toy": ("math", ("train", "test")), "toy_mc": ("multiple_choice", ("test",))}
LOADERS = (*SOURCES, *GENERATED)


def test_size(loader: str) -> int | None:
    """Questions in a loader's test set (None: generated, or training only: the config says)."""
    source = SOURCES.get(loader)
    return source.test_size if source else None


# ---------------------------------------------------------------- raw readers
def _file_rows(path: Path) -> Iterator[tuple[str, dict]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        yield from jsonl_objects(path)
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise DataFormatError(f"{path}:1: expected a JSON array of objects")
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise DataFormatError(f"{path}: element {i}: expected a JSON object")
            yield f"{path}[{i}]", row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise DataFormatError(f"{path}: not a readable parquet file ({e})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}#row{i}", row
    else:
        raise DataFormatError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")


def _dataset_rows(ds, where: str) -> Iterator[tuple[str, dict]]:
    for i, row in enumerate(ds):
        yield f"{where}#row{i}", dict(row)


def read_raw(source: Source, split: str, hub_id: str | None = None, hf_config: str | None = None,
             path: str | None = None, revision: str | None = None) -> tuple[Iterator[tuple[str, dict]], str, str | None]:
    """Raw rows of one of our splits, each with where it came from; a reference to record; the
    local file or directory read (None for the hub).

    ``path`` (for clusters without internet) is a file (.jsonl/.json/.parquet; ``{split}`` in it
    is replaced by the source's split name), a ``save_to_disk`` directory, or a local clone of
    the hub repository; otherwise the rows come from the hub (``hub_id``, ``hf_config``, and a
    ``revision`` to pin a commit; the reference records it, or the cache fingerprint)."""
    src_split = source.splits[split]
    hub_id, hf_config = hub_id or source.hub_id, hf_config if hf_config is not None else source.hf_config
    if path:
        p = Path(str(path).replace("{split}", src_split))
        if not p.exists():
            raise FileNotFoundError(f"{p}: local copy of {hub_id} ({split} split) not found")
        if p.is_file():
            return _file_rows(p), str(p), str(p)
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            import datasets

            ds = datasets.load_from_disk(str(p))
            ds = ds[src_split] if isinstance(ds, datasets.DatasetDict) else ds
            return _dataset_rows(ds, f"{p}[{src_split}]"), f"{p}[{src_split}]", str(p)
        import datasets

        ds = datasets.load_dataset(str(p), hf_config, split=src_split)
        return _dataset_rows(ds, f"{p}[{src_split}]"), f"{p}:{hf_config}[{src_split}]", str(p)
    import datasets

    ds = datasets.load_dataset(hub_id, hf_config, split=src_split, revision=revision)
    pin = f"revision {revision}" if revision else f"fingerprint {ds._fingerprint}"
    return _dataset_rows(ds, f"{hub_id}[{src_split}]"), f"hf://{hub_id}:{hf_config}[{src_split}] ({pin})", None


@dataclass
class LoadReport:
    """What happened to the raw rows of one split: read, kept, dropped by reason."""

    reference: str
    local_path: str | None = None       # the file or directory read, when not the hub
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"reference": self.reference, "local_path": self.local_path, "read": self.read, "kept": self.kept,
                "dropped": dict(self.dropped)}


def load_split(name: str, loader: str, split: str, hub_id: str | None = None, hf_config: str | None = None,
               path: str | None = None, revision: str | None = None) -> tuple[list[dict], LoadReport]:
    """Normalised rows of one split of a configured dataset (``name`` prefixes the ids)."""
    if loader not in SOURCES:
        raise ValueError(f"dataset {name!r}: unknown loader {loader!r} (known: {', '.join(LOADERS)})")
    source = SOURCES[loader]
    if split not in source.splits:
        raise ValueError(f"dataset {name!r}: {loader} has no {split!r} split (it has {', '.join(source.splits)})")
    raw_rows, reference, local = read_raw(source, split, hub_id, hf_config, path, revision)
    report, rows = LoadReport(reference, local), []
    for where, raw in tqdm(raw_rows, desc=f"{name} {split}", unit=" rows", mininterval=10):
        report.read += 1
        try:
            row = source.normalise(raw)
            if source.kind == "math":
                _check_gold(row["answer"])
        except DropRow as reason:
            report.dropped[str(reason)] += 1
            continue
        except (TypeError, ValueError, AttributeError) as e:
            raise DataFormatError(f"{where}: cannot read a {loader} row ({type(e).__name__}: {e})") from None
        sid = raw.get(source.id_field) if source.id_field else None
        row = {"id": f"{name}-{split}-{report.read - 1:05d}", **({"source_id": str(sid)} if sid is not None else {}),
               **row}
        rows.append(row)
        report.kept += 1
    return rows, report


def _check_gold(gold: str) -> None:
    """DropRow unless the gold's own boxed copy earns the full reward (reward.grader.gold_problem):
    a row the reward cannot grade would pay 0 or 10 for every answer, or 100 for wrong ones."""
    from softtokens.reward.grader import gold_problem

    why = gold_problem(gold)
    if why:
        raise DropRow(why)


def check_generated_golds(name: str, rows: list[dict]) -> None:
    """Generated (toy) rows go through the same check; a failure there is a generator bug."""
    from softtokens.reward.grader import gold_problem

    bad = {r["answer"]: gold_problem(r["answer"]) for r in rows if gold_problem(r["answer"])}
    if bad:
        raise ValueError(f"dataset {name!r}: generated gold answers the reward cannot grade: {bad}")


class LoaderKind(NamedTuple):
    """What config checks and the workflow plan from, per loader."""

    kind: str                  # math | multiple_choice
    splits: tuple[str, ...]    # the splits it has: 'train' feeds train + validation
    generated: bool            # its rows are made by the workflow (data.toy): no hub id or local copy is read


def loader_kind(loader: str) -> LoaderKind:
    """A loader's kind, splits and whether it is generated, the toy ones included (config.grids.check_config
    is handed this: the data layer's registry of loaders is the one list)."""
    if loader in GENERATED:
        return LoaderKind(*GENERATED[loader], generated=True)
    if loader not in SOURCES:
        raise KeyError(f"{loader!r} is not one of {', '.join(LOADERS)}")
    source = SOURCES[loader]
    return LoaderKind(source.kind, tuple(source.splits), generated=False)


def check_local_sources(config: dict, grid_name: str) -> None:
    """Every dataset of the grid read from a local copy (`path:`) whose prepared files do not exist
    yet: each split it will read must be there. Called when the workflow is parsed, so a dry run
    refuses a missing copy, naming the key, instead of the first job failing on it."""
    from softtokens.config.grids import ConfigError
    from softtokens.store.paths import data_path

    grid = config["grids"][grid_name]
    for name, spec in grid["datasets"].items():
        if not spec.get("path") or spec["loader"] not in SOURCES:
            continue
        source = SOURCES[spec["loader"]]
        for split, src_split in source.splits.items():
            ours = ("train", "validation") if split == "train" else (split,)
            if all(Path(data_path(grid["results"], name, s)).exists() for s in ours):
                continue  # prepared already: the copy is not read again
            local = Path(str(spec["path"]).replace("{split}", src_split))
            if not local.exists():
                raise ConfigError(f"'grids.{grid_name}.datasets.{name}.path': {local} does not exist (the local "
                                  f"copy of {spec['loader']}'s {src_split!r} split, read for our {split!r} split)")
