"""The Gaussian term at the rollout's own noise (train.rloo; docs/findings.md, "The flip term"). In bf16 the
KV-cache decode and the teacher-forced replay round a near tie's logits differently now and then, so a
fuzzy step's argmax flips: the rollout fed a mixture of one token and the replay's h0 is of another. The
term's gradient must still be the score of the rollout's noise, eps / sigma through the replay's
Jacobian; the recorded-input form -||h~ - h0_replay||^2 / (2 sigma^2) adds (h0_rollout - h0_replay) /
sigma^2 through that Jacobian (up to p1 p2 / tau = 2,500), a term the paper's estimator does not have.
In float32 nothing flips and the two forms agree."""

import pytest
import torch
from conftest import make_tiny_model

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.noise import counter_normal
from softtokens.engine.rollout import COT
from softtokens.engine.sampling import row_seed
from softtokens.engine.settings import CotSetting
from softtokens.model.head import float32_weights, output_logits
from softtokens.train.rloo import rollout_log_probs, step_hidden

FUZZY = CotSetting("fuzzy", 1e-4, 0.33)
SIGMA = 0.05


def peaked_model(tokenizer, seed: int, dtype: torch.dtype):
    """A tiny random Llama whose next-token distributions are peaked (the final norm's weight x6, as a
    trained model's are): its fuzzy CoTs meet near ties at a realistic rate."""
    model = make_tiny_model(tokenizer, seed=seed, hidden=64, layers=2)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    return model.to(dtype)


def explicit_terms(model, rollout, vocab: int, keep=None):
    """(score, recorded-input form, per-step p1 p2 / tau, flipped steps), written out from the replay: the
    score sum eps . h0_replay / sigma has gradient eps / sigma dh0/dtheta (its value is not used); the
    recorded-input form is -||h~ - h0_replay||^2 / (2 sigma^2). ``keep``: the CoT steps to sum over."""
    h = step_hidden(model, rollout)
    W32, E32 = float32_weights(model, vocab, with_input=True)
    logits = output_logits(None, h, weight=W32)
    p = torch.softmax(logits / FUZZY.temperature, dim=-1)
    h0 = p @ E32
    n, s, d = h0.shape
    steps = torch.arange(s).expand(n, s)
    eps = counter_normal(rollout.row_keys.unsqueeze(1).expand(n, s), steps, d)
    cot = rollout.step_phase == COT
    keep = cot if keep is None else keep & cot
    score = torch.where(keep, (eps * h0).sum(-1) / SIGMA, 0.0).sum()
    recorded = torch.where(keep, -(rollout.noisy_inputs - h0).pow(2).sum(-1) / (2 * SIGMA ** 2), 0.0).sum()
    top2 = p.detach().topk(2, dim=-1).values
    flipped = cot & (logits.detach().argmax(-1) != rollout.argmax_ids)
    return score, recorded, top2[..., 0] * top2[..., 1] / FUZZY.temperature, flipped


def grads(model, value) -> torch.Tensor:
    model.zero_grad()
    value.backward()
    out = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    return out


def rollout_of(model, tokenizer, rows, seed: int):
    prompts = [format_prompt(r["question"]) for r in rows[:16]]
    return CotEngine(model, tokenizer).generate(prompts, FUZZY, SIGMA, [row_seed(seed, i) for i in range(16)], 64, 4,
                                                answer_temperature=1.0)


@pytest.mark.slow
def test_in_bf16_the_term_is_the_score_of_the_rollouts_noise_at_a_flipped_near_tie(toy_tokenizer, toy_rows):
    vocab = len(toy_tokenizer)
    found = None
    for seed in range(11, 31):  # a bf16 rollout with a flipped step at a real near tie (p1 p2 / tau >= 10)
        model = peaked_model(toy_tokenizer, seed, torch.bfloat16)
        rollout = rollout_of(model, toy_tokenizer, toy_rows["train"], seed)
        with torch.no_grad():
            _, _, jacobian, flipped = explicit_terms(model, rollout, vocab)
        if bool((flipped & (jacobian >= 10)).any()):
            found = model, rollout, flipped
            break
    assert found is not None, "no bf16 rollout with a flipped near tie among 20 seeds"
    model, rollout, flipped = found

    new = grads(model, rollout_log_probs(model, rollout, SIGMA, 1.0, vocab).cot.sum())
    score, recorded, _, _ = explicit_terms(model, rollout, vocab)
    score_g = grads(model, score)
    _, recorded, _, _ = explicit_terms(model, rollout, vocab)
    old = grads(model, recorded)
    # the update's term is the score of the rollout's noise, to bf16 accuracy ...
    assert (new - score_g).norm() <= 2e-2 * score_g.norm()
    # ... and the recorded-input form is not: its flip term outweighs the score itself
    assert (old - score_g).norm() > score_g.norm()
    # where nothing flipped the two forms agree: the difference is the flipped steps'
    agree_score, agree_old, _, _ = explicit_terms(model, rollout, vocab, keep=~flipped)
    a = grads(model, agree_score)
    _, agree_old, _, _ = explicit_terms(model, rollout, vocab, keep=~flipped)
    b = grads(model, agree_old)
    assert (a - b).norm() <= 0.25 * a.norm()


def test_in_float32_the_two_forms_agree(toy_tokenizer, toy_rows):
    vocab = len(toy_tokenizer)
    model = peaked_model(toy_tokenizer, 11, torch.float32)
    rollout = rollout_of(model, toy_tokenizer, toy_rows["train"], 11)
    replay = rollout_log_probs(model, rollout, SIGMA, 1.0, vocab)
    assert replay.argmax_flips == 0 and replay.h0_gap_sum / replay.h0_gap_steps < 1e-6
    new = grads(model, replay.cot.sum())
    score, recorded, _, _ = explicit_terms(model, rollout, vocab)
    with torch.no_grad():  # the values: -||eps||^2 / 2 per step and -||h~ - h0_replay||^2 / (2 sigma^2)
        eps_form = rollout_log_probs(model, rollout, SIGMA, 1.0, vocab).cot.sum()
    assert eps_form.item() == pytest.approx(recorded.detach().item(), rel=1e-5)
    old = grads(model, recorded)
    assert (new - old).norm() <= 1e-4 * old.norm()
