"""The decoding engine: stop/prefill rule, the six settings, batching, soft inputs."""

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

from softtokens.data.prompt import (
    PREFILL_AFTER_STOP,
    PREFILL_AT_LIMIT,
    STOP_TEXT,
    format_prompt,
)
from softtokens.engine.cot import CotEngine
from softtokens.engine.rollout import ANSWER, COT, DONE, PREFILL
from softtokens.engine.sampling import probs_at_temperature
from softtokens.engine.settings import INFERENCE_SETTINGS, CotSetting
from softtokens.engine.stoprule import ends_with_stop
from softtokens.reward.grader import reward


class ScriptedModel(torch.nn.Module):
    """Emits a fixed token script after a one-row prompt, whatever it is fed: its decoder's
    hidden state is the scripted logits row and its output head the identity."""

    def __init__(self, tokenizer, script, prompt_len):
        super().__init__()
        self.emb = torch.nn.Embedding(len(tokenizer), 4)
        self.head = torch.nn.Linear(len(tokenizer), len(tokenizer), bias=False)
        torch.nn.init.eye_(self.head.weight)
        self.config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=4, num_hidden_layers=1, num_attention_heads=1)
        self.generation_config = SimpleNamespace(eos_token_id=tokenizer.eos_token_id)
        self.script, self.prompt_len, self.vocab = script, prompt_len, len(tokenizer)

    @property
    def device(self):
        return torch.device("cpu")

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head

    def get_decoder(self):
        return self

    def forward(self, input_ids=None, inputs_embeds=None, position_ids=None, **_):
        k = int(position_ids[0, -1]) - (self.prompt_len - 1)
        hidden = torch.full((1, 1, self.vocab), -1e4)
        hidden[0, 0, self.script[min(k, len(self.script) - 1)]] = 0.0
        return SimpleNamespace(last_hidden_state=hidden)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _scripted(tok, cot, answer):
    prompt = format_prompt("What is 8 + 4?")
    p_len = len(tok(prompt)["input_ids"])
    return prompt, ScriptedModel(tok, _ids(tok, cot) + _ids(tok, PREFILL_AFTER_STOP) + _ids(tok, answer) + [tok.eos_token_id], p_len)


def test_stop_text_rule():
    assert ends_with_stop("so 12. " + STOP_TEXT)
    assert ends_with_stop("so 12. " + STOP_TEXT + " ")  # the paper's literal 'ends with "...is: "'
    assert ends_with_stop(STOP_TEXT + "\n")
    assert not ends_with_stop(STOP_TEXT + " \\boxed")
    assert not ends_with_stop("The final answer")


@pytest.mark.parametrize("setting", ["hard_greedy", "fuzzy_greedy"])
def test_stop_then_prefill_boxed(toy_tokenizer, setting):
    cot = "8 + 4 = 12. " + STOP_TEXT
    prompt, model = _scripted(toy_tokenizer, cot, "12}.")
    out = CotEngine(model, toy_tokenizer).generate([prompt], INFERENCE_SETTINGS[setting], 0.0, [0], 40, 8)
    assert bool(out.stopped[0])
    assert out.cot_texts[0] == cot
    assert out.completions[0] == " \\boxed{12}."
    assert reward(out.completions[0], "12") == 100.0
    phases = out.step_phase[0].tolist()
    n_cot, n_pre = len(_ids(toy_tokenizer, cot)), len(_ids(toy_tokenizer, PREFILL_AFTER_STOP))
    assert phases[:n_cot] == [COT] * n_cot
    assert phases[n_cot:n_cot + n_pre] == [PREFILL] * n_pre
    assert set(phases[n_cot + n_pre:]) <= {ANSWER, DONE}


def test_limit_prefills_the_whole_stop_phrase(toy_tokenizer):
    cot = "8 + 4 = 12. 8 + 4 = 12. 8 + 4 = 12. 8 + 4 = 12."
    prompt, model = _scripted(toy_tokenizer, cot, "12}.")
    out = CotEngine(model, toy_tokenizer).generate([prompt], INFERENCE_SETTINGS["hard_greedy"], 0.0, [0], 5, 8)
    assert not bool(out.stopped[0])
    assert int(out.cot_len[0]) == 5
    assert out.completions[0].startswith(PREFILL_AT_LIMIT)
    n_pre = len(_ids(toy_tokenizer, PREFILL_AT_LIMIT))
    assert out.step_phase[0, 5:5 + n_pre].tolist() == [PREFILL] * n_pre


def test_fuzzy_mixture_is_the_argmax_embedding_without_noise():
    torch.manual_seed(0)
    logits = torch.randn(16, 50) * 3
    emb = torch.randn(50, 8)
    mix = probs_at_temperature(logits, 1e-4) @ emb
    assert torch.allclose(mix, emb[logits.argmax(-1)], atol=1e-5)
    # numerically safe in bf16 and at extreme logits
    huge = torch.tensor([[1e4, -1e4, 0.0]], dtype=torch.bfloat16)
    p = probs_at_temperature(huge, 1e-4)
    assert torch.isfinite(p).all() and p[0, 0] == 1.0


def _prompts(rows, k):
    return [format_prompt(r["question"]) for r in rows[:k]]


def test_fuzzy_greedy_matches_hard_greedy_tokens(tiny_model, toy_tokenizer, toy_rows):
    eng = CotEngine(tiny_model, toy_tokenizer)
    prompts = _prompts(toy_rows["test"], 8)
    hard = eng.generate(prompts, INFERENCE_SETTINGS["hard_greedy"], 0.0, list(range(8)), 24, 4)
    fuzzy = eng.generate(prompts, INFERENCE_SETTINGS["fuzzy_greedy"], 0.0, list(range(8)), 24, 4)
    assert torch.equal(hard.step_ids, fuzzy.step_ids)
    assert hard.cot_texts == fuzzy.cot_texts
    # the fuzzy inputs are (up to float error) the embeddings of the shadow tokens
    cot = fuzzy.step_phase == COT
    emb = tiny_model.get_input_embeddings().weight
    assert torch.allclose(fuzzy.noisy_inputs[cot], emb[fuzzy.step_ids[cot]], atol=1e-5)


def test_soft_sample_inputs_are_mixture_plus_noise_of_the_right_scale(tiny_model, toy_tokenizer, toy_rows):
    eng = CotEngine(tiny_model, toy_tokenizer)
    sigma = 0.05
    out = eng.generate(_prompts(toy_rows["test"], 4), INFERENCE_SETTINGS["soft_sample"], sigma, [1, 2, 3, 4], 16, 2)
    greedy = eng.generate(_prompts(toy_rows["test"], 4), INFERENCE_SETTINGS["soft_greedy"], 0.0, [1, 2, 3, 4], 16, 2)
    first = out.noisy_inputs[:, 0] - greedy.noisy_inputs[:, 0]  # same prefix, so the difference is the noise
    assert first.std().item() == pytest.approx(sigma, rel=0.35)


@pytest.mark.parametrize("name", list(INFERENCE_SETTINGS))
def test_batched_equals_alone(tiny_model, toy_tokenizer, toy_rows, name):
    """Left padding and batch composition do not change a row's result (per-row randomness)."""
    eng = CotEngine(tiny_model, toy_tokenizer)
    rows = [toy_rows["test"][i] for i in (0, 3, 5)]
    prompts = [format_prompt(r["question"]) + " " * (3 * i) for i, r in enumerate(rows)]  # different lengths
    seeds = [11, 12, 13]
    setting = INFERENCE_SETTINGS[name]
    sigma = 0.05 if setting.noise_factor > 0 else 0.0
    batch = eng.generate(prompts, setting, sigma, seeds, 20, 4, answer_temperature=1.0)
    assert len(set(batch.prompt_mask.sum(1).tolist())) > 1
    for i, (p, s) in enumerate(zip(prompts, seeds)):
        alone = eng.generate([p], setting, sigma, [s], 20, 4, answer_temperature=1.0)
        width = alone.step_ids.shape[1]
        assert batch.step_ids[i, :width].tolist() == alone.step_ids[0].tolist()
        assert batch.step_phase[i, :width].tolist() == alone.step_phase[0].tolist()
        assert batch.completions[i] == alone.completions[0]
        if batch.noisy_inputs is not None:
            assert torch.allclose(batch.noisy_inputs[i, :width], alone.noisy_inputs[0], atol=1e-5)


def test_sampling_uses_the_seed(tiny_model, toy_tokenizer, toy_rows):
    eng = CotEngine(tiny_model, toy_tokenizer)
    p = _prompts(toy_rows["test"], 1) * 2
    out = eng.generate(p, INFERENCE_SETTINGS["hard_sample"], 0.0, [1, 2], 20, 2)
    again = eng.generate(p, INFERENCE_SETTINGS["hard_sample"], 0.0, [1, 2], 20, 2)
    assert torch.equal(out.step_ids, again.step_ids)
    assert out.step_ids[0].tolist() != out.step_ids[1].tolist()


def test_six_settings_match_the_paper():
    s = INFERENCE_SETTINGS
    assert s["hard_greedy"] == CotSetting("hard", 0.0, 0.0)
    assert s["hard_sample"] == CotSetting("hard", 1.0, 0.0)
    assert s["soft_greedy"] == CotSetting("soft", 0.5, 0.0)
    assert s["soft_sample"] == CotSetting("soft", 0.5, 0.33)
    assert s["fuzzy_greedy"] == CotSetting("fuzzy", 0.0001, 0.0)
    assert s["fuzzy_sample"] == CotSetting("fuzzy", 0.0001, 0.33)


@pytest.fixture(scope="module")
def supervised_toy_base(toy_rows):
    """A toy base built by the real build_toy_base, briefly supervised so its CoTs are CoT-like."""
    from softtokens.model.toy import build_toy_base

    model, tok, _ = build_toy_base(toy_rows["train"], hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                   vocab_size=200, sft_steps=150, sft_batch_size=16, sft_lr=3e-3, seed=0,
                                   forget_carry_rate=0.5)
    return model, tok


@pytest.mark.slow
def test_fuzzy_greedy_equals_hard_greedy_on_the_toy_base(supervised_toy_base, toy_rows):
    model, tok = supervised_toy_base
    eng = CotEngine(model, tok)
    prompts = _prompts(toy_rows["test"], 16)
    hard = eng.generate(prompts, INFERENCE_SETTINGS["hard_greedy"], 0.0, [0] * 16, 40, 6)
    fuzzy = eng.generate(prompts, INFERENCE_SETTINGS["fuzzy_greedy"], 0.0, [0] * 16, 40, 6)
    assert hard.cot_texts == fuzzy.cot_texts
    assert hard.completions == fuzzy.completions
    assert sum(" + " in t for t in hard.cot_texts) >= 4  # it has started to write sums
