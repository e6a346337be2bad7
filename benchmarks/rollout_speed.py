"""Rollout throughput of our CoT engine relative to Hugging Face `generate`, same process.

Reports tokens/s of `model.generate(do_sample=True)` (the baseline) and ratios for our engine in
hard_sample, soft_sample and fuzzy_sample modes, on a randomly initialised Llama of the chosen
size (no download). Ratios, not absolute times, are what to compare across machines.

    python benchmarks/rollout_speed.py --hidden 128 --layers 4 --batch 64 --new-tokens 64
    python benchmarks/rollout_speed.py --preset llama-3.2-3b --dtype bfloat16   # on a GPU
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from softtokens.data import format_prompt, toy_splits
from softtokens.generation import INFERENCE_SETTINGS, CotEngine
from softtokens.modeling import DTYPES
from softtokens.toybase import build_toy_tokenizer

PRESETS = {  # architecture of meta-llama/Llama-3.2-3B (config.json), random weights
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, rope_theta=500000.0, tie_word_embeddings=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = toy_splits(200, 1, a.batch, seed=0)
    tok = build_toy_tokenizer(rows["train"], 384)
    arch = PRESETS[a.preset] if a.preset else dict(hidden_size=a.hidden, intermediate_size=3 * a.hidden,
                                                   num_hidden_layers=a.layers, num_attention_heads=4,
                                                   num_key_value_heads=4, tie_word_embeddings=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                         eos_token_id=None, **arch)).to(DTYPES[a.dtype]).to(dev).eval()
    model.generation_config.eos_token_id = None
    prompts = [format_prompt(r["question"]) for r in rows["test"]][: a.batch]
    engine = CotEngine(model, tok)
    ids, mask = engine.encode_prompts(prompts)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn):
        best = float("inf")
        for _ in range(a.repeats):
            sync(); t = time.perf_counter(); fn(); sync()
            best = min(best, time.perf_counter() - t)
        return best

    tokens = a.batch * a.new_tokens
    base = timed(lambda: model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=a.new_tokens,
                                        min_new_tokens=a.new_tokens, pad_token_id=tok.pad_token_id))
    print(f"device {dev} {torch.cuda.get_device_name(0) if dev.type == 'cuda' else ''} params "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M dtype {a.dtype} batch {a.batch}")
    print(f"HF generate(do_sample=True): {tokens / base:,.0f} tok/s (baseline = 1.00)")
    # The engine never stops early here (random weights never write the stop text): a.new_tokens CoT steps.
    for name in ("hard_sample", "soft_sample", "fuzzy_sample"):
        t = timed(lambda: engine.generate(prompts, INFERENCE_SETTINGS[name], 0.01, list(range(a.batch)),
                                          a.new_tokens, 1))
        print(f"engine {name:12s}: {tokens / t:,.0f} tok/s, ratio to baseline {base / t:.2f}")
    if dev.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
