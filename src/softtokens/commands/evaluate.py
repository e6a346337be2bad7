"""evaluate (a model on a math benchmark under one or more inference settings) and
evaluate-loglik (a model on a multiple-choice benchmark, out of domain)."""

from __future__ import annotations

from softtokens.commands.common import (
    add_expect,
    add_model_args,
    benchmark_name,
    check_expected,
    model_name,
    model_to_evaluate,
    parse_settings,
    record_base_model,
    require,
    selection_record,
    trained_identity,
)

EVAL_KEYS = ("n_samples", "cot_max_tokens", "answer_max_tokens", "batch_size", "seed", "dtype", "grading_timeout_s")
LOGLIK_KEYS = ("protocol", "cot_max_tokens", "answer_max_tokens", "batch_size", "loglik_batch_size", "dtype")


def _math_files(a, ev, model_path: str, inputs: dict, s: dict, expected: dict, benchmark: str, data: str,
                settings: list[str], outs: list[str]) -> None:
    """One benchmark's files, one per inference setting, from an evaluator already loaded: each file what its own
    job would have written (its record, its identity)."""
    from softtokens.data.rows import read_jsonl
    from softtokens.engine.settings import placement_of
    from softtokens.store.eval_identity import IDENTITY, SETTING_FIELDS, eval_identity
    from softtokens.store.files import write_json
    from softtokens.config.names import COT_KEYS
    from softtokens.store.provenance import Provenance, hashed_inputs

    cot = {k: s[k] for k in COT_KEYS}  # the grid's (or the run's) CoT settings
    rows = read_jsonl(data)
    hashed = hashed_inputs({**inputs, "data": data})   # once for every setting
    ident = dict(model=model_name(a), trained=trained_identity(a), benchmark=benchmark,
                 data_sha256=hashed["data"]["sha256"], ids=[r["id"] for r in rows])
    leaves = None
    for setting, out in zip(settings, outs):
        prov = Provenance("evaluate", {**s, "setting": setting}, hashed=hashed, seeds={"seed": s["seed"]}, params=s)
        prov.expected = expected
        result = ev.run(rows, setting, s["n_samples"], s["cot_max_tokens"], s["answer_max_tokens"],
                        s["batch_size"], s["seed"], cot=cot, placement=placement_of(s))
        if leaves is None:
            record_base_model(prov, model_path, result["model_revision"])
            leaves = prov.leaves()
        prov.add_leaves(leaves)
        identity = eval_identity(**ident, setting=setting, setting_params={k: result[k] for k in SETTING_FIELDS})
        write_json(out, prov.embedded({**result, **selection_record(a), IDENTITY: identity}, out))
        print(f"{benchmark} {setting}: pass@1 {result['pass@1']:.3f}, pass@{result['n_samples']} "
              f"{result['pass@k'][str(result['n_samples'])]:.3f}, grading time-outs {result['grading_timeouts']} "
              f"({result['seconds']} s); sigma {result['sigma']:.4g}, set by {result['sigma_source']}", flush=True)


def _loglik_file(a, model_path: str, inputs: dict, s: dict, expected: dict, benchmark: str, data: str, out: str,
                 threads: int, loaded=None) -> None:
    """One out-of-domain file (eval.ood), its record and identity; ``loaded``: the model and tokenizer already in
    the process (one evaluated model's every file in one job)."""
    from softtokens.data.rows import read_jsonl
    from softtokens.eval.ood import evaluate_ood
    from softtokens.store.eval_identity import IDENTITY, LOGLIK, eval_identity
    from softtokens.store.files import sha256_path, write_json
    from softtokens.store.provenance import Provenance

    prov = Provenance("evaluate_loglik", s, inputs={**inputs, "data": data}, params=s)
    prov.expected = expected
    rows = read_jsonl(data, required=("id", "context", "choices", "label"))
    result = evaluate_ood(model_path, rows, s["protocol"], s["cot_max_tokens"], s["answer_max_tokens"],
                          s["batch_size"], s["loglik_batch_size"], s["dtype"], threads, loaded=loaded)
    record_base_model(prov, model_path, result["model_revision"])
    data_sha256 = (prov.inputs.get("data") or prov.external.get("data") or {}).get("sha256") or sha256_path(data)
    identity = eval_identity(model_name(a), trained_identity(a), benchmark, LOGLIK, {"protocol": s["protocol"]},
                             data_sha256, [r["id"] for r in rows])
    write_json(out, prov.embedded({**result, **selection_record(a), IDENTITY: identity}, out))
    print(f"{benchmark} {s['protocol']} accuracy {result['accuracy']:.4f} (cloze {result['accuracy_cloze']:.4f}), "
          f"NLL of the correct answer {result['nll_correct']:.3f} nats/token ({result['seconds']} s)", flush=True)


def cmd_evaluate(a) -> None:
    from softtokens.eval.math_eval import MathEvaluator
    from softtokens.config.names import COT_KEYS, PLACEMENT_KEYS

    s = parse_settings(a.settings)
    require(s, *EVAL_KEYS, *COT_KEYS, *PLACEMENT_KEYS, command="evaluate")
    if len(a.setting) != len(a.out):
        raise SystemExit(f"evaluate: {len(a.setting)} --setting but {len(a.out)} --out; give one output per setting")
    model_path, inputs = model_to_evaluate(a)
    expected = check_expected(a.expect)
    with MathEvaluator(model_path, s["dtype"], a.threads, s["grading_timeout_s"]) as ev:
        _math_files(a, ev, model_path, inputs, s, expected, benchmark_name(a), a.data, a.setting, a.out)


def cmd_evaluate_loglik(a) -> None:
    s = parse_settings(a.settings)
    require(s, *LOGLIK_KEYS, command="evaluate-loglik")
    model_path, inputs = model_to_evaluate(a)
    expected = check_expected(a.expect)
    _loglik_file(a, model_path, inputs, s, expected, benchmark_name(a), a.data, a.out, a.threads)


def cmd_evaluate_model(a) -> None:
    """One evaluated model's every file (evaluation.one_job_per_setting: false): each benchmark under each
    inference setting, then each out-of-domain set, with the model loaded once and the start-up paid once."""
    from softtokens.eval.math_eval import MathEvaluator
    from softtokens.config.names import COT_KEYS, PLACEMENT_KEYS

    s, loglik, plan = parse_settings(a.settings), parse_settings(a.loglik_settings), parse_settings(a.plan)
    require(s, *EVAL_KEYS, *COT_KEYS, *PLACEMENT_KEYS, command="evaluate-model")
    require(loglik, *LOGLIK_KEYS, command="evaluate-model (--loglik-settings)")
    model_path, inputs = model_to_evaluate(a)
    expected = check_expected(a.expect)
    with MathEvaluator(model_path, s["dtype"], a.threads, s["grading_timeout_s"]) as ev:
        for part in plan.get("math", []):
            _math_files(a, ev, model_path, inputs, s, expected, part["benchmark"], part["data"], part["settings"],
                        part["out"])
        for part in plan.get("ood", []):
            _loglik_file(a, model_path, inputs, loglik, expected, part["benchmark"], part["data"], part["out"],
                         a.threads, loaded=(ev.model, ev.tokenizer))


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

    c = sub.add_parser("evaluate-model", help="one model's every evaluation file: each benchmark under each inference "
                                              "setting and each out-of-domain set, in one process (a CPU grid)")
    add_expect(c)
    c.add_argument("--settings", required=True, help="the math evaluations' settings (JSON)")
    c.add_argument("--loglik-settings", required=True, help="the out-of-domain evaluations' settings (JSON)")
    c.add_argument("--plan", required=True, help='JSON: {"math": [{"benchmark", "data", "settings", "out"}], '
                                                 '"ood": [{"benchmark", "data", "out"}]} (grid.jobs.model_eval_plan)')
    add_model_args(c)
    c.set_defaults(func=cmd_evaluate_model)
