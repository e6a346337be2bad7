"""evaluate (a model on a math benchmark under one or more inference settings) and
evaluate-loglik (a model on a multiple-choice benchmark, out of domain)."""

from __future__ import annotations

from softtokens.commands.common import (
    add_expect,
    add_model_args,
    check_expected,
    model_to_evaluate,
    parse_settings,
    record_base_model,
    require,
    selection_record,
)

EVAL_KEYS = ("n_samples", "cot_max_tokens", "answer_max_tokens", "batch_size", "seed", "dtype", "grading_timeout_s")
LOGLIK_KEYS = ("protocol", "cot_max_tokens", "answer_max_tokens", "batch_size", "loglik_batch_size", "dtype")


def cmd_evaluate(a) -> None:
    from softtokens.data.rows import read_jsonl
    from softtokens.engine.settings import placement_of
    from softtokens.eval.math_eval import MathEvaluator
    from softtokens.run.files import write_json
    from softtokens.run.names import COT_KEYS, PLACEMENT_KEYS
    from softtokens.run.provenance import Provenance, hashed_inputs

    s = parse_settings(a.settings)
    require(s, *EVAL_KEYS, *COT_KEYS, *PLACEMENT_KEYS, command="evaluate")
    if len(a.setting) != len(a.out):
        raise SystemExit(f"evaluate: {len(a.setting)} --setting but {len(a.out)} --out; give one output per setting")
    model_path, inputs = model_to_evaluate(a)
    expected = check_expected(a.expect)
    cot = {k: s[k] for k in COT_KEYS}  # the grid's (or the run's) CoT settings
    rows = read_jsonl(a.data)
    hashed = hashed_inputs({**inputs, "data": a.data})   # once for every setting
    leaves = None
    # several settings in one process (evaluation.one_job_per_setting: false) pay the start-up once;
    # each file is what its own job would have written
    with MathEvaluator(model_path, s["dtype"], a.threads, s["grading_timeout_s"]) as ev:
        for setting, out in zip(a.setting, a.out):
            prov = Provenance("evaluate", {**s, "setting": setting}, hashed=hashed, seeds={"seed": s["seed"]},
                              params=s)
            prov.expected = expected
            result = ev.run(rows, setting, s["n_samples"], s["cot_max_tokens"], s["answer_max_tokens"],
                            s["batch_size"], s["seed"], cot=cot, placement=placement_of(s))
            if leaves is None:
                record_base_model(prov, model_path, result["model_revision"])
                leaves = prov.leaves()
            prov.add_leaves(leaves)
            write_json(out, prov.embedded({**result, **selection_record(a)}))
            print(f"{setting}: pass@1 {result['pass@1']:.3f}, pass@{result['n_samples']} "
                  f"{result['pass@k'][str(result['n_samples'])]:.3f}, grading time-outs {result['grading_timeouts']} "
                  f"({result['seconds']} s); sigma {result['sigma']:.4g}, set by {result['sigma_source']}", flush=True)


def cmd_evaluate_loglik(a) -> None:
    from softtokens.data.rows import read_jsonl
    from softtokens.eval.ood import evaluate_ood
    from softtokens.run.files import write_json
    from softtokens.run.provenance import Provenance

    s = parse_settings(a.settings)
    require(s, *LOGLIK_KEYS, command="evaluate-loglik")
    model_path, inputs = model_to_evaluate(a)
    expected = check_expected(a.expect)
    prov = Provenance("evaluate_loglik", s, inputs={**inputs, "data": a.data}, params=s)
    prov.expected = expected
    rows = read_jsonl(a.data, required=("id", "context", "choices", "label"))
    result = evaluate_ood(model_path, rows, s["protocol"], s["cot_max_tokens"], s["answer_max_tokens"],
                          s["batch_size"], s["loglik_batch_size"], s["dtype"], a.threads)
    record_base_model(prov, model_path, result["model_revision"])
    write_json(a.out, prov.embedded({**result, **selection_record(a)}))
    print(f"{s['protocol']} accuracy {result['accuracy']:.4f} (cloze {result['accuracy_cloze']:.4f}), "
          f"NLL of the correct answer {result['nll_correct']:.3f} nats/token ({result['seconds']} s)")


def register(sub) -> None:
    c = sub.add_parser("evaluate", help="one model x benchmark x inference setting (or several settings)")
    add_expect(c)
    c.add_argument("--settings", required=True)
    c.add_argument("--setting", required=True, nargs="+", help="one or more inference settings")
    c.add_argument("--data", required=True)
    c.add_argument("--out", required=True, nargs="+", help="one output file per --setting, in order")
    add_model_args(c)
    c.set_defaults(func=cmd_evaluate)

    c = sub.add_parser("evaluate-loglik", help="one model x multiple-choice benchmark: accuracy (the paper's "
                                               "generative protocol, or cloze) and the NLL of the correct answer")
    add_expect(c)
    c.add_argument("--settings", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--out", required=True)
    add_model_args(c)
    c.set_defaults(func=cmd_evaluate_loglik)
