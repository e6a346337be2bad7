"""The update pass without host syncs: its diagnostics stay on the device and are read once per
update, so a sync count does not grow with the number of micro-batches (on a GPU each read waits for
every kernel queued before it; the H100 update paid 29 of them per micro-batch). Counted on the CPU
by wrapping the Tensor methods that read a value to the host."""

import collections
from types import SimpleNamespace

import pytest
import torch

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS

READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy")


@pytest.fixture()
def count_reads(monkeypatch):
    counts = collections.Counter()
    for name in READS:
        real = getattr(torch.Tensor, name)

        def wrapped(self, *a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return counts


@pytest.mark.parametrize("name", ["soft_sample", "hard_sample"])
def test_host_reads_per_update_do_not_grow_with_micro_batches(name, toy_tokenizer, toy_rows, count_reads):
    """Eight rows of a soft (or hard) rollout, long enough for several logit chunks, through the
    sharded update pass in micro-batches of 8, 2 and 1: one read of the sums per update, whatever the
    micro-batch (before: 14 per micro-batch here, 29 on the paper's shapes), and the same sums."""
    from conftest import make_tiny_model

    import softtokens.train.rloo as rloo
    from softtokens.train.distributed import DataParallel
    from softtokens.train.sharding import shard_policy
    from softtokens.train.update import accumulate_gradients

    setting = INFERENCE_SETTINGS[name]
    sigma = 0.05 if setting.noise_factor else 0.0
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:8]]
    rollout = CotEngine(make_tiny_model(toy_tokenizer, seed=6), toy_tokenizer).generate(
        prompts, setting, sigma, list(range(8)), 24, 4, 1.0)
    adv = torch.linspace(-1, 1, 8)
    dp = DataParallel()
    try:
        policy = shard_policy(make_tiny_model(toy_tokenizer, seed=6), dp.mesh, "float32", "float32", False)
        reads, sums = {}, {}
        for mb in (8, 2, 1):
            cfg = SimpleNamespace(micro_batch_size=mb, answer_temperature=1.0, replay_logit_tolerance=1.0)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(rloo, "logit_chunk_steps", lambda rows: 7)   # several chunks a micro-batch
                count_reads.clear()
                policy.zero_grad()
                pending = accumulate_gradients(policy, rollout, adv, 8, cfg, sigma, len(toy_tokenizer), 1.0)
                during = sum(count_reads.values())
                sums[mb] = pending.over(dp)
                reads[mb] = (during, sum(count_reads.values()) - during)
    finally:
        dp.close()
    assert reads == {8: (0, 1), 2: (0, 1), 1: (0, 1)}
    assert sums[8].cot_steps == sums[1].cot_steps > 0
    assert sums[8].loss == pytest.approx(sums[1].loss, rel=1e-4, abs=1e-6)   # float32 sums in another order
    assert sums[8].flips == sums[2].flips == sums[1].flips


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16 (the paper grid's)"])
def test_the_training_forward_masks_as_transformers_does(dtype, toy_tokenizer, toy_rows):
    """The update pass's forward gets its causal-and-padding mask made on the device (no host read);
    its hidden states at every step equal those of the forward given the 2-D padding mask, in float32
    and in the paper grid's bf16 compute (its additive mask in bf16)."""
    from conftest import make_tiny_model

    from softtokens.model.head import decoder_hidden
    from softtokens.train.rloo import step_hidden

    tiny_model = make_tiny_model(toy_tokenizer, dtype=dtype, seed=4)
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:5]]
    rollout = CotEngine(tiny_model, toy_tokenizer).generate(prompts, INFERENCE_SETTINGS["soft_sample"], 0.05,
                                                            [1, 2, 3, 4, 5], 16, 4, 1.0)
    assert (rollout.prompt_mask == 0).any()   # left padding: the masks differ on padded rows
    with torch.no_grad():
        got = step_hidden(tiny_model, rollout)
        emb = tiny_model.get_input_embeddings()
        x_steps = emb(rollout.step_ids)
        x_steps = torch.where((rollout.step_phase == 0).unsqueeze(-1), rollout.noisy_inputs.to(x_steps.dtype), x_steps)
        x = torch.cat([emb(rollout.prompt_ids), x_steps], dim=1)
        mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.step_ids)], dim=1)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        ref = decoder_hidden(tiny_model, inputs_embeds=x, attention_mask=mask, position_ids=pos)
    steps = rollout.step_ids.shape[1]
    tol = 1e-6 if dtype == torch.float32 else 0.0   # bf16: the same kernels on the same masks, bit for bit
    torch.testing.assert_close(got, ref[:, -(steps + 1):-1], atol=tol, rtol=tol)
