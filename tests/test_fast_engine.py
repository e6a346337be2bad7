"""The fast engine reproduces the reference loop (engine/reference.py) in all six settings: the same
tokens, phases and completions, the same recorded soft inputs, the same log-probabilities; its
stop automaton is the text rule; slot refill and the host-check interval change nothing."""

import copy
import random

import pytest
import torch
from conftest import make_tiny_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from softtokens.data.prompt import STOP_TEXT, format_prompt
from softtokens.engine import decode_run
from softtokens.engine.cot import MIN_SHARED_TOKENS, CotEngine
from softtokens.engine.decode_run import DecodeRun, first_occurrences
from softtokens.engine.reference import ReferenceCotEngine
from softtokens.engine.rollout import DONE
from softtokens.engine.settings import EMBEDDING, INFERENCE_SETTINGS, Placement
from softtokens.engine.stoprule import StopAutomaton, ends_with_stop
from softtokens.train.rloo import rollout_log_probs

# an instruction the toy tokenizer splits into dozens of tokens, as a real tokenizer splits the
# paper's preamble (the toy's is one token): every prompt starts with it, so the engine prefills
# it once and its decode attention reads it once per step (kvcache.py, decode_forward.py)
LONG_HEAD = "Add the two numbers, carry the tens, and check the sum twice before you answer. "
HEADS = {"template": None, "long": LONG_HEAD}


def _prompts(rows, k, head=None):
    # different lengths: left padding in the reference, left-aligned slots in the fast engine
    return [(head or "") + format_prompt(r["question"]) + " " * (i % 3) for i, r in enumerate(rows[:k])]


def _engine(model, tok, head=None, **kw):
    """The engine, told the prompts' shared head when there is one (the default is the template's)."""
    return CotEngine(model, tok, **kw) if head is None else CotEngine(model, tok, shared_prefix=head, **kw)


def _qwen_like(tok):
    """Qwen2 family: grouped-query attention (1 KV head for 4 query heads) and q/k/v biases."""
    cfg = Qwen2Config(vocab_size=len(tok) + 5, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(5)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, toy_tokenizer):
    return make_tiny_model(toy_tokenizer, seed=3) if request.param == "llama" else _qwen_like(toy_tokenizer)


def _sigma(setting):
    return 0.05 if setting.noise_factor > 0 else 0.0


@pytest.mark.parametrize("name", list(INFERENCE_SETTINGS))
def test_fast_engine_equals_reference(model, toy_tokenizer, toy_rows, name):
    setting = INFERENCE_SETTINGS[name]
    prompts, seeds = _prompts(toy_rows["test"], 6), [3, 1, 4, 1, 5, 9]
    args = (prompts, setting, _sigma(setting), seeds, 24, 5)
    fast = CotEngine(model, toy_tokenizer).generate(*args, answer_temperature=1.0)
    ref = ReferenceCotEngine(model, toy_tokenizer).generate(*args, answer_temperature=1.0)
    _assert_same_rollout(fast, ref, model, toy_tokenizer, setting)


@pytest.mark.parametrize("name", list(INFERENCE_SETTINGS))
def test_shared_prefix_equals_reference(model, toy_tokenizer, toy_rows, name):
    """Prompts that start with a long shared instruction (a real tokenizer's preamble): the engine
    prefills it once and its decode attention reads the one shared copy (a GEMM per KV head, the
    Qwen2 model's 4 query heads on 1 KV head included); every row is still the reference loop's,
    which prefills and attends over each row whole. Repeated prompts are prefilled once too."""
    setting = INFERENCE_SETTINGS[name]
    distinct = _prompts(toy_rows["test"], 5, LONG_HEAD)
    prompts, seeds = distinct + distinct[:2], [3, 1, 4, 1, 5, 9, 2]
    engine = _engine(model, toy_tokenizer, LONG_HEAD)
    shared = engine.shared_tokens(toy_tokenizer(prompts)["input_ids"])
    assert len(shared) >= MIN_SHARED_TOKENS
    assert toy_tokenizer.decode(shared) == LONG_HEAD  # the toy BPE keeps a space with the word before it
    args = (prompts, setting, _sigma(setting), seeds, 24, 5)
    fast = engine.generate(*args, answer_temperature=1.0)
    ref = ReferenceCotEngine(model, toy_tokenizer).generate(*args, answer_temperature=1.0)
    _assert_same_rollout(fast, ref, model, toy_tokenizer, setting)


@pytest.mark.parametrize("name", ["hard_sample", "soft_greedy"])
def test_shared_prefix_with_the_hf_decode_forward(model, toy_tokenizer, toy_rows, name):
    """Architectures the plain-tensor decode does not cover decode with the HF forward, which reads
    every slot's own cache columns: the prefill copies the shared prefix into each slot."""
    setting = INFERENCE_SETTINGS[name]
    prompts, seeds = _prompts(toy_rows["test"], 4, LONG_HEAD), [5, 6, 7, 8]
    engine = _engine(model, toy_tokenizer, LONG_HEAD)
    engine.fast_forward = False
    args = (prompts, setting, _sigma(setting), seeds, 16, 4)
    fast = engine.generate(*args, answer_temperature=1.0)
    ref = ReferenceCotEngine(model, toy_tokenizer).generate(*args, answer_temperature=1.0)
    _assert_same_rollout(fast, ref, model, toy_tokenizer, setting)

def test_shared_tokens_are_what_every_prompt_starts_with(toy_tokenizer, tiny_model):
    engine = _engine(tiny_model, toy_tokenizer, LONG_HEAD)
    ids = engine.shared_ids
    assert len(ids) > MIN_SHARED_TOKENS + 2
    question = toy_tokenizer("12 + 3?")["input_ids"]
    assert engine.shared_tokens([ids + question, ids + question[:1]]) == ids
    # one prompt leaves the head after 20 tokens: the common 20 are shared
    assert engine.shared_tokens([ids + question, ids[:20] + question]) == ids[:20]
    # each prompt keeps one token of its own
    assert engine.shared_tokens([ids + question, ids]) == ids[:-1]
    # under MIN_SHARED_TOKENS in common, or a prompt that does not start with the head: nothing
    assert engine.shared_tokens([ids + question, ids[:5] + question]) == []
    assert engine.shared_tokens([question + ids]) == []
    assert _engine(tiny_model, toy_tokenizer).shared_tokens([ids + question]) == []  # the toy's one-token preamble
    assert CotEngine(tiny_model, toy_tokenizer, shared_prefix=None).shared_tokens([ids + question]) == []


def _assert_same_rollout(fast, ref, model, toy_tokenizer, setting):
    assert fast.step_ids.shape == ref.step_ids.shape
    assert torch.equal(fast.step_ids, ref.step_ids)
    assert torch.equal(fast.step_phase, ref.step_phase)
    live = ref.step_phase != DONE
    assert torch.equal(fast.argmax_ids[live], ref.argmax_ids[live])
    assert fast.completions == ref.completions and fast.cot_texts == ref.cot_texts
    assert torch.equal(fast.cot_len, ref.cot_len) and torch.equal(fast.stopped, ref.stopped)
    torch.testing.assert_close(fast.cot_entropy, ref.cot_entropy, atol=1e-5, rtol=0)
    if setting.mode != "hard":
        # fuzzy: the softmax at tau = 1e-4 multiplies a logit's float32 rounding (~1e-7, which follows
        # the summation order, hence torch's thread count) by up to 0.25 / tau in the mixture's weights:
        # where two tokens nearly tie, the mixture moves by up to ~1e-4 (a wrong mixture: by the
        # embeddings' own scale, ~1e-2). Everywhere else it agrees as soft's does.
        diff = (fast.noisy_inputs - ref.noisy_inputs).abs()
        assert diff.max() <= (1e-5 if setting.mode == "soft" else 1e-3), diff.max()
        assert (diff > 1e-5).float().mean() <= 1e-3
        assert fast.noisy_inputs.dtype == torch.float32
    sigma = _sigma(setting) or 1.0
    with torch.no_grad():
        lp_fast = rollout_log_probs(model, fast, sigma, 1.0, len(toy_tokenizer))
        lp_ref = rollout_log_probs(model, ref, sigma, 1.0, len(toy_tokenizer))
    torch.testing.assert_close(lp_fast.cot, lp_ref.cot, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(lp_fast.answer, lp_ref.answer, atol=1e-5, rtol=1e-6)


def test_reference_engine_takes_the_trainers_call(model, toy_tokenizer, toy_rows):
    """The trainer calls ``engine.generate(..., placement=...)`` and benchmarks/rollout_speed.py
    times an RL step with the reference loop in its place: the two take the same arguments, and
    the reference refuses a noise placement it does not implement instead of ignoring it."""
    import inspect

    assert list(inspect.signature(ReferenceCotEngine.generate).parameters) == \
        list(inspect.signature(CotEngine.generate).parameters)
    ref = ReferenceCotEngine(model, toy_tokenizer)
    args = (_prompts(toy_rows["test"], 2), INFERENCE_SETTINGS["soft_sample"], 0.1, [1, 2], 8, 2)
    plain, explicit = ref.generate(*args), ref.generate(*args, placement=EMBEDDING)
    assert torch.equal(plain.step_ids, explicit.step_ids) and torch.equal(plain.noisy_inputs, explicit.noisy_inputs)
    with pytest.raises(NotImplementedError, match="embedding only"):
        ref.generate(*args, placement=Placement("hidden"))
    # hard tokens have no noise to place (as in the fast engine)
    ref.generate(args[0], INFERENCE_SETTINGS["hard_sample"], 0.0, [1, 2], 8, 2, placement=Placement("hidden"))


@pytest.mark.parametrize("name", ["hard_sample", "fuzzy_sample"])
def test_repeated_prompts_are_prefilled_once(model, toy_tokenizer, toy_rows, name, monkeypatch):
    """G samples of a prompt (training) or n samples of a problem (evaluation): the fast engine runs
    the prompt's prefill once and copies its cache columns to the other slots; every row is the
    reference loop's, which prefills each row."""

    setting = INFERENCE_SETTINGS[name]
    distinct = _prompts(toy_rows["test"], 3)  # three lengths: left padding differs between them
    prompts = [distinct[i] for i in (0, 1, 0, 2, 1, 0, 2, 0)]
    seeds = list(range(20, 28))
    prefill_rows = []
    real = decode_run.decoder_hidden

    def counting(model_, **inputs):
        if "input_ids" in inputs:
            prefill_rows.append(inputs["input_ids"].shape[0])
        return real(model_, **inputs)

    monkeypatch.setattr(decode_run, "decoder_hidden", counting)
    args = (prompts, setting, _sigma(setting), seeds, 16, 4)
    fast = CotEngine(model, toy_tokenizer).generate(*args, answer_temperature=1.0)
    assert prefill_rows == [3]
    monkeypatch.setattr(decode_run, "decoder_hidden", real)
    ref = ReferenceCotEngine(model, toy_tokenizer).generate(*args, answer_temperature=1.0)
    assert torch.equal(fast.step_ids, ref.step_ids) and torch.equal(fast.step_phase, ref.step_phase)
    assert fast.completions == ref.completions
    torch.testing.assert_close(fast.cot_entropy, ref.cot_entropy, atol=1e-5, rtol=0)
    if fast.noisy_inputs is not None:
        torch.testing.assert_close(fast.noisy_inputs, ref.noisy_inputs, atol=1e-5, rtol=0)


def test_first_occurrences():
    assert first_occurrences([[1, 2], [3], [1, 2], [3], [4]]) == ([0, 1, 4], [0, 1, 0, 1, 2])
    assert first_occurrences([[5]]) == ([0], [0])


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("name", ["hard_sample", "fuzzy_sample"])
def test_fixed_shapes_and_check_interval_change_nothing(tiny_model, toy_tokenizer, toy_rows, name, head):
    """The CUDA-graph layout (attention over every cache column, masked) and a host look every 5
    steps give the windowed, every-step result, with and without a shared prefix."""
    setting, head = INFERENCE_SETTINGS[name], HEADS[head]
    args = (_prompts(toy_rows["test"], 5, head), setting, _sigma(setting), [7, 8, 9, 10, 11], 20, 4)
    plain = _engine(tiny_model, toy_tokenizer, head).generate(*args, answer_temperature=1.0)
    fixed = _engine(tiny_model, toy_tokenizer, head, check_every=5, fixed_shapes=True).generate(
        *args, answer_temperature=1.0)
    assert torch.equal(plain.step_ids, fixed.step_ids) and torch.equal(plain.step_phase, fixed.step_phase)
    assert plain.completions == fixed.completions
    if plain.noisy_inputs is not None:
        torch.testing.assert_close(plain.noisy_inputs, fixed.noisy_inputs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("name", ["hard_sample", "fuzzy_sample"])
def test_length_bucketed_windows_change_nothing(monkeypatch, tiny_model, toy_tokenizer, toy_rows, name, head):
    """The fixed-shape step reads the cache up to the smallest bucket that holds every live row through
    the steps of a host look (on CUDA, one captured graph per bucket): with buckets of 16 columns a
    rollout crosses several, and its tokens, phases and inputs are those of the every-column read, in a
    batch and with slots refilled."""
    import softtokens.engine.decode_run as decode_run

    setting, head = INFERENCE_SETTINGS[name], HEADS[head]
    args = (_prompts(toy_rows["test"], 5, head), setting, _sigma(setting), [7, 8, 9, 10, 11], 30, 4)
    whole = _engine(tiny_model, toy_tokenizer, head, check_every=5, fixed_shapes=True).generate(
        *args, answer_temperature=1.0)
    windows = []
    real_steps = decode_run.DecodeRun.steps

    def spy(self, count):
        real_steps(self, count)
        windows.append(self.cache.window)

    monkeypatch.setattr(decode_run, "WINDOW_BUCKET", 16)
    monkeypatch.setattr(decode_run.DecodeRun, "steps", spy)
    bucketed = _engine(tiny_model, toy_tokenizer, head, check_every=5, fixed_shapes=True).generate(
        *args, answer_temperature=1.0)
    assert len(set(windows)) >= 3 and windows == sorted(windows) and all(w % 16 == 0 or w == windows[-1] for w in windows)
    assert torch.equal(whole.step_ids, bucketed.step_ids) and torch.equal(whole.step_phase, bucketed.step_phase)
    assert whole.completions == bucketed.completions
    if whole.noisy_inputs is not None:
        torch.testing.assert_close(whole.noisy_inputs, bucketed.noisy_inputs, atol=1e-5, rtol=0)
    assert decode_run.window_buckets(40, 16) == [16, 32, 40]


@pytest.mark.parametrize("name", ["hard_sample", "fuzzy_sample"])
def test_length_bucketed_windows_on_the_paper_path(monkeypatch, toy_tokenizer, toy_rows, name):
    """The paper grid's decode step: bf16 weights, the fused attention kernel (SDPA, here the CPU's),
    fixed shapes. Read through buckets of 16 columns, its rollout is the every-column read's: the
    same tokens and phases, and the same fed inputs to bf16 rounding."""
    import softtokens.engine.decode_run as decode_run

    model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=3)
    setting = INFERENCE_SETTINGS[name]
    args = (_prompts(toy_rows["test"], 5, LONG_HEAD), setting, _sigma(setting), [7, 8, 9, 10, 11], 30, 4)

    def rollout():
        engine = _engine(model, toy_tokenizer, LONG_HEAD, check_every=5, fixed_shapes=True)
        engine.attention = "sdpa"
        return engine.generate(*args, answer_temperature=1.0)

    whole = rollout()
    monkeypatch.setattr(decode_run, "WINDOW_BUCKET", 16)
    windows = []
    real_steps = decode_run.DecodeRun.steps

    def spy(self, count):
        real_steps(self, count)
        windows.append(self.cache.window)

    monkeypatch.setattr(decode_run.DecodeRun, "steps", spy)
    bucketed = rollout()
    assert len(set(windows)) >= 3
    assert torch.equal(whole.step_ids, bucketed.step_ids) and torch.equal(whole.step_phase, bucketed.step_phase)
    assert whole.completions == bucketed.completions
    if whole.noisy_inputs is not None:
        torch.testing.assert_close(whole.noisy_inputs, bucketed.noisy_inputs, atol=1e-2, rtol=0)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("name", ["hard_sample", "soft_sample"])
def test_stream_with_refill_equals_one_batch(tiny_model, toy_tokenizer, toy_rows, name, head):
    """Nine jobs through 3 slots (refilled as rows finish, one at a time or two at a time; 2
    samples per problem) give each job the row it gets in one big batch; without refill too;
    with a shared prefix, prefilled once per call and read by every later admission."""
    setting, head = INFERENCE_SETTINGS[name], HEADS[head]
    prompts = [p for p in _prompts(toy_rows["test"], 5, head) for _ in range(2)][:9]
    seeds = list(range(100, 109))
    eng = _engine(tiny_model, toy_tokenizer, head)
    whole = eng.generate(prompts, setting, _sigma(setting), seeds, 20, 4)
    for refill, admit_min in ((True, 1), (True, 2), (False, None)):
        rows = list(eng.stream(prompts, seeds, setting, _sigma(setting), 20, 4, batch_size=3, refill=refill,
                               admit_min=admit_min))
        assert sorted(r.job for r in rows) == list(range(9))
        for r in rows:
            t = r.step_ids.shape[0]
            assert r.step_ids.tolist() == whole.step_ids[r.job, :t].tolist()
            assert (whole.step_phase[r.job, t:] == DONE).all()
            assert r.completion == whole.completions[r.job] and r.cot_text == whole.cot_texts[r.job]
            assert r.cot_len == int(whole.cot_len[r.job]) and r.stopped == bool(whole.stopped[r.job])
            torch.testing.assert_close(r.cot_entropy, whole.cot_entropy[r.job, :t], atol=1e-5, rtol=0)


@pytest.fixture
def stopper(tiny_model, toy_tokenizer):
    """The tiny model with an end-of-sequence logit large for about half the hidden states: its
    rows end at different steps."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        direction = torch.nn.functional.normalize(torch.randn(32, generator=torch.Generator().manual_seed(0)), dim=0)
        model.lm_head.weight[toy_tokenizer.eos_token_id] = 4.0 * direction
    return model


def test_refill_keeps_the_batch_full(stopper, toy_tokenizer, toy_rows):
    """Rows end at different steps; with refill the slots spend fewer decode steps idle (finished)
    and the stream takes fewer steps than waves of whole batches."""
    eng = CotEngine(stopper, toy_tokenizer)
    prompts, seeds = _prompts(toy_rows["test"], 12), list(range(12))
    stats = {}
    for refill in (True, False):
        rows = list(eng.stream(prompts, seeds, INFERENCE_SETTINGS["hard_sample"], 0.0, 12, 30,
                               answer_temperature=1.0, batch_size=4, refill=refill))
        assert len({r.step_ids.shape[0] for r in rows}) > 1  # rows really end at different steps
        stats[refill] = dict(eng.stream_stats)
    assert stats[True]["useful_steps"] == stats[False]["useful_steps"]
    assert stats[True]["decode_steps"] < stats[False]["decode_steps"]
    assert stats[True]["useful_steps"] / stats[True]["slot_steps"] > stats[False]["useful_steps"] / stats[False]["slot_steps"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_refill_admits_freed_slots_in_groups(stopper, toy_tokenizer, toy_rows, monkeypatch, dtype):
    """Each admission runs a prefill forward: by default a stream of batch 16 waits until 2 slots
    (an eighth) are free, or until every pending job fits, and admits them together. Fewer
    admissions than one per freed slot, every admission but the first of at least that size, and
    the same rows; in float32 and in the paper grid's bf16."""

    eng = CotEngine(stopper.to(dtype), toy_tokenizer)
    prompts, seeds = _prompts(toy_rows["train"], 40), list(range(40))
    sizes = []
    real = DecodeRun.admit

    def counting(run, slots, *args):
        sizes.append(len(slots))
        return real(run, slots, *args)

    monkeypatch.setattr(DecodeRun, "admit", counting)
    results, stats = {}, {}
    for admit_min in (1, None):
        sizes.clear()
        rows = list(eng.stream(prompts, seeds, INFERENCE_SETTINGS["hard_sample"], 0.0, 12, 30,
                               answer_temperature=1.0, batch_size=16, admit_min=admit_min))
        results[admit_min] = {r.job: r.step_ids.tolist() for r in rows}
        stats[admit_min] = (list(sizes), dict(eng.stream_stats))
    one_by_one, grouped = stats[1][0], stats[None][0]
    assert one_by_one[0] == grouped[0] == 16 and sum(one_by_one) == sum(grouped) == 40
    assert min(one_by_one[1:]) == 1  # rows do end one at a time here
    pending_after = [40 - sum(grouped[:i + 1]) for i in range(len(grouped))]
    assert all(size >= min(2, pending + size) for size, pending in zip(grouped[1:], pending_after[1:]))
    assert len(grouped) < len(one_by_one) and stats[None][1]["admissions"] == len(grouped)
    assert results[None] == results[1]


def test_stop_automaton_is_the_text_rule():
    """On random token pieces built from the stop text's characters, spaces and noise, the
    automaton's verdict after every token equals ``text.rstrip().endswith(STOP_TEXT)``."""
    rnd = random.Random(0)
    alphabet = list(set(STOP_TEXT)) + [" ", "\n", "\t", "x", ":", "\u00a0", "é"]
    pieces = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6))) for _ in range(300)]
    pieces += [STOP_TEXT, " " + STOP_TEXT, STOP_TEXT + "  ", "The", " final", " answer", " is", ":", " ", "is:"]
    rule = StopAutomaton(STOP_TEXT, pieces)
    hits = 0
    for trial in range(400):
        state, text = 0, ""
        for _ in range(rnd.randint(1, 30)):
            v = rnd.randrange(len(pieces)) if trial % 2 else rnd.randrange(len(pieces) - 10, len(pieces))
            state, text = int(rule.table[v, state]), text + pieces[v]
            assert rule.accepts(state) == ends_with_stop(text), repr(text)
            hits += rule.accepts(state)
    assert hits > 50


@pytest.mark.parametrize("attention", ["matmul", "sdpa", "flex"])
@pytest.mark.slow
def test_fast_step_has_no_host_work(tiny_model, toy_tokenizer, toy_rows, monkeypatch, attention):
    """The decode step traces as one graph (torch.compile fullgraph: any host sync, .item(),
    .tolist() or data-dependent Python branch would break it), which is what CUDA-graph capture needs.
    The CPU and the CUDA step run the same torch operations;
    with the fused attention ("sdpa") it is the GPU's step."""
    eng = CotEngine(tiny_model, toy_tokenizer, fixed_shapes=True)
    eng.attention = attention
    for name in ("soft_sample", "hard_sample"):
        setting = INFERENCE_SETTINGS[name]
        ids, mask = eng.encode_prompts(_prompts(toy_rows["test"], 2))
        with torch.no_grad():  # as generate decodes (FlexAttention has no CPU backward to trace)
            run = DecodeRun(eng, setting, _sigma(setting), 8, 3, 1.0, slots=2, max_prompt=ids.shape[1],
                            record_inputs=True)
            run.admit([0, 1], ids, mask, [1, 2])
            torch._dynamo.reset()
            step = torch.compile(run._step, fullgraph=True, backend="eager")
            for _ in range(3):
                step()
        assert (run.state.step_count == 3).all()


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("name", ["soft_sample", "fuzzy_sample", "hard_sample"])
def test_bf16_fast_engine_passes_the_paper_replay_bounds(toy_tokenizer, toy_rows, name, head):
    """The paper grid decodes in bfloat16 (compute_dtype) with this engine and replays with the
    HF forward: the replay residual and argmax mismatch stay inside the bounds training enforces
    (the schema's rl.replay_h0_gap_max, rl.replay_argmax_mismatch_max); also with the paper's preamble
    as a real tokenizer splits it (many tokens, shared and prefilled once)."""
    from softtokens.config.grids import PAPER_RL as rl

    setting = INFERENCE_SETTINGS[name]
    model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=4)
    sigma = 0.05 if setting.noise_factor else 1.0
    head = HEADS[head]
    rollout = _engine(model, toy_tokenizer, head).generate(_prompts(toy_rows["test"], 6, head), setting, sigma,
                                                           list(range(6)), 24, 5, answer_temperature=1.0)
    with torch.no_grad():
        replay = rollout_log_probs(model, rollout, sigma, 1.0, len(toy_tokenizer))
    assert replay.cot_steps > 0
    if setting.mode != "hard":
        assert rollout.noisy_inputs.dtype == torch.float32
        assert replay.h0_gap_sum / replay.h0_gap_steps <= rl["replay_h0_gap_max"]
    assert replay.argmax_mismatches / replay.cot_steps <= rl["replay_argmax_mismatch_max"]


def _peaked(toy_tokenizer, seed=8):
    """A tiny model whose attention is peaked and whose logits are large (the tiny test models'
    near-uniform attention and near-zero logits would hide an error of a tenth of a percent)."""
    model = copy.deepcopy(make_tiny_model(toy_tokenizer, seed=seed))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(12.0)
            layer.self_attn.k_proj.weight.mul_(12.0)
            layer.self_attn.v_proj.weight.mul_(20.0)
        model.lm_head.weight.mul_(50.0)
    return model


@torch.no_grad()
def test_shared_prefix_decode_is_the_whole_rows_attention(toy_tokenizer, toy_rows):
    """Logits after the prefill and after each decode step, with the prefix shared and without:
    the same to float32 rounding, on a model whose attention is peaked and whose logits are
    large (the tiny test models' near-uniform attention and near-zero logits would hide an error
    of a tenth of a percent in the prefix's share of a head's output)."""
    model = _peaked(toy_tokenizer)
    prompts = _prompts(toy_rows["test"], 4, LONG_HEAD)
    setting = INFERENCE_SETTINGS["soft_greedy"]
    runs = []
    for head in (LONG_HEAD, None):
        engine = CotEngine(model, toy_tokenizer, shared_prefix=head)
        ids, mask = engine.encode_prompts(prompts)
        shared = engine.shared_tokens([r[m.bool()].tolist() for r, m in zip(ids, mask)])
        run = DecodeRun(engine, setting, 0.0, 12, 3, 0.0, slots=4, max_prompt=ids.shape[1],
                                    record_inputs=True, shared=shared)
        run.admit(list(range(4)), ids, mask, [1, 2, 3, 4])
        runs.append((run, len(shared)))
    (a, shared_len), (b, none_len) = runs
    assert shared_len >= MIN_SHARED_TOKENS and none_len == 0
    for _ in range(6):
        scale = float(b.logits.abs().max())
        assert scale > 5.0  # logits large enough for the check to see a small error
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=2e-6 * scale)
        a.steps(1)
        b.steps(1)


@torch.no_grad()
@pytest.mark.parametrize("head", [LONG_HEAD, None])
@pytest.mark.parametrize("gpu_attention", ["sdpa", "flex"])
def test_gpu_decode_attention_equals_the_cpu_one(toy_tokenizer, toy_rows, head, gpu_attention, monkeypatch):
    """The GPU's decode step (fixed shapes, the fused attention kernel over each slot's whole row,
    shared-prefix columns read from the slot's own copy) against the CPU's (two matmuls and a
    float32 softmax, the prefix read once): the same logits to float32 rounding after the prefill
    and after every step, and the same tokens. Run here on the CPU's SDPA; a GPU runs the
    memory-efficient kernel (gpu-check compares it with the eager step and HF generate). FlexAttention
    (engine.flex_decode) the same, eager here: the lengths as a score_mod instead of the additive mask."""
    model = _peaked(toy_tokenizer)
    prompts = _prompts(toy_rows["test"], 4, head)
    setting = INFERENCE_SETTINGS["soft_greedy"]
    runs = []
    for attention, fixed in ((gpu_attention, True), ("matmul", False)):
        engine = _engine(model, toy_tokenizer, head, fixed_shapes=fixed)
        engine.attention = attention
        ids, mask = engine.encode_prompts(prompts)
        shared = engine.shared_tokens([r[m.bool()].tolist() for r, m in zip(ids, mask)])
        run = DecodeRun(engine, setting, 0.0, 12, 3, 0.0, slots=4, max_prompt=ids.shape[1],
                                    record_inputs=True, shared=shared)
        assert run.forward.attention == attention
        run.admit(list(range(4)), ids, mask, [1, 2, 3, 4])
        runs.append(run)
    a, b = runs
    assert a.cache.max_len % 16 == 0  # the fused kernel's mask rows are 16-byte aligned
    for _ in range(8):
        scale = float(b.logits.abs().max())
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=2e-6 * scale)
        a.steps(1)
        b.steps(1)
    assert torch.equal(a.record.ids[:, :8], b.record.ids[:, :8])
