"""Every loader reads its hand-written fixture (tests/fixtures/, the source's own row format)
through `splits.prepare`, the function `python -m softtokens prepare-data` runs on the cluster."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from softtokens.data.rows import DataFormatError
from softtokens.data.sources import SOURCES, clean_gold
from softtokens.data.splits import prepare
from softtokens.reward.grader import last_boxed

FIXTURES = Path(__file__).parent / "fixtures"


def settings(loader, **kw):
    return {"loader": loader, "path": str(FIXTURES / loader / "{split}.jsonl"), "seed": 0, **kw}


def answers(rows):
    return [r["answer"] for r in rows]


def test_gsm8k_gold_after_hashes_and_drops_counted():
    out, reports = prepare("gsm8k", settings("gsm8k", validation_size=1))
    assert sorted(answers(out["train"] + out["validation"])) == sorted(["16", "33", "2500", "3", "35"])
    assert len(out["validation"]) == 1 and len(out["train"]) == 4
    assert answers(out["test"]) == ["24", "5"]
    assert reports["train"]["dropped"] == {"no '####' in answer": 1} and reports["train"]["read"] == 6
    assert reports["test"]["dropped"] == {"empty answer after '####'": 1}
    # validation is a seeded slice: the same seed gives the same slice, another seed may not
    again, _ = prepare("gsm8k", settings("gsm8k", validation_size=1))
    assert again == out
    ids = {r["id"] for r in out["train"]} | {r["id"] for r in out["validation"]}
    assert len(ids) == 5


def test_math_gold_is_last_boxed_of_solution():
    out, reports = prepare("math", settings("math", validation_size=1))
    got = {r["question"]: r["answer"] for r in out["train"] + out["validation"]}
    assert got["What is $2^5$?"] == "32"
    assert got["Simplify $\\frac{6}{8}$."] == "\\frac{3}{4}"
    assert got["Solve $x+1=3$ and then double it."] == "4"        # the last box, not the first
    assert got["Find the vertex of $y=(x-1)^2+2$."] == "(1,2)"
    assert got["What is $1+1$?"] == "2"                           # brace-less \boxed 2
    assert reports["train"]["dropped"] == {"no \\boxed{} in solution": 1}
    assert out["test"][0]["answer"] == "7" and out["test"][0]["level"] == "Level 1"


def test_deepscaler_and_math500():
    out, reports = prepare("deepscaler", settings("deepscaler", validation_size=1), ("train", "validation"))
    assert sorted(answers(out["train"] + out["validation"])) == ["1", "13", "6", "8"]  # $1$ unwrapped
    assert reports["train"]["dropped"] == {"empty answer": 1, "gold is prose, not math": 1}
    with pytest.raises(ValueError, match="no 'test' split"):
        prepare("deepscaler", settings("deepscaler", validation_size=1), ("test",))
    out, _ = prepare("math500", settings("math500"), ("test",))
    assert answers(out["test"]) == ["21", "\\frac{1}{2}", "3"]
    assert out["test"][0]["source_id"] == "test/prealgebra/9001.json"


def test_olympiadbench_final_answer_list():
    out, reports = prepare("olympiadbench", settings("olympiadbench"), ("test",))
    assert answers(out["test"]) == ["8", "-2, 2", "9", "13,21", "(-\\infty, 2] \\cup\\{5\\}", "q_{min}=2 n-3"]
    assert out["test"][2]["unit"] == "$\\mathrm{~cm}^2$"
    assert reports["test"]["read"] == 10 and reports["test"]["dropped"] == {
        "empty final_answer": 1, "gold unreadable by math-verify": 1, "gold is prose, not math": 1,
        "gold ends in a variable math-verify strips as a unit": 1}


def test_every_kept_gold_earns_the_full_reward_boxed():
    """What prepare-data guarantees for every math row it keeps, whatever the source."""
    from softtokens.reward.grader import reward

    for loader, source in SOURCES.items():
        if source.kind != "math":
            continue
        splits = tuple(s for ours in source.splits for s in (("train", "validation") if ours == "train" else (ours,)))
        out, _ = prepare(loader, settings(loader, validation_size=1), splits)
        for rows in out.values():
            for r in rows:
                assert reward(" \\boxed{" + r["answer"] + "}.", r["answer"]) == 100.0, (loader, r["answer"])


def test_clean_gold():
    assert clean_gold("$69$,$84$") == "69,84"                       # OlympiadBench's several answers in one
    assert clean_gold("$f(n)=n$, $g(n)=1$") == "f(n)=n, g(n)=1"
    assert clean_gold("\\$18.90") == "\\$18.90"                      # an escaped dollar sign stays
    assert clean_gold("$(-\\infty, 0) \\cup\\{1\\}$.") == "(-\\infty, 0) \\cup\\{1\\}"  # a trailing period goes
    assert clean_gold("m_{\\max }=n^{2}-n-1") == "m_{max}=n^{2}-n-1"
    assert clean_gold(" $$\\frac{1}{2}$$ ") == "\\frac{1}{2}"


def test_multiple_choice_loaders():
    out, reports = prepare("hellaswag", settings("hellaswag"), ("test",))
    rows = out["test"]
    assert [r["label"] for r in rows] == [0, 1] and reports["test"]["dropped"] == {"no label": 1}
    assert rows[0]["context"] == "Making tea: A woman fills a kettle with water. She"
    assert rows[0]["choices"][2] == "paints the kettle. blue."  # lm-eval's ' [title]' -> '. '
    out, reports = prepare("arc", settings("arc"), ("test",))
    assert [r["label"] for r in out["test"]] == [1, 0]          # 'B' of A-D, '1' of 1-3
    assert out["test"][0]["context"] == "Question: Which of these is a liquid at room temperature?\nAnswer:"
    assert reports["test"]["dropped"] == {"answerKey not among choice labels": 1}
    out, reports = prepare("mmlu", settings("mmlu"), ("test",))
    assert [r["label"] for r in out["test"]] == [1, 1, 2] and out["test"][2]["choices"][2] == "Mercury"
    assert reports["test"]["dropped"] == {"answer not an index into choices": 1}


def test_every_source_has_a_fixture():
    for loader, source in SOURCES.items():
        for split in source.splits.values():
            assert (FIXTURES / loader / f"{split}.jsonl").exists(), (loader, split)


def test_malformed_file_names_file_and_line(tmp_path):
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2", "answer": \n')
    with pytest.raises(DataFormatError, match=r"test\.jsonl:2: not valid JSON"):
        prepare("gsm8k", {"loader": "gsm8k", "path": str(bad)}, ("test",))
    bad.write_text('{"question": "q", "answer": "#### 1"}\n[1, 2]\n')
    with pytest.raises(DataFormatError, match=r"test\.jsonl:2: expected a JSON object"):
        prepare("gsm8k", {"loader": "gsm8k", "path": str(bad)}, ("test",))
    bad.write_text('{"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "A"}\n'
                   '{"question": "q", "choices": 5, "answerKey": "A"}\n')
    with pytest.raises(DataFormatError, match=r"test\.jsonl:2: cannot read a arc row"):
        prepare("arc", {"loader": "arc", "path": str(bad)}, ("test",))
    with pytest.raises(FileNotFoundError, match="not found"):
        prepare("gsm8k", {"loader": "gsm8k", "path": str(tmp_path / "missing.jsonl")}, ("test",))
    with pytest.raises(ValueError, match="unknown loader"):
        prepare("x", {"loader": "nope"}, ("test",))


def _hub_clone(root: Path) -> None:
    """A local copy laid out like the hub repository openai/gsm8k (parquet under main/)."""
    import pandas as pd

    (root / "main").mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(x) for x in (FIXTURES / "gsm8k" / f"{split}.jsonl").read_text().splitlines()]
        pd.DataFrame(rows).to_parquet(root / "main" / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n"
                                    "  - split: train\n    path: main/train-*\n  - split: test\n    path: main/test-*\n---\n")


def test_local_copies_read_like_the_jsonl(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    reference, _ = prepare("gsm8k", settings("gsm8k", validation_size=1))
    _hub_clone(tmp_path / "clone")
    from_clone, reports = prepare("gsm8k", {"loader": "gsm8k", "path": str(tmp_path / "clone"), "validation_size": 1,
                                            "seed": 0})
    assert from_clone == reference and reports["test"]["reference"].endswith(":main[test]")
    assert reports["test"]["local_path"] == str(tmp_path / "clone")
    parquet = tmp_path / "clone" / "main" / "{split}-00000-of-00001.parquet"
    from_parquet, _ = prepare("gsm8k", {"loader": "gsm8k", "path": str(parquet), "validation_size": 1, "seed": 0})
    assert from_parquet == reference
    import datasets

    datasets.load_dataset(str(tmp_path / "clone"), "main").save_to_disk(str(tmp_path / "saved"))
    from_disk, _ = prepare("gsm8k", {"loader": "gsm8k", "path": str(tmp_path / "saved"), "validation_size": 1, "seed": 0})
    assert from_disk == reference


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("\\fbox{x}") == "x"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("no box") is None


def test_cli_prepare_data_records_counts_and_hashes(tmp_path):
    s = json.dumps(settings("mmlu"))
    res = subprocess.run([sys.executable, "-m", "softtokens", "prepare-data", "--dataset", "mmlu", "--settings", s,
                          "--out-dir", str(tmp_path), "--splits", "test"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "kept 3, dropped 1 (1 answer not an index into choices)" in res.stdout
    assert not (tmp_path / "train.jsonl").exists()
    prov = json.loads((tmp_path / "test.jsonl.prov.json").read_text())
    assert prov["external_inputs"]["source_test"]["sha256"] and prov["rows"] == 3
    assert prov["source_reports"]["test"]["dropped"] == {"answer not an index into choices": 1}

    s = json.dumps(settings("olympiadbench"))
    res = subprocess.run([sys.executable, "-m", "softtokens", "prepare-data", "--dataset", "olympiadbench", "--settings",
                          s, "--out-dir", str(tmp_path), "--splits", "test"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "1 gold unreadable by math-verify" in res.stdout and "1 gold is prose, not math" in res.stdout
    prov = json.loads((tmp_path / "test.jsonl.prov.json").read_text())
    assert prov["source_reports"]["test"]["dropped"]["gold ends in a variable math-verify strips as a unit"] == 1
