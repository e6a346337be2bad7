"""How far the update pass's teacher-forced replay is from the KV-cached rollout it scores, in
float32 and in bf16 compute on CPU, per CoT mode; and how often fuzzy tokens (tau = 1e-4) would
mix two tokens if logits were rounded to bf16 (the evidence for float32 logits, docs/engine.md).

    python benchmarks/replay_consistency.py results/toy/models/toy results/toy/data/toyarith/train.jsonl

Prints one JSON object: per compute dtype and mode, the replay's h0 gap (mean over soft/fuzzy
CoT steps whose argmax did not flip of ||h0_rollout - h0_replay||^2 / (d sigma^2); 0 = replay equals
rollout), the same over flipped steps, and the share of CoT steps whose argmax differs; per dtype, the share of fuzzy CoT steps whose top-2 logits tie
once rounded to bf16 (a 50/50 mixture) and whose fp32 top-2 gap is below 10 tau (not one-hot).
"""

from __future__ import annotations

import argparse
import json

import torch

from softtokens.data.prompt import format_prompt
from softtokens.data.rows import read_jsonl
from softtokens.engine.cot import CotEngine
from softtokens.engine.rollout import COT
from softtokens.engine.sampling import row_seed
from softtokens.engine.settings import CotSetting
from softtokens.model.loading import load_model, load_tokenizer
from softtokens.model.scale import embedding_scale
from softtokens.train.rloo import rollout_log_probs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cot", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = load_tokenizer(a.model)
    rows = read_jsonl(a.data)[: a.rows]
    prompts = [format_prompt(r["question"]) for r in rows]
    out = {}
    for dtype in ("float32", "bfloat16"):
        model = load_model(a.model, dtype).eval()
        engine = CotEngine(model, tok)
        sigma = embedding_scale(load_model(a.model), len(tok)).sigma(0.33)
        per_mode = {}
        for mode, setting in (("hard", CotSetting("hard", 1.0, 0.0)), ("soft", CotSetting("soft", 0.5, 0.33)),
                              ("fuzzy", CotSetting("fuzzy", 1e-4, 0.33))):
            s = sigma if mode != "hard" else 0.0
            ro = engine.generate(prompts, setting, s, [row_seed(0, i) for i in range(len(prompts))], a.cot, 8, 1.0)
            with torch.no_grad():
                rep = rollout_log_probs(model, ro, s, 1.0, engine.vocab_rows)
            flipped = rep.argmax_flips
            per_mode[mode] = {"replay_h0_gap": rep.h0_gap_sum / max(1, rep.h0_gap_steps) if mode != "hard" else None,
                              "replay_h0_gap_flipped": rep.h0_gap_flipped_sum / flipped if mode != "hard" and flipped
                              else None, "argmax_flips": flipped / rep.cot_steps,
                              "argmax_mismatch": rep.argmax_mismatches / rep.cot_steps, "cot_steps": rep.cot_steps}
            if mode == "fuzzy":  # the logits the rollout saw, recomputed teacher-forced in float32
                from softtokens.model.head import decoder_hidden, output_logits
                with torch.no_grad():
                    emb = model.get_input_embeddings()
                    x = torch.cat([emb(ro.prompt_ids), ro.noisy_inputs.to(emb.weight.dtype)], 1)
                    mask = torch.cat([ro.prompt_mask, torch.ones_like(ro.step_ids)], 1)
                    pos = (mask.cumsum(-1) - 1).clamp(min=0)
                    h = decoder_hidden(model, inputs_embeds=x, attention_mask=mask, position_ids=pos)
                    logits = output_logits(model, h[:, -(ro.step_ids.shape[1] + 1):-1], engine.vocab_rows)
                cot = ro.step_phase == COT
                top2 = logits.topk(2, dim=-1).values
                rounded = logits.to(torch.bfloat16).float().topk(2, dim=-1).values
                per_mode[mode]["share_bf16_logit_ties"] = ((rounded[..., 0] == rounded[..., 1]) & cot).sum().item() / cot.sum().item()
                per_mode[mode]["share_fp32_gap_below_10tau"] = (((top2[..., 0] - top2[..., 1]) < 1e-3) & cot).sum().item() / cot.sum().item()
        out[dtype] = per_mode
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
