import pytest
import torch

from softtokens.train.rloo import gaussian_log_prob, gaussian_score_term, rloo_advantages, rloo_loss


def test_leave_one_out_advantages_by_hand():
    r = torch.tensor([[100.0, 10.0, 0.0, 10.0], [0.0, 0.0, 0.0, 0.0]])
    a = rloo_advantages(r)
    assert a[0, 0] == pytest.approx(100 - (10 + 0 + 10) / 3)
    assert a[0, 1] == pytest.approx(10 - (100 + 0 + 10) / 3)
    assert a[0, 2] == pytest.approx(0 - (100 + 10 + 10) / 3)
    assert torch.all(a[1] == 0)


def test_advantages_sum_to_zero_and_scale():
    r = torch.rand(3, 8) * 100
    a = rloo_advantages(r)
    # sum_g A_g = G/(G-1) * sum_g (r_g - mean) = 0
    assert torch.allclose(a.sum(1), torch.zeros(3), atol=1e-4)
    # A_g = G/(G-1) (r_g - mean r)
    assert torch.allclose(a, 8 / 7 * (r - r.mean(1, keepdim=True)), atol=1e-4)


def test_advantages_need_a_group():
    with pytest.raises(ValueError):
        rloo_advantages(torch.ones(2, 1))


def test_gaussian_log_prob_formula():
    noisy = torch.tensor([[1.0, 2.0, 3.0]])
    mean = torch.tensor([[0.0, 2.0, 5.0]])
    sigma = 0.5
    expected = -(1 + 0 + 4) / (2 * 0.25)
    assert gaussian_log_prob(noisy, mean, sigma).item() == pytest.approx(expected)
    # it is the normal log-density up to a constant that does not depend on the mean
    ref = torch.distributions.Normal(mean, sigma).log_prob(noisy).sum(-1)
    const = ref - gaussian_log_prob(noisy, mean, sigma)
    other = torch.distributions.Normal(mean + 1, sigma).log_prob(noisy).sum(-1) - gaussian_log_prob(noisy, mean + 1, sigma)
    assert torch.allclose(const, other)
    with pytest.raises(ValueError):
        gaussian_log_prob(noisy, mean, 0.0)


def test_reinforce_with_gaussian_term_is_unbiased_for_a_soft_mixture():
    """E[R] for h~ = softmax(theta/tau) @ E + sigma eps and R = -||h~ - c||^2 has the closed form
    -||mu - c||^2 - d sigma^2, so grad E[R] = -2 J^T (mu - c). The RLOO estimator built from
    gaussian_log_prob must match it within sampling error."""
    torch.manual_seed(0)
    vocab, dim, tau, sigma, n = 5, 3, 0.5, 0.3, 200_000
    theta = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    emb = torch.randn(vocab, dim, dtype=torch.float64)
    c = torch.randn(dim, dtype=torch.float64)

    mu = torch.softmax(theta / tau, -1) @ emb
    true_grad, = torch.autograd.grad(-((mu - c) ** 2).sum(), theta)

    mu = torch.softmax(theta / tau, -1) @ emb
    noisy = (mu.detach() + sigma * torch.randn(n, dim, dtype=torch.float64))
    rewards = -((noisy - c) ** 2).sum(-1)
    adv = rloo_advantages(rewards.view(1, n)).flatten()
    loss = rloo_loss(gaussian_log_prob(noisy, mu.expand(n, dim), sigma), adv, n)
    est, = torch.autograd.grad(-loss, theta)
    # per-sample gradients give the standard error of the mean
    assert torch.allclose(est, true_grad, atol=4 * true_grad.abs().max().item() * 0.02 + 0.02), (est, true_grad)
    rel = (est - true_grad).norm() / true_grad.norm()
    assert rel < 0.05, rel
    # the update's form, the term at the rollout's own noise eps = (h~ - mu) / sigma: the same estimator
    eps = (noisy - mu.detach()) / sigma
    mu = torch.softmax(theta / tau, -1) @ emb
    at_noise, = torch.autograd.grad(-rloo_loss(gaussian_score_term(mu.expand(n, dim), eps, sigma), adv, n), theta)
    assert torch.allclose(at_noise, est, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["hard_sample", "fuzzy_sample"])
def test_chunked_update_pass_equals_one_chunk(monkeypatch, tiny_model, toy_tokenizer, toy_rows, name):
    """Log-probabilities, replay statistics and gradients do not depend on how many steps' logits
    the update pass holds at once (chunks of 7 steps, recomputed in the backward, vs all at once).
    The bf16-compute variant is test_chunked_update_pass_in_bf16_compute."""
    import softtokens.train.rloo as rloo
    from softtokens.data.prompt import format_prompt
    from softtokens.engine.cot import CotEngine
    from softtokens.engine.settings import INFERENCE_SETTINGS

    setting = INFERENCE_SETTINGS[name]
    sigma = 0.05 if setting.noise_factor else 1.0
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    rollout = CotEngine(tiny_model, toy_tokenizer).generate(prompts, setting, sigma, [1, 2, 3], 24, 4, 1.0)
    assert rollout.step_ids.shape[1] > 21
    results = {}
    for chunk in (7, 10_000):
        monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows, chunk=chunk: chunk)
        tiny_model.zero_grad()
        out = rloo.rollout_log_probs(tiny_model, rollout, sigma, 1.0, len(toy_tokenizer))
        (out.cot.sum() + out.answer.sum()).backward()
        grads = [p.grad.clone() for p in tiny_model.parameters()]
        results[chunk] = (out, grads)
    tiny_model.zero_grad()
    (a, ga), (b, gb) = results[7], results[10_000]
    torch.testing.assert_close(a.cot, b.cot, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(a.answer, b.answer, atol=1e-5, rtol=1e-6)
    assert a.h0_gap_sum == pytest.approx(b.h0_gap_sum, rel=1e-5, abs=1e-9)
    assert a.argmax_mismatches == b.argmax_mismatches == 0
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_chunked_update_pass_in_bf16_compute(monkeypatch, toy_tokenizer, toy_rows):
    """The paper grid's update pass: float32 master weights sharded by FSDP2 with bf16 compute
    (sharding.shard_policy, one process), float32 logits chunked over steps. Chunks of 7 give the
    one-chunk loss, and float32 gradients to bf16 accuracy."""
    from conftest import make_tiny_model

    import softtokens.train.rloo as rloo
    from softtokens.data.prompt import format_prompt
    from softtokens.engine.cot import CotEngine
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.train.distributed import DataParallel
    from softtokens.train.sharding import shard_policy

    setting = INFERENCE_SETTINGS["fuzzy_sample"]
    rollout_model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=6)
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    rollout = CotEngine(rollout_model, toy_tokenizer).generate(prompts, setting, 0.05, [1, 2, 3], 24, 4, 1.0)
    assert rollout.step_ids.shape[1] > 21
    dp = DataParallel()
    try:
        policy = shard_policy(make_tiny_model(toy_tokenizer, seed=6), dp.mesh, "bfloat16", "float32", False)
        results = {}
        for chunk in (7, 10_000):
            monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows, chunk=chunk: chunk)
            policy.zero_grad()
            out = policy(rollout, 0.05, 1.0, len(toy_tokenizer), 1.0)
            assert out.cot.dtype == torch.float32
            (out.cot.sum() + out.answer.sum()).backward()
            results[chunk] = (out, [p.grad.full_tensor().clone() for p in policy.parameters()])
    finally:
        dp.close()
    (a, ga), (b, gb) = results[7], results[10_000]
    torch.testing.assert_close(a.cot, b.cot, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(a.answer, b.answer, atol=1e-3, rtol=1e-5)
    for x, y in zip(ga, gb):
        assert x.dtype == torch.float32
        torch.testing.assert_close(x, y, atol=1e-3 * y.abs().max().item() + 1e-6, rtol=2e-2)


def test_near_ties_and_the_softmax_jacobian_scale_are_counted():
    """The fuzzy-spike diagnostic (docs/findings.md, "Why fuzzy training spikes"): a CoT step is a near tie when
    its mixture's second weight is >= 1 % of its first (top-two logits within tau ln 100), and the
    largest p1 p2 / tau over CoT steps is reported. Logits are set by hand: W = I, logits = h."""
    from softtokens.engine.settings import EMBEDDING, CotSetting
    from softtokens.train.rloo import _chunk_terms

    tau, v = 1e-4, 4
    gaps = [0.0, 10 * tau, 2 * tau, 0.0]   # top-two gaps of steps 0..3; step 3 is an answer step
    h = torch.zeros(1, 4, v, dtype=torch.float64)
    for s, gap in enumerate(gaps):
        h[0, s, :2] = torch.tensor([1.0, 1.0 - gap])
    emb = torch.randn(v, 3, dtype=torch.float64)
    is_cot = torch.tensor([[True, True, True, False]])
    out = _chunk_terms(h, torch.eye(v, dtype=torch.float64), emb, torch.zeros(1, 4, dtype=torch.long), is_cot, ~is_cot,
                       torch.randn(1, 4, 3, dtype=torch.float64), None, None, torch.tensor([5]),
                       setting=CotSetting("fuzzy", tau, 0.33), sigma=0.1, answer_temperature=1.0, gaussian_scale=1.0,
                       placement=EMBEDDING, first_step=0)
    ties, jacobian_max = out[4], out[5]
    assert int(ties) == 2  # steps 0 and 2; step 1 (ratio e^-10) is not one, step 3 is not a CoT step
    assert float(jacobian_max) == pytest.approx(0.25 / tau)
    # the scale is the softmax Jacobian's: d p1 / d z1 = p1 p2 / tau for two live tokens
    z = h[0, 2].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(torch.softmax(z / tau, -1)[0], z)
    p = torch.softmax(h[0, 2] / tau, -1)
    assert g[0].item() == pytest.approx((p[0] * p[1] / tau).item(), rel=1e-9)


@torch.no_grad()
def test_replay_counts_a_flip_as_a_mismatch_only_beyond_the_logit_tolerance(tiny_model, toy_tokenizer, toy_rows):
    """bf16 rollouts and replays differ a little, and at a near tie the argmax flips (9 % of CoT
    steps on an H100, docs/gpu.md): a flip is a mismatch only where the replay puts the rollout's
    token more than the tolerance below its top. A rollout whose recorded argmax is the replay's
    second-best token at some steps and its worst at others shows both kinds; the h0 gap sums
    over the steps that did not flip."""
    import dataclasses

    from softtokens.data.prompt import format_prompt
    from softtokens.engine.cot import CotEngine
    from softtokens.engine.rollout import COT
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.model.head import output_logits
    from softtokens.train.rloo import rollout_log_probs, step_hidden

    setting = INFERENCE_SETTINGS["soft_sample"]
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    rollout = CotEngine(tiny_model, toy_tokenizer).generate(prompts, setting, 0.05, [1, 2, 3], 12, 3, 1.0)
    clean = rollout_log_probs(tiny_model, rollout, 0.05, 1.0, len(toy_tokenizer), logit_tolerance=0.0)
    assert clean.argmax_flips == clean.argmax_mismatches == 0 and clean.h0_gap_steps == clean.cot_steps
    assert clean.h0_gap_sum / clean.h0_gap_steps < 1e-8  # float32: the replay's mixtures are the rollout's
    logits = output_logits(tiny_model, step_hidden(tiny_model, rollout), len(toy_tokenizer))
    order = logits.argsort(-1, descending=True)  # (N, S, V)
    gap2 = logits.gather(-1, order[..., :1]) - logits.gather(-1, order[..., 1:2])
    ids = rollout.argmax_ids.clone()
    cot = rollout.step_phase == COT
    ids[:, 0] = order[:, 0, 1]    # first CoT step of each row: the replay's runner-up
    ids[:, 1] = order[:, 1, -1]   # second: its worst token
    assert cot[:, :2].all()
    tampered = dataclasses.replace(rollout, argmax_ids=ids)
    small = float(gap2[:, 0].max()) + 1e-3          # above every runner-up gap of step 0
    worst = float((logits[:, 1].max(-1).values - logits[:, 1].min(-1).values).min())
    assert small < worst, "the test model's logits do not separate a near tie from a wrong token"
    n = len(prompts)
    out = rollout_log_probs(tiny_model, tampered, 0.05, 1.0, len(toy_tokenizer), logit_tolerance=small)
    assert out.argmax_flips == 2 * n and out.argmax_mismatches == n  # only the worst-token steps
    assert out.flip_gap_max >= worst - 1e-5
    assert out.h0_gap_steps == clean.cot_steps - 2 * n
    strict = rollout_log_probs(tiny_model, tampered, 0.05, 1.0, len(toy_tokenizer), logit_tolerance=0.0)
    assert strict.argmax_mismatches == 2 * n
