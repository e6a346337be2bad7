"""`softtokens evaluate` with several settings in one process (evaluation.one_job_per_setting: false)
writes, per setting, the file its own job would have written."""

import json
import subprocess
import sys

SETTINGS = {"n_samples": 2, "cot_max_tokens": 6, "answer_max_tokens": 4, "batch_size": 4, "seed": 0, "dtype": "float32"}
VARIES = ("seconds", "engine", "provenance")  # wall time and the job's own record


def evaluate(base, data, settings, outs):
    r = subprocess.run([sys.executable, "-m", "softtokens", "evaluate", "--settings", json.dumps(SETTINGS),
                        "--model", str(base / "model"), "--data", str(data), "--setting", *settings,
                        "--out", *map(str, outs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


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
    bad = subprocess.run([sys.executable, "-m", "softtokens", "evaluate", "--settings", json.dumps(SETTINGS),
                          "--model", str(base / "model"), "--data", str(data), "--setting", "hard_greedy", "soft_sample",
                          "--out", str(tmp_path / "one.json")], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "one output per setting" in bad.stderr
