"""Noise placements (Appendix "Noise placement"): the engine noises what the density says it
noised, the update pass's term equals an independent step-by-step computation on a recorded
rollout, top-k keeps all probability on the k largest logits, and REINFORCE with each
placement's density is unbiased on closed-form problems."""

import pytest
import torch
from conftest import assert_same_loss_and_gradients, make_tiny_model, stepwise

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.noise import counter_normal
from softtokens.engine.rollout import ANSWER, COT
from softtokens.engine.settings import EMBEDDING, CotSetting, Placement, placement_of
from softtokens.model.scale import embedding_scale
from softtokens.train.rloo import (
    gaussian_log_prob,
    placement_gaussian,
    rloo_advantages,
    rloo_loss,
    token_log_prob,
)

PLACEMENTS = [("fuzzy", Placement("hidden")), ("soft", Placement("hidden")), ("fuzzy", Placement("logits")),
              ("soft", Placement("logits")), ("soft", Placement("logits", 5))]
TAU = {"soft": 0.5, "fuzzy": 0.0001}


def test_counter_noise_is_standard_normal_and_a_function_of_its_coordinates():
    keys, steps = torch.tensor([1, 2, 3, 2**62 + 7]), torch.tensor([0, 0, 5, 9])
    x = counter_normal(keys, steps, 100_000)
    assert torch.allclose(x.mean(1), torch.zeros(4), atol=0.02)
    assert torch.allclose(x.std(1), torch.ones(4), atol=0.02)
    assert ((x > 1.96).float().mean(1) - 0.025).abs().max() < 0.004  # a normal's tail, not a uniform's
    assert abs(torch.corrcoef(x[:2])[0, 1]) < 0.02                    # rows independent
    # a row's draws do not depend on what it is batched with, nor on how many coordinates are asked
    assert torch.equal(counter_normal(keys[2:3], steps[2:3], 10)[0], x[2, :10])
    assert not torch.equal(counter_normal(keys[:1], steps[:1] + 1, 10), x[:1, :10])


@pytest.fixture(scope="module")
def model64(toy_tokenizer):
    return make_tiny_model(toy_tokenizer, dtype=torch.float64, seed=5, hidden=16, layers=1)


def reference(model, rollout, sigma, answer_temperature):
    """The definition, step by step, with a fresh cache-less forward over each unpadded prefix:
    at a CoT step, the quantity the placement noises (final hidden state, logits, or the top-k
    logits at the recorded ids), the rollout's noise on it, the input that noised distribution
    gives (checked against what the rollout fed), and the Gaussian term around the replayed value."""
    E, W = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    where, k = rollout.placement
    tau = rollout.setting.temperature
    totals = []
    for i in range(rollout.step_ids.shape[0]):
        total = torch.zeros((), dtype=torch.float64)
        for s, phase, tok, h in stepwise(model, rollout, i):
            logits = h @ W.T
            if phase == COT:
                if where == "hidden":
                    mean = h
                elif k:
                    ids = rollout.topk_ids[i, s]
                    assert torch.equal(torch.sort(ids).values, torch.sort(logits.topk(k).indices).values)
                    mean = logits[ids]
                else:
                    mean = logits
                eps = counter_normal(rollout.row_keys[i:i + 1], torch.tensor([s]), mean.shape[-1])[0].double()
                noised = mean.detach() + sigma * eps
                z = noised @ W.T if where == "hidden" else (
                    torch.full_like(logits, float("-inf")).scatter(0, ids, noised) if k else noised)
                fed = torch.softmax(z / tau, -1) @ E
                assert torch.allclose(fed, rollout.noisy_inputs[i, s].double(), atol=1e-6), (where, k, s)
                assert int(tok) == int(z.argmax())  # the shadow token: the noised distribution's mode
                total = total + gaussian_log_prob(noised, mean, sigma)
            elif phase == ANSWER:
                total = total + token_log_prob(logits, tok, answer_temperature)
        totals.append(total)
    return torch.stack(totals)


@pytest.mark.parametrize("mode,placement", PLACEMENTS, ids=lambda p: str(p))
def test_placement_loss_term_equals_an_independent_computation(model64, toy_tokenizer, toy_rows, mode, placement):
    sigma = 0.3
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    rollout = CotEngine(model64, toy_tokenizer).generate(prompts, CotSetting(mode, TAU[mode], 0.33), sigma, [11, 12, 13],
                                                         5, 3, answer_temperature=1.0, placement=placement)
    assert rollout.placement == placement and (rollout.step_phase == COT).any()
    adv = torch.tensor([1.0, -2.0, 1.0], dtype=torch.float64)
    assert_same_loss_and_gradients(model64, rollout, sigma, reference, adv)


@pytest.mark.parametrize("k", [1, 5, 50])
def test_top_k_puts_no_probability_outside_the_top_k(toy_tokenizer, toy_rows, k):
    """Every fed mixture is a convex combination of the E rows of the k largest logits only: its
    weights, solved from the recorded input, vanish elsewhere (soft, tau = 1, with noise)."""
    model = make_tiny_model(toy_tokenizer, dtype=torch.float64, seed=2, hidden=16, layers=1)
    E = model.get_input_embeddings().weight[: len(toy_tokenizer)].detach()
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:4]]
    rollout = CotEngine(model, toy_tokenizer).generate(prompts, CotSetting("soft", 1.0, 0.33), 0.5, [1, 2, 3, 4], 6, 2,
                                                       placement=Placement("logits", k))
    cot = rollout.step_phase == COT
    ids = rollout.topk_ids[cot]                      # (steps, k)
    fed = rollout.noisy_inputs[cot].double()         # (steps, d)
    assert ids.shape[-1] == k and fed.shape[0] > 0
    for row_ids, x in zip(ids, fed):
        inside = E[row_ids]                          # the mixture of the top-k rows that produced x
        weights = torch.linalg.lstsq(inside.T, x.unsqueeze(-1)).solution.squeeze(-1) if k <= E.shape[1] else None
        if weights is not None:
            assert torch.allclose(inside.T @ weights, x, atol=1e-8)  # x lies in the span of the top-k rows
            assert weights.min() > -1e-8 and abs(weights.sum() - 1) < 1e-6
    shadows = rollout.step_ids[cot]
    assert all(int(t) in set(r.tolist()) for t, r in zip(shadows, ids))


def test_placements_without_noise_decode_as_the_embedding_placement(tiny_model, toy_tokenizer, toy_rows):
    """sigma = 0 (greedy validation): hidden and full-logits placements mix exactly what the
    embedding placement mixes; top-k with k = V too."""
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:6]]
    engine = CotEngine(tiny_model, toy_tokenizer)
    setting = CotSetting("soft", 0.5, 0.0)
    base = engine.generate(prompts, setting, 0.0, list(range(6)), 8, 3)
    for placement in (Placement("hidden"), Placement("logits"), Placement("logits", len(toy_tokenizer))):
        other = engine.generate(prompts, setting, 0.0, list(range(6)), 8, 3, placement=placement)
        assert torch.equal(other.step_ids, base.step_ids), placement
        assert torch.allclose(other.noisy_inputs, base.noisy_inputs, atol=1e-5), placement


def _closed_form_check(mean_fn, theta, sigma, reward, true_grad, placement, n=200_000, top_ids=None):
    """RLOO with the placement's Gaussian term (rloo.placement_gaussian, counter noise keyed by row)
    against the closed-form gradient."""
    mean = mean_fn(theta)                                      # (dims,) or (V,)
    keys = torch.arange(n)
    rows_mean = mean.expand(n, 1, mean.shape[-1])
    if placement.where == "hidden":
        term = placement_gaussian(rows_mean, None, placement, sigma, keys, None, 0)
    else:
        logits = rows_mean if not placement.top_k else mean_fn.full(theta).expand(n, 1, -1)
        ids = None if not placement.top_k else top_ids.expand(n, 1, -1)
        term = placement_gaussian(rows_mean, logits, placement, sigma, keys, ids, 0)
    eps = counter_normal(keys.unsqueeze(1), torch.zeros(n, 1, dtype=torch.long), mean.shape[-1]).double()
    noised = (mean.detach() + sigma * eps)[:, 0]
    rewards = reward(noised)
    adv = rloo_advantages(rewards.view(1, n)).flatten()
    est, = torch.autograd.grad(-rloo_loss(term[:, 0], adv, n), theta)
    rel = (est - true_grad).norm() / true_grad.norm()
    assert rel < 0.05, (placement, rel, est, true_grad)


def test_reinforce_with_the_hidden_density_is_unbiased():
    """h~ = A theta + sigma eps, R = -||W h~ - c||^2: E[R] = -||W A theta - c||^2 - sigma^2 tr(W^T W)."""
    torch.manual_seed(0)
    d, V, sigma = 4, 6, 0.4
    A, W, c = torch.randn(d, 3).double(), torch.randn(V, d).double(), torch.randn(V).double()
    theta = torch.randn(3, dtype=torch.float64, requires_grad=True)
    true_grad, = torch.autograd.grad(-((W @ (A @ theta) - c) ** 2).sum(), theta)
    _closed_form_check(lambda t: A @ t, theta, sigma, lambda h: -((h @ W.T - c) ** 2).sum(-1), true_grad,
                       Placement("hidden"))


def test_reinforce_with_the_logits_density_is_unbiased():
    """l~ = B theta + sigma eps (every logit), R = a . l~ - ||l~ - c||^2."""
    torch.manual_seed(1)
    V, sigma = 7, 0.5
    B, a, c = torch.randn(V, 3).double(), torch.randn(V).double(), torch.randn(V).double()
    theta = torch.randn(3, dtype=torch.float64, requires_grad=True)
    logits = B @ theta
    true_grad, = torch.autograd.grad(a @ logits - ((logits - c) ** 2).sum(), theta)
    _closed_form_check(lambda t: B @ t, theta, sigma, lambda l: l @ a - ((l - c) ** 2).sum(-1), true_grad,
                       Placement("logits"))


def test_reinforce_with_the_top_k_density_is_unbiased():
    """Only the k largest logits are noised (their set fixed near theta): R = -||l~_S - c||^2."""
    torch.manual_seed(2)
    V, k, sigma = 9, 3, 0.3
    B, c = torch.randn(V, 2).double() * 3, torch.randn(k).double()
    theta = torch.randn(2, dtype=torch.float64, requires_grad=True)
    ids = (B @ theta).detach().topk(k).indices

    class TopK:
        def __call__(self, t):
            return (B @ t)[ids]

        def full(self, t):
            return B @ t

    true_grad, = torch.autograd.grad(-(((B @ theta)[ids] - c) ** 2).sum(), theta)
    _closed_form_check(TopK(), theta, sigma, lambda l: -((l - c) ** 2).sum(-1), true_grad, Placement("logits", k),
                       top_ids=ids)


def test_placement_config_and_sigma_rules(tiny_model):
    assert placement_of({}) == EMBEDDING
    assert placement_of({"noise_placement": "logits", "noise_top_k": 5}) == Placement("logits", 5)
    with pytest.raises(ValueError):
        placement_of({"noise_placement": "hidden", "noise_top_k": 5})
    with pytest.raises(ValueError):
        placement_of({"noise_placement": "output"})
    scale = embedding_scale(tiny_model)
    g = tiny_model.model.norm.weight.detach().double()
    W = tiny_model.lm_head.weight.detach().double()
    assert scale.sigma(0.5, "hidden") == pytest.approx(0.5 * g.pow(2).mean().sqrt().item())
    assert scale.sigma(0.5, "logits") == pytest.approx(
        0.5 * g.pow(2).mean().sqrt().item() * scale.dim ** 0.5 * W.pow(2).mean().sqrt().item(), rel=1e-5)
    assert scale.sigma(0.5) == pytest.approx(0.5 * scale.rms_coordinate)


@pytest.mark.parametrize("mode,placement", [("fuzzy", Placement("hidden")), ("fuzzy", Placement("logits")),
                                            ("soft", Placement("logits", 5))], ids=str)
def test_placements_train_at_the_papers_precision(base, toy_rows, tmp_path, mode, placement):
    """The paper grid's path for the ablations grid: float32 master weights and AdamW, bf16 rollouts
    and update pass. Each step passes the replay check (argmax bound), its loss is finite, every
    weight moves, and the run records its noise."""
    from safetensors.torch import load_file

    from softtokens.train.config import TrainConfig
    from softtokens.train.loop import Trainer

    cfg = TrainConfig.paper(mode=mode, seed=1, lr=6e-6, prompts_per_step=2, samples_per_prompt=4, steps=2, warmup_steps=1,
                      cot_max_tokens=10, answer_max_tokens=4, val_every=2, val_size=6, micro_batch_size=4,
                      param_dtype="float32", compute_dtype="bfloat16", noise_placement=placement.where,
                      noise_top_k=placement.top_k, soft_temperature=1.0 if placement.top_k else 0.5)
    trainer = Trainer(cfg, str(base / "model"), toy_rows["train"], toy_rows["validation"], tmp_path / "_resume")
    trainer.run()
    trainer.finish(tmp_path / "checkpoints", tmp_path / "metrics.jsonl")
    steps = [m for m in trainer.metrics if m["kind"] == "train"]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor([m["loss"], m["grad_norm"], m["cot_logp"]])).all()
                                   for m in steps)
    assert all(m["replay_argmax_mismatch"] <= cfg.replay_argmax_mismatch_max for m in steps)
    assert trainer.noise["placement"] == placement.where and trainer.noise["top_k"] == placement.top_k
    before = load_file(base / "model" / "model.safetensors")
    after = load_file(tmp_path / "checkpoints" / "latest" / "model.safetensors")
    assert all(after[k].dtype == torch.float32 for k in after)
    moved = sum(bool((after[k] != before[k].float()).any()) for k in after)
    assert moved == len(after), f"{moved} of {len(after)} tensors moved"
