"""Rollout and evaluation throughput of the CoT engine, as ratios measured in one process.

1. Rollouts: tokens/s of the fast engine (engine.cot.CotEngine) in each of the six inference
   settings, of the previous engine (reference_engine.ReferenceCotEngine), and of Hugging Face
   ``generate(do_sample=True)`` with hard tokens, on random-weight Llamas (no download): the toy
   architecture of config.yaml and a ~20M-parameter Llama (hidden 512, 8 layers, vocabulary 32k).
   Random weights never write the stop text, so every row decodes the whole CoT budget, the
   prefill and the answer: all three do the same number of decode steps. Median of --repeats runs,
   interleaved.
2. Evaluation: useful tokens/s (steps of rows still running) when finished rows' slots take the
   next (problem, sample) jobs (in groups, as the engine does, and one at a time) vs waves of
   whole batches vs the previous engine's waves, on the trained toy base (--toy-base, built by
   `make demo`), whose rows stop at different steps.
3. One RL step on the toy base at the toy grid's settings: seconds per phase with each engine.
4. A shared prefix (--shared-prefix): prompts whose preamble is many tokens, as a real tokenizer
   splits the paper's (the toy tokenizer makes it one token), on the toy architecture: the
   engine with the preamble prefilled once and read once per step vs the same engine without
   (shared_prefix=None) vs HF ``generate``, in each setting.
5. On a GPU (--preset llama-3.2-3b): ms per decode step beside the memory-bandwidth bound
   (weights + KV cache read once per step, at the measured device copy bandwidth), and a profiler
   table of the step.

    python benchmarks/rollout_speed.py --out benchmarks/results/rollout_speed_cpu.json
    python benchmarks/rollout_speed.py --preset llama-3.2-3b --dtype bfloat16 --cot 512 --answer 32   # GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from softtokens.data.prompt import format_prompt
from softtokens.data.toy import toy_splits
from softtokens.engine.cot import CotEngine
from softtokens.engine.reference import ReferenceCotEngine
from softtokens.engine.rollout import DONE
from softtokens.engine.settings import INFERENCE_SETTINGS
from softtokens.gpucheck.measure import copy_bandwidth, timed
from softtokens.model.loading import DTYPES
from softtokens.model.toy import _segments, build_toy_tokenizer, train_toy_tokenizer

ARCHITECTURES = {
    "toy": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, vocab=384),
    "llama-20m": dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8, vocab=32000),
    # meta-llama/Llama-3.2-3B (config.json), random weights
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, rope_theta=500000.0, vocab=128256),
}


def tokenizer_with_vocab(rows, vocab: int):
    """The toy BPE tokenizer, padded with extra tokens up to ``vocab`` (a 32k-row E and head that
    the engine really reads: it masks rows past the tokenizer)."""
    tok = build_toy_tokenizer(rows, min(vocab, 384))
    if len(tok) < vocab:
        tok.add_tokens([f"<x{i}>" for i in range(vocab - len(tok))])
    return tok


def random_llama(arch: dict, tok, dtype, dev):
    cfg = {k: v for k, v in arch.items() if k != "vocab"}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=None,
                                         tie_word_embeddings=True, **cfg))
    model.generation_config.eos_token_id = None
    return model.to(DTYPES[dtype]).to(dev).eval()


def decoders(model, tok, engine, prompts, seeds, a):
    """(HF generate of the whole budget with hard tokens, an engine's rollout -> tokens decoded,
    decode steps per row): every row decodes cot + prefill + answer steps (random weights never
    write the stop text)."""
    ids, mask = engine.encode_prompts(prompts)
    steps = a.cot + engine.max_prefill + a.answer

    def hf():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       max_new_tokens=steps, min_new_tokens=steps, pad_token_id=tok.pad_token_id)

    def ours(eng, setting):
        out = eng.generate(prompts, INFERENCE_SETTINGS[setting], 0.01, seeds, a.cot, a.answer)
        return int((out.step_phase != DONE).sum())

    return hf, ours, steps


def rollout_throughput(name: str, a, dev) -> dict:
    rows = toy_splits(400, 1, a.batch, seed=0)
    arch = ARCHITECTURES[name]
    tok = tokenizer_with_vocab(rows["train"], arch["vocab"])
    model = random_llama(arch, tok, a.dtype, dev)
    prompts = [format_prompt(r["question"]) for r in rows["test"]][: a.batch]
    seeds = list(range(a.batch))
    fast, ref = CotEngine(model, tok), ReferenceCotEngine(model, tok)
    hf, ours, steps = decoders(model, tok, fast, prompts, seeds, a)
    hf_tokens = a.batch * steps

    # warm-up (allocator, thread pools, one-time tables)
    hf()
    ours(fast, "hard_greedy")
    times: dict[str, list[float]] = {"hf_generate": []}
    tokens: dict[str, int] = {}
    for _ in range(a.repeats):
        times["hf_generate"].append(timed(hf, dev))
        for setting in INFERENCE_SETTINGS:
            for label, engine in (("fast", fast), ("previous", ref)):
                if label == "previous" and a.skip_previous:
                    continue
                key = f"{label}/{setting}"
                box = {}
                times.setdefault(key, []).append(timed(lambda: box.update(n=ours(engine, setting)), dev))
                tokens[key] = box["n"]
    hf_tps = hf_tokens / statistics.median(times["hf_generate"])
    result = {"model": name, "params_total_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
              "params_non_embedding_M": round(sum(p.numel() for n_, p in model.named_parameters()
                                                  if "embed" not in n_) / 1e6, 1),
              "vocab": len(tok), "batch": a.batch, "cot_tokens": a.cot, "answer_tokens": a.answer,
              "decode_steps": steps, "dtype": a.dtype, "repeats": a.repeats,
              "hf_generate_tokens_per_s": round(hf_tps, 1), "settings": {}}
    for setting in INFERENCE_SETTINGS:
        row = {}
        for label in ("fast", "previous"):
            key = f"{label}/{setting}"
            if key in times:
                tps = tokens[key] / statistics.median(times[key])
                row[f"{label}_tokens_per_s"] = round(tps, 1)
        row["fast_vs_hf_generate"] = round(row["fast_tokens_per_s"] / hf_tps, 2)
        if "previous_tokens_per_s" in row:
            row["fast_vs_previous"] = round(row["fast_tokens_per_s"] / row["previous_tokens_per_s"], 2)
        result["settings"][setting] = row
    return result


def shared_prefix_throughput(a, dev) -> dict:
    """Rollout tokens/s with the prompts' preamble shared (prefilled once, one read per step) and
    not, on prompts shaped like the paper's: the toy BPE without its one-token preamble splits the
    preamble into ~90 tokens and a question into ~50 (Llama-3's tokenizer: roughly 75 and 30-150)."""
    rows = toy_splits(400, 1, a.batch, seed=0)
    arch = ARCHITECTURES["toy"]
    tok = train_toy_tokenizer(["".join(_segments(r)) for r in rows["train"][:2000]], arch["vocab"])
    model = random_llama(arch, tok, a.dtype, dev)
    prompts = [format_prompt(r["question"]) for r in rows["test"]][: a.batch]
    seeds = list(range(a.batch))
    engines = {"shared": CotEngine(model, tok), "unshared": CotEngine(model, tok, shared_prefix=None)}
    lengths = [len(x) for x in tok(prompts)["input_ids"]]
    shared = len(engines["shared"].shared_tokens(tok(prompts)["input_ids"]))
    hf, ours, steps = decoders(model, tok, engines["shared"], prompts, seeds, a)

    hf()
    ours(engines["shared"], "hard_greedy")
    times: dict[str, list[float]] = {"hf_generate": []}
    tokens: dict[str, int] = {}
    for _ in range(a.repeats):
        times["hf_generate"].append(timed(hf, dev))
        for setting in INFERENCE_SETTINGS:
            for label, engine in engines.items():
                box = {}
                times.setdefault(f"{label}/{setting}", []).append(
                    timed(lambda: box.update(n=ours(engine, setting)), dev))
                tokens[f"{label}/{setting}"] = box["n"]
    hf_tps = a.batch * steps / statistics.median(times["hf_generate"])
    out = {"model": "toy", "batch": a.batch, "cot_tokens": a.cot, "answer_tokens": a.answer, "dtype": a.dtype,
           "repeats": a.repeats, "prompt_tokens": [min(lengths), max(lengths)], "shared_tokens": shared,
           "hf_generate_tokens_per_s": round(hf_tps, 1), "settings": {}}
    for setting in INFERENCE_SETTINGS:
        tps = {label: tokens[f"{label}/{setting}"] / statistics.median(times[f"{label}/{setting}"])
               for label in engines}
        out["settings"][setting] = {"shared_tokens_per_s": round(tps["shared"], 1),
                                    "unshared_tokens_per_s": round(tps["unshared"], 1),
                                    "shared_vs_unshared": round(tps["shared"] / tps["unshared"], 2),
                                    "shared_vs_hf_generate": round(tps["shared"] / hf_tps, 2)}
    return out


def evaluation_throughput(toy_base: Path, a, dev) -> dict:
    """Useful tokens/s of streamed evaluation: slot refill vs waves, and the previous engine's waves."""
    from softtokens.data.rows import read_jsonl
    from softtokens.engine.sampling import row_seed
    from softtokens.model.loading import load_model, load_tokenizer

    tok = load_tokenizer(str(toy_base))
    model = load_model(str(toy_base), "float32", dev).eval()
    test = toy_base.parent.parent / "data" / "toyarith" / "test.jsonl"
    rows = read_jsonl(test) if test.exists() else toy_splits(10, 1, 128, seed=5)["test"]
    n = 4
    jobs = [(pi, si) for pi in range(len(rows)) for si in range(n)]
    prompts = [format_prompt(rows[pi]["question"]) for pi, _ in jobs]
    seeds = [row_seed(0, pi, si) for pi, si in jobs]
    fast, ref = CotEngine(model, tok), ReferenceCotEngine(model, tok)
    out = {"model": str(toy_base), "jobs": len(jobs), "batch": a.batch, "cot_tokens": 48, "answer_tokens": 8}
    for setting in ("hard_sample", "soft_sample", "fuzzy_greedy"):
        s = INFERENCE_SETTINGS[setting]
        sigma = 0.01 if s.noise_factor else 0.0
        res = {}
        # refill as the engine does it (freed slots admitted in groups of an eighth of the batch),
        # refill of each freed slot at once, and waves of whole batches
        for label, refill, admit_min in (("refill", True, None), ("refill_each", True, 1), ("waves", False, None)):
            box = {}

            def run():
                box["rows"] = list(fast.stream(prompts, seeds, s, sigma, 48, 8, batch_size=a.batch, refill=refill,
                                               admit_min=admit_min))
            t = statistics.median(timed(run, dev) for _ in range(a.repeats))
            useful = sum(r.step_ids.shape[0] for r in box["rows"])
            res[label] = {"seconds": round(t, 3), "useful_tokens_per_s": round(useful / t, 1), **fast.stream_stats}

        def previous():
            total = 0
            for i in range(0, len(prompts), a.batch):
                o = ref.generate(prompts[i:i + a.batch], s, sigma, seeds[i:i + a.batch], 48, 8)
                total += int((o.step_phase != DONE).sum())
            return total
        box = {}
        t = statistics.median(timed(lambda: box.update(n=previous()), dev) for _ in range(a.repeats))
        res["previous_engine_waves"] = {"seconds": round(t, 3), "useful_tokens_per_s": round(box["n"] / t, 1)}
        res["refill_vs_waves"] = round(res["refill"]["useful_tokens_per_s"] / res["waves"]["useful_tokens_per_s"], 2)
        res["refill_vs_refill_each"] = round(res["refill"]["useful_tokens_per_s"]
                                             / res["refill_each"]["useful_tokens_per_s"], 2)
        res["refill_vs_previous"] = round(res["refill"]["useful_tokens_per_s"]
                                          / res["previous_engine_waves"]["useful_tokens_per_s"], 2)
        out[setting] = res
    return out


def rl_step(toy_base: Path, a) -> dict:
    """Seconds per phase of one RL step at the toy grid's settings, fast vs previous engine."""
    import yaml

    from softtokens.train.config import TrainConfig
    from softtokens.train.loop import Trainer

    cfg_yaml = yaml.safe_load(Path("config.yaml").read_text())
    settings = {**cfg_yaml["rl"], **cfg_yaml["grids"]["toy"]["rl"], "mode": "soft", "lr": 7e-5, "seed": 0}
    rows = toy_splits(400, 16, 16, seed=3)
    out = {"settings": {k: settings[k] for k in ("prompts_per_step", "samples_per_prompt", "cot_max_tokens",
                                                 "answer_max_tokens", "micro_batch_size", "compute_dtype")}}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(TrainConfig.from_settings(settings), str(toy_base), rows["train"], rows["validation"],
                          Path(tmp) / "_resume")
        engines = {"fast": trainer.engine, "previous": ReferenceCotEngine(trainer.rollout_model, trainer.tokenizer)}
        trainer.train_step(0)  # warm-up
        for label, engine in engines.items():
            trainer.engine = engine
            runs = [trainer.train_step(i + 1) for i in range(a.repeats)]
            out[label] = {k: statistics.median(r[k] for r in runs)
                          for k in ("seconds_rollout", "seconds_reward", "seconds_update")}
            out[label]["seconds_step"] = round(sum(out[label].values()), 3)
        out["fast_vs_previous_step"] = round(out["previous"]["seconds_step"] / out["fast"]["seconds_step"], 2)
        trainer.close()
    return out


def gpu_bound(a, dev) -> dict:
    """ms per decode step of the fast engine in each setting of --gpu-setting ("all": the six) vs
    the bandwidth bound of reading the weights, the KV cache and (soft/fuzzy) the float32 E once per
    step; plus a profiler table of the first setting's step."""
    arch = ARCHITECTURES[a.preset]
    rows = toy_splits(400, 1, a.batch, seed=0)
    tok = tokenizer_with_vocab(rows["train"], arch["vocab"])
    model = random_llama(arch, tok, a.dtype, dev)
    engine = CotEngine(model, tok)
    prompts = [format_prompt(r["question"]) for r in rows["test"]][: a.batch]
    bandwidth = copy_bandwidth(dev)  # read + write
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    p_len = engine.encode_prompts(prompts)[0].shape[1]
    names = list(INFERENCE_SETTINGS) if a.gpu_setting == "all" else [a.gpu_setting]
    out = {"device": torch.cuda.get_device_name(0), "preset": a.preset, "batch": a.batch,
           "copy_bandwidth_GBps": round(bandwidth / 1e9, 1), "weights_GB": round(weight_bytes / 1e9, 2),
           "settings": {}}
    for name in names:
        setting = INFERENCE_SETTINGS[name]
        engine.generate(prompts, setting, 0.01, list(range(a.batch)), 8, 2)  # warm-up, capture
        steps = a.cot + engine.max_prefill + a.answer
        t = statistics.median(timed(lambda: engine.generate(prompts, setting, 0.01, list(range(a.batch)), a.cot,
                                                            a.answer), dev) for _ in range(a.repeats))
        mean_len = p_len + steps / 2
        kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * a.batch * mean_len * 2
        mix_bytes = len(tok) * cfg.hidden_size * 4 if setting.mode != "hard" else 0  # the float32 E of p @ E
        bound = (weight_bytes + kv_bytes + mix_bytes) / bandwidth
        out["settings"][name] = {
            "decode_steps": steps, "mean_kv_GB": round(kv_bytes / 1e9, 2), "bound_ms_per_step": round(1e3 * bound, 3),
            "ms_per_step": round(1e3 * t / steps, 3), "ratio_to_bound": round(t / steps / bound, 2),
            "seconds_per_rollout_batch": round(t, 2)}
        print(name, json.dumps(out["settings"][name]), flush=True)
    out["peak_memory_GiB"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.generate(prompts, INFERENCE_SETTINGS[names[0]], 0.01, list(range(a.batch)), 32, 2)
    out["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["toy", "llama-20m"], choices=["toy", "llama-20m"],
                    help="rollout throughput on these (none: only the evaluation and RL-step sections)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--cot", type=int, default=128)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-previous", action="store_true", help="leave out the previous engine (slow)")
    ap.add_argument("--shared-prefix", action="store_true",
                    help="only the shared-prefix section (paper-shaped prompts on the toy architecture)")
    ap.add_argument("--toy-base", type=Path, default=Path("results/toy/models/toy"))
    ap.add_argument("--preset", choices=["llama-3.2-3b"], help="GPU: the bandwidth-bound comparison")
    ap.add_argument("--gpu-setting", default="all", help="one of the six settings, or all")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/rollout_speed.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else f"cpu ({a.threads} threads)",
              "torch": torch.__version__}
    if a.shared_prefix:
        report["shared_prefix"] = shared_prefix_throughput(a, dev)
        print(json.dumps(report["shared_prefix"], indent=1))
    elif a.preset:
        report["gpu_bound"] = gpu_bound(a, dev)
        print(json.dumps({k: v for k, v in report["gpu_bound"].items() if k != "profile"}, indent=1))
        print(report["gpu_bound"]["profile"])
    else:
        report["rollouts"] = [rollout_throughput(m, a, dev) for m in a.models]
        for r in report["rollouts"]:
            print(json.dumps(r, indent=1))
        if a.toy_base.exists():
            report["evaluation"] = evaluation_throughput(a.toy_base, a, dev)
            print(json.dumps(report["evaluation"], indent=1))
            report["rl_step"] = rl_step(a.toy_base, a)
            print(json.dumps(report["rl_step"], indent=1))
        else:
            print(f"no toy base at {a.toy_base} (run `make demo`): evaluation and RL-step sections skipped")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
