
import json

import pytest

from softtokens.audit.chain import audit
from softtokens.model.checkpoint import TrainerState
from softtokens.store.files import atomic_dir, atomic_path, read_jsonl, sha256_path, write_json
from softtokens.store.eval_identity import eval_identity
from softtokens.store.provenance import Provenance, read_record
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
    identity = eval_identity("m", "base", "bench", "hard_greedy", {"temperature": 0.0}, sha256_path(data), ["a", "b"])
    write_json(result, prov.embedded({"setting": "hard_greedy", "n_samples": 1, "pass@1": 0.5, "pass@k": {"1": 0.5},
                                      "problems": [{"id": "a", "n": 1, "correct": 1}, {"id": "b", "n": 1, "correct": 0}],
                                      "identity": identity}, result))
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


def _seed_file(tmp_path, seed: int, doc: dict, setting: str = "hard_greedy"):
    p = tmp_path / f"results/eval/m/ds-hard-seed{seed}/bench/{setting}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    return p


def test_a_copied_seed_file_is_flagged_by_its_continuous_values_and_agreeing_honest_seeds_are_not(tmp_path,
                                                                                                monkeypatch):
    """A copy shares what an honestly made file of another seed cannot: its stored log-likelihoods and entropies to
    the last bit. Two honest seeds that answer every question alike (at ceiling, or agreeing everywhere) differ in
    those, so they pass; the answers alone are never evidence."""
    from softtokens.audit.rows import identical_seed_problems

    monkeypatch.chdir(tmp_path)
    rows = [{"id": f"q{i}", "n": 1, "correct": c, "mean_cot_length": 20.0 + i} for i, c in enumerate([1, 0, 1, 1])]
    seed0 = _seed_file(tmp_path, 0, {"problems": rows, "entropy_profile": [0.51, 0.42, 0.3]})
    # the honest twin: every answer the same as seed 0's, its entropies its own
    seed1 = _seed_file(tmp_path, 1, {"problems": rows, "entropy_profile": [0.52, 0.41, 0.3]})
    assert identical_seed_problems([seed0, seed1]) == []
    # a copy: every stored value the same
    seed2 = _seed_file(tmp_path, 2, {"problems": rows, "entropy_profile": [0.51, 0.42, 0.3]})
    said = identical_seed_problems([seed0, seed1, seed2])
    assert len(said) == 1 and "IDENTICAL SEEDS" in said[0] and "seed2" in said[0] and "seed0" in said[0]
    # out of domain, every model at ceiling: identical answers, log-likelihoods of their own: no alarm
    ll = [{"id": f"q{i}", "label": 0, "pred": 0, "loglik": [-0.03 - i / 100, -5.0], "n_tokens": [1, 1],
           "nll_correct": 0.03 + i / 100} for i in range(4)]
    ll_other = [{**r, "loglik": [r["loglik"][0] - 0.001, -4.8], "nll_correct": r["nll_correct"] + 0.001} for r in ll]
    a = _seed_file(tmp_path, 0, {"problems": ll}, "loglik")
    b = _seed_file(tmp_path, 1, {"problems": ll_other}, "loglik")
    assert identical_seed_problems([a, b]) == []
    c = _seed_file(tmp_path, 2, {"problems": ll}, "loglik")
    assert len(identical_seed_problems([a, b, c])) == 1
    # a file that stores no continuous value (answers only) is evidence of nothing
    bare = [{"id": f"q{i}", "n": 1, "correct": 1} for i in range(4)]
    assert identical_seed_problems([_seed_file(tmp_path, 0, {"problems": bare}, "x"),
                                    _seed_file(tmp_path, 1, {"problems": bare}, "x")]) == []


def test_two_seeds_whose_checkpoints_hold_the_same_weights_may_give_the_same_file(tmp_path, monkeypatch):
    """A run that never updated (every reward of every step equal) holds its base's weights under every seed: the
    same evaluation file twice is then honest, and told from a copy by the checkpoints' manifests."""
    from softtokens.audit.rows import identical_seed_problems

    monkeypatch.chdir(tmp_path)
    docs = []
    for seed, weights in ((0, "aa"), (1, "aa"), (2, "bb")):
        ckpt = tmp_path / f"ckpt{seed}"
        ckpt.mkdir()
        (ckpt / "trainer_state.json").write_text(json.dumps({
            "step": 1, "best_val": 0.5, "base_val": 0.5, "embedding_scale": {}, "sigma": 0.0, "noise": {}, "config": {},
            "base_model": "b", "base_revision": None, "processes": 1,
            "files": {"model.safetensors": {"bytes": 1, "sha256": weights}}}))
        docs.append({"problems": [{"id": "q", "n": 1, "correct": 1, "mean_cot_length": 3.0}],
                     "entropy_profile": [0.5],
                     "provenance": {"inputs": {"checkpoint": {"path": str(ckpt), "sha256": "x"}}}})
    files = [_seed_file(tmp_path, s, d) for s, d in enumerate(docs)]
    assert identical_seed_problems(files[:2]) == []          # the same weights: the same numbers, honestly
    said = identical_seed_problems([files[0], files[2]])      # other weights, the same numbers: a copy
    assert len(said) == 1 and "seed2" in said[0]
