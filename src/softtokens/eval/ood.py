"""Out-of-domain multiple choice (HellaSwag, ARC-Challenge, MMLU): the paper's protocol, and
lm-evaluation-harness's cloze scoring as a second, named one.

The paper reports "both the success rate (with hard greedy sampling) and the negative
log-likelihood per token (NLL) of the correct answer" (Section 4, out-of-domain robustness). So:

- ``generative`` (the default, the paper's): each question goes through the paper's own task
  prompt with its options lettered, and the model answers as it answers a math problem: a hard
  greedy CoT, the stop rule and the ``\\boxed{`` prefill, a greedy answer. The answer is read
  from the box: an option letter ("B", "(B)", "B. water") or an option's text ("water").
  Success rate = share of questions answered with the gold option.
- ``cloze``: lm-eval's log-likelihood scoring, each option the continuation of the question
  (softtokens.loglik); accuracy = the highest summed log-likelihood.

The NLL column is the same in both: per token of the gold option's text, as the continuation of
the question (loglik.score_rows), averaged over questions. The paper is silent on shots, prompt
and tokens; these choices, and the evidence that they reproduce its base rows (0-shot generative
letter answers on ARC-Challenge), are in docs/protocol.md.
"""

from __future__ import annotations

import hashlib
import re
import time

from tqdm import tqdm

from softtokens.data.prompt import format_prompt

# what each of config.names.OOD_PROTOCOLS measures (recorded in every result)
PROTOCOLS = {
    "generative": "success rate of the hard greedy CoT's boxed answer (an option letter or text) under the paper's "
                  "task prompt with lettered options, zero-shot",
    "cloze": "the option with the highest summed log-likelihood as the continuation of the question (lm-eval)",
}
LETTERS = "ABCDEFGHIJ"
NLL_DEFINITION = ("mean over questions of -(summed log-likelihood of the gold option's text as the continuation of the "
                  "question) / (its token count), nats per token")
INSTRUCTION = "Answer with the letter of the correct option."


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"out-of-domain protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")
    return protocol


def mc_question(row: dict) -> str:
    """The question a model reads under the generative protocol: the row's question (a source's
    normaliser words it; HellaSwag: the passage to complete), its options lettered A, B, ..., and
    the instruction. Rows written before rows had a ``question`` fall back to their cloze context."""
    stem = row.get("question") or re.sub(r"^Question:\s*|\s*Answer:\s*$", "", row["context"])
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(row["choices"]))
    return f"{stem}\n{options}\n{INSTRUCTION}"


def prompt_of(row: dict) -> str:
    return format_prompt(mc_question(row))


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _normalise(text: str) -> str:
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", text)
    text = text.replace("$", "").replace("\\", "")
    return re.sub(r"\s+", " ", text).strip().strip(".").strip().lower()


def read_choice(completion: str, choices: list[str]) -> int | None:
    """The option a completion answers with, or None: the last ``\\boxed{}`` (the prefill opens one;
    an unclosed box is read to the end of the line), then an option letter ("B", "(B)", "B.",
    "B) water", "option B") or an option's text, compared without case, spaces or LaTeX dressing."""
    from softtokens.reward.grader import last_boxed

    answer = last_boxed(completion)
    if answer is None:
        opened = completion.rfind("\\boxed{")
        if opened < 0:
            return None
        answer = completion[opened + len("\\boxed{"):].split("\n")[0]
    text = _normalise(answer)
    letters = LETTERS[: len(choices)].lower()
    m = re.fullmatch(r"(?:option\s*)?\(?([a-j])\)?(?:\s*[.:)]\s*(.*))?", text)
    if m and m.group(1) in letters:
        return letters.index(m.group(1))
    texts = [_normalise(c) for c in choices]
    return texts.index(text) if text in texts else None


def generate_answers(engine, rows: list[dict], cot_max_tokens: int, answer_max_tokens: int,
                     batch_size: int) -> list[dict]:
    """Every row's prompt through the hard greedy setting (noise-free, seed-free): per row its
    prompt's hash, completion, CoT length, prediction and whether it is right."""
    import torch  # here, not at the top: the tables job reads this module's definitions without torch

    from softtokens.engine.settings import INFERENCE_SETTINGS

    prompts = [prompt_of(r) for r in rows]
    out: list[dict | None] = [None] * len(rows)
    finished = engine.stream(prompts, [0] * len(rows), INFERENCE_SETTINGS["hard_greedy"], 0.0, cot_max_tokens,
                             answer_max_tokens, answer_temperature=0.0, batch_size=batch_size)
    with torch.no_grad():  # the stream decodes as it is read
        for row in tqdm(finished, total=len(rows), desc="ood generative", mininterval=5):
            r = rows[row.job]
            pred = read_choice(row.completion, r["choices"])
            out[row.job] = {"prompt_sha256": prompt_hash(prompts[row.job]), "completion": row.completion,
                            "cot_len": row.cot_len, "pred": pred, "correct": pred == r["label"]}
    return out


def evaluate_ood(model_path: str, rows: list[dict], protocol: str, cot_max_tokens: int, answer_max_tokens: int,
                 batch_size: int, loglik_batch_size: int, dtype: str, threads: int = 1, loaded=None) -> dict:
    """One model on one multiple-choice benchmark: the protocol's accuracy, the NLL of the gold
    option (both protocols), and the cloze accuracies for reference; per question, what was asked
    (the prompt's hash; the first three prompts whole) and answered. ``loaded``: (model, tokenizer) already
    loaded from ``model_path`` by the job (one evaluated model's every file in one process: commands.evaluate)."""
    import torch

    from softtokens.model.cpu_bf16 import bf16_products
    from softtokens.model.loading import load_model, load_tokenizer, pick_device

    check_protocol(protocol)
    torch.set_num_threads(threads)
    if loaded is not None:
        model, tokenizer = loaded
    else:
        tokenizer = load_tokenizer(model_path)
        model = load_model(model_path, dtype, pick_device(), defer_check=True).eval()   # hashed beside the scoring
    with bf16_products(model.dtype, model.device):   # model.cpu_bf16: bf16 on a CPU without bf16 units
        return _score(model, tokenizer, rows, protocol, cot_max_tokens, answer_max_tokens, batch_size,
                      loglik_batch_size)


def _score(model, tokenizer, rows: list[dict], protocol: str, cot_max_tokens: int, answer_max_tokens: int,
           batch_size: int, loglik_batch_size: int) -> dict:
    from softtokens.engine.cot import CotEngine
    from softtokens.eval.loglik import score_rows, summarise
    from softtokens.model.loading import confirm_checkpoint, hub_revision

    start = time.time()
    scored = score_rows(model, tokenizer, rows, loglik_batch_size)
    cloze = summarise(scored)
    problems = [{**s, "pred_cloze": s["pred"]} for s in scored]
    result = {"protocol": protocol, "protocol_definition": PROTOCOLS[protocol], "n_problems": len(rows),
              "nll_correct": cloze["nll_correct"], "accuracy_cloze": cloze["accuracy"],
              "accuracy_cloze_norm": cloze["accuracy_norm"]}
    if protocol == "generative":
        engine = CotEngine(model, tokenizer)
        answers = generate_answers(engine, rows, cot_max_tokens, answer_max_tokens, batch_size)
        for p, a in zip(problems, answers):
            p.update(a)
        result.update(accuracy=sum(a["correct"] for a in answers) / len(rows),
                      unanswered=sum(a["pred"] is None for a in answers) / len(rows),
                      cot_max_tokens=cot_max_tokens, answer_max_tokens=answer_max_tokens,
                      example_prompts=[prompt_of(r) for r in rows[:3]])
    else:
        for p in problems:
            p["correct"] = p["pred"] == p["label"]
        result["accuracy"] = cloze["accuracy"]
    confirm_checkpoint(model)   # nothing computed from a checkpoint whose bytes are not its training's is kept
    result.update(model_revision=hub_revision(model), seconds=round(time.time() - start, 2),
                  definition={"accuracy": PROTOCOLS[protocol], "nll_correct": NLL_DEFINITION},
                  problems=problems)
    # the old key, read by files and tables written before the generative protocol
    result["accuracy_norm"] = cloze["accuracy_norm"]
    return result
