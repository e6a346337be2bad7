
import json

import pytest

from softtokens.audit.chain import audit
from softtokens.model.checkpoint import TrainerState
from softtokens.run.files import (
    atomic_dir,
    atomic_path,
    read_jsonl,
    sha256_path,
    write_json,
)
from softtokens.run.provenance import Provenance, read_record
from softtokens.train.selection import check_checkpoint, select_best


def test_atomic_write_leaves_nothing_on_crash(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "ckpt") as d:
            (d / "w.bin").write_text("x")
            raise RuntimeError("crash")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_jsonl_read_while_written_leaves_out_only_a_half_written_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    assert read_jsonl(path, while_written=True) == [{"step": 1}, {"step": 2}]
    with pytest.raises(ValueError):
        read_jsonl(path)                         # a finished file must be whole
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError):
        read_jsonl(path, while_written=True)     # a bad line before the last is damage, not a writer at work


def test_directory_hash_ignores_its_provenance(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "w.bin").write_text("weights")
    before = sha256_path(d)
    (d / "provenance.json").write_text("{}")
    assert sha256_path(d) == before
    (d / "w.bin").write_text("other")
    assert sha256_path(d) != before


def test_audit_follows_the_chain_and_flags_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": "a"}\n{"id": "b"}\n')
    Provenance("prepare_data", {"seed": 1}).write_sidecar(data)
    result = tmp_path / "eval.json"
    prov = Provenance("evaluate", {"setting": "hard_greedy"}, inputs={"data": data})
    write_json(result, prov.embedded({"n_samples": 1, "pass@1": 0.5, "pass@k": {"1": 0.5},
                                      "problems": [{"id": "a", "n": 1, "correct": 1}, {"id": "b", "n": 1, "correct": 0}]}))
    assert read_record(result)["stage"] == "evaluate"
    table = tmp_path / "main.md"
    table.write_text("| x |\n")
    Provenance("tables", {}, inputs={"eval": result}).write_sidecar(table)

    lines, problems = audit(table)
    text = "\n".join(lines)
    assert problems == 0, text
    assert "[tables]" in text and "[evaluate]" in text and "[prepare_data]" in text

    data.write_text('{"id": "a"}\n{"id": "c"}\n')  # the data changed after the evaluation was made, by no job of
    lines, problems = audit(table)   # ours: it is not what the evaluation read, nor what its own job wrote, and
    text = "\n".join(lines)         # the evaluation's rows are no longer its questions
    assert problems == 3 and "data: CHANGED data.jsonl" in text and "CHANGED data.jsonl since its job wrote it" in text
    assert "rows are not its test set data.jsonl (2 questions): missing 1 (c); not in it 1 (b)" in text
    data.unlink()
    lines, problems = audit(table)
    assert problems == 1 and "MISSING data.jsonl" in "\n".join(lines)


def test_selection_takes_best_and_earliest_on_ties(tmp_path):
    metrics = [{"kind": "validation", "step": 0, "val_greedy_accuracy": 0.3},
               {"kind": "train", "step": 1, "reward": 5.0},
               {"kind": "validation", "step": 20, "val_greedy_accuracy": 0.6},
               {"kind": "validation", "step": 40, "val_greedy_accuracy": 0.6},
               {"kind": "validation", "step": 60, "val_greedy_accuracy": 0.5}]
    chosen = select_best(metrics)
    assert chosen["step"] == 20 and chosen["val_greedy_accuracy"] == 0.6
    assert chosen["base_val_greedy_accuracy"] == 0.3 and chosen["improved_over_base"] is True
    with pytest.raises(ValueError):
        select_best([{"kind": "train", "step": 1}])
    ck = tmp_path / "best"
    ck.mkdir()
    TrainerState(step=40, best_val=0.6, base_val=0.3, embedding_scale={}, sigma=0.0, noise={}, config={},
                 base_model="base", base_revision=None, processes=1).write(ck)
    with pytest.raises(ValueError, match="holds step 40"):
        check_checkpoint(ck, 20)


def test_selection_never_picks_the_base_model():
    """A run whose training only hurt still reports its best trained step, flagged as below the base."""
    metrics = [{"kind": "validation", "step": 0, "val_greedy_accuracy": 0.52},
               {"kind": "validation", "step": 8, "val_greedy_accuracy": 0.41},
               {"kind": "validation", "step": 16, "val_greedy_accuracy": 0.47},
               {"kind": "validation", "step": 24, "val_greedy_accuracy": 0.47}]
    chosen = select_best(metrics)
    assert chosen["step"] == 16 and chosen["val_greedy_accuracy"] == 0.47
    assert chosen["base_val_greedy_accuracy"] == 0.52 and chosen["improved_over_base"] is False
    assert chosen["validated_steps"] == [0, 8, 16, 24]               # the base's validation stays beside it
    tie = select_best(metrics[:1] + [{"kind": "validation", "step": 8, "val_greedy_accuracy": 0.52}])
    assert tie["step"] == 8 and tie["improved_over_base"] is False   # equal is not an improvement
    with pytest.raises(ValueError, match="trained"):
        select_best(metrics[:1])                                     # only the base was validated


def test_hub_revision_is_none_for_a_local_model(tmp_path, tiny_model):
    from softtokens.model.loading import hub_revision, load_model

    tiny_model.save_pretrained(tmp_path / "m")
    assert hub_revision(load_model(tmp_path / "m")) is None
    tiny_model.config._commit_hash = "0123abc"  # what transformers sets for a hub download
    assert hub_revision(tiny_model) == "0123abc"
    tiny_model.config._commit_hash = None


def test_a_deferred_check_refuses_flipped_bytes_before_anything_is_kept(tmp_path, tiny_model, toy_tokenizer,
                                                                        toy_rows):
    """An evaluation hashes the checkpoint beside its work (load_model's defer_check): flipped bytes of the same
    size load without an error, so the evaluation runs, and is refused by the hash before it returns a result."""
    from softtokens.eval.math_eval import evaluate
    from softtokens.model.checkpoint import TrainerState
    from softtokens.model.loading import CheckpointDamaged, confirm_checkpoint, load_model
    from softtokens.model.scale import embedding_scale

    ckpt = tmp_path / "ckpt"
    tiny_model.save_pretrained(ckpt)
    toy_tokenizer.save_pretrained(ckpt)
    TrainerState(step=1, best_val=0.0, base_val=0.0, embedding_scale=embedding_scale(tiny_model).as_dict(), sigma=0.0, noise={}, config={},
                 base_model="toy", base_revision=None, processes=1).write(ckpt)
    confirm_checkpoint(load_model(ckpt, defer_check=True))   # intact: nothing raised
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4000:] = bytes(b ^ 0xFF for b in data[-4000:])
    weights.write_bytes(data)
    model = load_model(ckpt, defer_check=True)               # loads: the bytes are well-formed, only wrong
    with pytest.raises(CheckpointDamaged, match="model.safetensors"):
        confirm_checkpoint(model)
    with pytest.raises(CheckpointDamaged, match=r"refused: .*model.safetensors"):
        evaluate(str(ckpt), toy_rows["test"][:2], "hard_greedy", 1, 4, 2, 4, seed=0)


def test_two_seeds_with_identical_answers_are_flagged(tmp_path, monkeypatch):
    """One seed's evaluation file copied over another's (its record edited to match): every question got the same
    answer in both, which two seeds trained apart do not do on a set with right and wrong answers. Files whose
    answers are all the same carry no information and are not flagged."""
    from softtokens.audit.rows import identical_seed_problems

    monkeypatch.chdir(tmp_path)
    files = []
    for seed, rows in ((0, [1, 0, 1, 1]), (1, [1, 0, 1, 1]), (2, [0, 0, 1, 1])):
        p = tmp_path / f"results/eval/m/ds-hard-seed{seed}/bench/hard_greedy.json"
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps({"problems": [{"id": f"q{i}", "n": 1, "correct": c} for i, c in enumerate(rows)]}))
        files.append(p)
    said = identical_seed_problems(files)
    assert len(said) == 1 and "IDENTICAL SEEDS" in said[0] and "seed1" in said[0] and "seed0" in said[0]
    for p in files:
        doc = json.loads(p.read_text())
        for r in doc["problems"]:
            r["correct"] = 0
        p.write_text(json.dumps(doc))
    assert identical_seed_problems(files) == []
