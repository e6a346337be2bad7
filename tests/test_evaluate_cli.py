"""`softtokens evaluate` with several settings in one process (evaluation.one_job_per_setting: false)
writes, per setting, the file its own job would have written."""

import json

import pytest

from softtokens.cli import main
from softtokens.config.grids import PAPER_RL
from softtokens.config.names import COT_KEYS, PLACEMENT_KEYS

# what the workflow hands an evaluation job: every key, the paper's CoT settings (grid.jobs)
SETTINGS = {"n_samples": 2, "cot_max_tokens": 6, "answer_max_tokens": 4, "batch_size": 4, "seed": 0, "dtype": "float32",
            "grading_timeout_s": 5.0, **{k: PAPER_RL[k] for k in (*COT_KEYS, *PLACEMENT_KEYS)}}
VARIES = ("seconds", "engine", "provenance")  # wall time and the job's own record


def evaluate(base, data, settings, outs, given=SETTINGS):
    """In process (cli.main), as the job's `python -m softtokens evaluate` runs it."""
    return main(["evaluate", "--settings", json.dumps(given), "--model", str(base / "model"), "--data", str(data),
                 "--setting", *settings, "--out", *map(str, outs)])


@pytest.mark.slow
def test_several_settings_in_one_process_write_what_separate_jobs_write(base, toy_rows, tmp_path):
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows["test"][:3]))
    names = ["hard_greedy", "soft_sample", "fuzzy_sample"]
    together = [tmp_path / "together" / f"{n}.json" for n in names]
    evaluate(base, data, names, together)
    for name, joint in zip(names, together):
        alone = tmp_path / "alone" / f"{name}.json"
        evaluate(base, data, [name], [alone])
        a, b = json.loads(joint.read_text()), json.loads(alone.read_text())
        assert a["setting"] == name
        assert {k: v for k, v in a.items() if k not in VARIES} == {k: v for k, v in b.items() if k not in VARIES}
        assert a["provenance"]["config"]["setting"] == name
    with pytest.raises(SystemExit, match="one output per setting"):
        evaluate(base, data, ["hard_greedy", "soft_sample"], [tmp_path / "one.json"])
    partial = {k: v for k, v in SETTINGS.items() if k != "soft_temperature"}
    with pytest.raises(SystemExit, match="lacks soft_temperature"):  # no default stands in for the grid's
        evaluate(base, data, ["soft_greedy"], [tmp_path / "one.json"], given=partial)
