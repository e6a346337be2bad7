"""The soft-run loss: our one teacher-forced pass against a step-by-step reference (float64),
for a fixed recorded rollout, and against finite differences."""

import pytest
import torch
from conftest import assert_same_loss_and_gradients, make_tiny_model, stepwise

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.rollout import ANSWER, COT
from softtokens.engine.settings import INFERENCE_SETTINGS, CotSetting
from softtokens.train.rloo import (
    gaussian_log_prob,
    rloo_loss,
    rollout_log_probs,
    token_log_prob,
)


def reference_log_probs(model, rollout, sigma, answer_temperature):
    """Recompute every step's log-prob with a fresh, cache-less forward over the unpadded
    prefix: the definition, with no batching, padding or slicing tricks."""
    E, W = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    setting = rollout.setting
    totals = []
    for i in range(rollout.step_ids.shape[0]):
        total = torch.zeros((), dtype=torch.float64)
        for s, phase, tok, h in stepwise(model, rollout, i):
            logits = h @ W.T
            if phase == COT and setting.mode != "hard":
                mean = torch.softmax(logits / setting.temperature, -1) @ E
                total = total + gaussian_log_prob(rollout.noisy_inputs[i, s], mean, sigma)
            elif phase == COT:
                total = total + token_log_prob(logits, tok, setting.temperature)
            elif phase == ANSWER:
                total = total + token_log_prob(logits, tok, answer_temperature)
        totals.append(total)
    return torch.stack(totals)


@pytest.fixture(scope="module")
def model64(toy_tokenizer):
    return make_tiny_model(toy_tokenizer, dtype=torch.float64, seed=3, hidden=16, layers=1)


@pytest.mark.parametrize("setting", [CotSetting("soft", 0.5, 0.33), CotSetting("fuzzy", 0.0001, 0.33),
                                     CotSetting("hard", 1.0, 0.0)])
def test_teacher_forced_pass_equals_stepwise_reference(model64, toy_tokenizer, toy_rows, setting):
    sigma = 0.1 if setting.mode != "hard" else 0.0
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    rollout = CotEngine(model64, toy_tokenizer).generate(prompts, setting, sigma, [5, 6, 7], 6, 3,
                                                         answer_temperature=1.0)
    adv = torch.tensor([1.5, -0.5, -1.0], dtype=torch.float64)
    assert_same_loss_and_gradients(model64, rollout, sigma, reference_log_probs, adv)


def test_soft_loss_gradient_matches_finite_differences(model64, toy_tokenizer, toy_rows):
    """Our update's gradient (the Gaussian term at the rollout's own noise, train.rloo) is the gradient of
    the paper's log-density of the recorded inputs, -||h~ - h0(theta)||^2 / (2 sigma^2) plus the answer's
    log-probs, at the parameters that drew them: central finite differences of that density (the
    stepwise reference) agree with it. (The term's own value, -||eps||^2 / 2, does not move with theta.)"""
    sigma = 0.1
    setting = INFERENCE_SETTINGS["soft_sample"]
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:2]]
    rollout = CotEngine(model64, toy_tokenizer).generate(prompts, setting, sigma, [1, 2], 5, 2, answer_temperature=1.0)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)

    def loss():  # the paper's density of the recorded rollout, a function of theta
        return rloo_loss(reference_log_probs(model64, rollout, sigma, 1.0), adv, 2)

    model64.zero_grad()
    cot, ans = rollout_log_probs(model64, rollout, sigma, 1.0)[:2]
    rloo_loss(cot + ans, adv, 2).backward()
    for name in ("model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight", "model.norm.weight"):
        p = dict(model64.named_parameters())[name]
        flat_grad = p.grad.flatten()
        idx = int(flat_grad.abs().argmax())  # a coordinate the loss depends on
        # LlamaRMSNorm computes in float32 even in a float64 model, and the stepwise density runs a whole
        # forward per step: below ~1e-3 the differences drown in that round-off (1e-4 is off by 4e-3)
        eps = 1e-3
        with torch.no_grad():
            orig = p.view(-1)[idx].item()
            p.view(-1)[idx] = orig + eps
            up = loss().item()
            p.view(-1)[idx] = orig - eps
            down = loss().item()
            p.view(-1)[idx] = orig
        fd = (up - down) / (2 * eps)
        assert fd == pytest.approx(flat_grad[idx].item(), rel=2e-3, abs=1e-7), name
    model64.zero_grad()


def test_gaussian_scale_only_reweights_the_cot_term(model64, toy_tokenizer, toy_rows):
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:2]]
    rollout = CotEngine(model64, toy_tokenizer).generate(prompts, INFERENCE_SETTINGS["fuzzy_sample"], 0.1, [3, 4], 5, 2,
                                                         answer_temperature=1.0)
    with torch.no_grad():
        cot, ans = rollout_log_probs(model64, rollout, 0.1, 1.0)[:2]
        cot_d, ans_d = rollout_log_probs(model64, rollout, 0.1, 1.0, gaussian_scale=1 / 16)[:2]
    assert torch.allclose(cot_d, cot / 16) and torch.allclose(ans_d, ans)
