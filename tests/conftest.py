"""Shared fixtures: a toy tokenizer and tiny Llama built in about a second, no download."""

import json
import os
from pathlib import Path

# The suite checks what CI checks, on the CPU. On a GPU machine the GPU is hidden (torch initialises
# CUDA lazily, so this holds although torch is imported below) unless SOFTTOKENS_TEST_DEVICE=cuda
# asks for it; the one-call verification of the GPU path is `softtokens gpu-check` (docs/gpu.md).
if os.environ.get("SOFTTOKENS_TEST_DEVICE", "cpu") != "cuda":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Tests run side by side (pytest-xdist workers, the tiny DAG's jobs): OpenMP threads that wait for
# work sleep instead of spinning on a core another process needs. Only the waiting changes, never
# how a sum is split, so the numbers are those of a serial run (set here, before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

from softtokens.data.prompt import PROMPT_HEAD
from softtokens.data.toy import toy_splits
from softtokens.engine.cot import MIN_SHARED_TOKENS
from softtokens.model.toy import (
    _segments,
    build_toy_model,
    build_toy_tokenizer,
    train_toy_tokenizer,
)

FAULTS = Path(__file__).resolve().parent / "faults"


# `make test` runs the suite on pytest-xdist workers, a module at a time (--dist loadscope: a module's
# fixtures are built once, e.g. test_paper_path's FSDP runs; the tiny DAG once a session for the modules that
# read it: tests/shared_dag.py). The longest modules go first, so that no worker is left with one at the end: the
# real SLURM test (mostly waiting on SLURM, so it overlaps with the rest), the real model's DAG, the tiny DAG; then,
# while the tiny DAG is built (about 3 minutes on a 2-core host), modules that do not read it, and its readers after
# them (a reader asked for first waits on the DAG's lock, a worker idle). The same order serves both tiers (the
# Makefile's test and test-slow): a module with no test in a tier drops out of its order.
FIRST = ("test_slurm.py", "test_real_model.py", "test_tiny_dag.py", "test_paper_path.py", "test_fast_engine.py",
         "test_first_day.py", "test_memory_trace.py", "test_reliability.py", "test_grading.py", "test_dag_faults.py",
         "test_dag_audit.py", "test_crate.py", "test_gpu_check.py", "test_workflow.py", "test_readme.py",
         "test_training.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        module = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
        return FIRST.index(module) if module in FIRST else len(FIRST)

    items.sort(key=rank)


THREADS = torch.get_num_threads()  # the worker's own, before any test


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A command run in process (cli.main) or a Trainer sets torch's thread count for the process;
    no test may inherit it (a float32 sum's order, hence its last bits, follows it). Set before each
    test too: a module's fixtures (a training run in process) are made before this one starts."""
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(THREADS)


def fault_env(fault: str, environ: dict | None = None) -> dict:
    """Environment for a child process (and everything it starts) in which training meets ``fault``
    (tests/faults/sitecustomize.py: crash_at_step=N, crash_in_save=N)."""
    environ = dict(os.environ if environ is None else environ)
    path = environ.get("PYTHONPATH")
    return {**environ, "SOFTTOKENS_TEST_FAULT": fault,
            "PYTHONPATH": str(FAULTS) + (os.pathsep + path if path else "")}


@pytest.fixture(scope="session")
def toy_rows():
    return toy_splits(300, 16, 16, seed=7)


@pytest.fixture(scope="session")
def toy_tokenizer(toy_rows):
    return build_toy_tokenizer(toy_rows["train"], 200)


@pytest.fixture(scope="session")
def preamble_tokenizer(toy_rows):
    """The toy BPE without its one-token preamble: the paper's instruction is ~90 tokens, as a real
    tokenizer splits it (Llama-3's: ~75), so the engine's shared-prefix path runs."""
    tok = train_toy_tokenizer(["".join(_segments(r)) for r in toy_rows["train"]], 384)
    assert len(tok(PROMPT_HEAD)["input_ids"]) >= 2 * MIN_SHARED_TOKENS
    return tok


def make_tiny_model(tokenizer, dtype=torch.float32, seed=0, hidden=32, layers=2):
    model = build_toy_model(len(tokenizer), hidden, layers, 2, 64, tokenizer.pad_token_id, tokenizer.eos_token_id,
                            tokenizer.bos_token_id, seed)
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_model(toy_tokenizer):
    return make_tiny_model(toy_tokenizer)


@pytest.fixture(scope="module")
def base(tmp_path_factory, toy_tokenizer, toy_rows):
    """A tiny base model saved like a hub model, and the toy train / validation rows as JSONL."""
    d = tmp_path_factory.mktemp("base")
    make_tiny_model(toy_tokenizer, seed=1).save_pretrained(d / "model")
    toy_tokenizer.save_pretrained(d / "model")
    for split in ("train", "validation"):
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in toy_rows[split]))
    return d


def assert_same_loss_and_gradients(model, rollout, sigma, reference, adv):
    """The update pass's per-row log-probs and the RLOO loss's gradients equal those of
    ``reference(model, rollout, sigma, answer_temperature)``, a step-by-step computation."""
    from softtokens.train.rloo import rloo_loss, rollout_log_probs

    n = len(adv)
    model.zero_grad()
    cot, ans = rollout_log_probs(model, rollout, sigma, 1.0)[:2]
    rloo_loss(cot + ans, adv, n).backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    ref = reference(model, rollout, sigma, 1.0)
    assert torch.allclose(cot + ans, ref, rtol=1e-9, atol=1e-8)
    rloo_loss(ref, adv, n).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(ours[name], p.grad, rtol=1e-6, atol=1e-7 * p.grad.abs().max().item() + 1e-12), name
    model.zero_grad()


def stepwise(model, rollout, i):
    """Row ``i`` of a recorded rollout, step by step, with a fresh cache-less forward over its
    unpadded prefix (the definition: no batching, padding or slicing tricks): yields (step, phase,
    token fed, final hidden state before that step). Soft / fuzzy CoT steps feed the recorded
    input, every other step its token's embedding."""
    from softtokens.engine.rollout import COT

    emb = model.get_input_embeddings()
    inputs = [emb(rollout.prompt_ids[i][rollout.prompt_mask[i].bool()])]
    for s in range(rollout.step_ids.shape[1]):
        x = torch.cat(inputs, 0).unsqueeze(0)
        h = model.model(inputs_embeds=x, attention_mask=torch.ones(x.shape[:2], dtype=torch.long)).last_hidden_state
        phase, tok = int(rollout.step_phase[i, s]), rollout.step_ids[i, s]
        yield s, phase, tok, h[0, -1]
        if phase == COT and rollout.setting.mode != "hard":
            inputs.append(rollout.noisy_inputs[i, s].unsqueeze(0).to(emb.weight.dtype))
        else:
            inputs.append(emb(tok.view(1)))


def identified(prov, path, doc: dict) -> dict:
    """An evaluation document as its job writes it (commands.evaluate): ``doc`` with the identity of the file at
    ``path`` (store.eval_identity; outside the results layout, a base model's on a benchmark of the file's directory)
    and its record embedded, written as ``path``."""
    from softtokens.store.eval_identity import LOGLIK, eval_identity, expected_identity

    path = Path(path)
    try:
        want = expected_identity(path)
    except (ValueError, IndexError):
        want = {"model": "m", "trained": "base", "benchmark": path.parent.name or "b",
                "setting": doc.get("setting", LOGLIK if path.stem == LOGLIK else "hard_greedy")}
    setting = want["setting"]
    params = {"protocol": doc.get("protocol", "cloze")} if setting == LOGLIK else {"temperature": 0.0}
    data = (prov.inputs.get("data") or {}).get("sha256", "-")
    ids = [r.get("id") for r in doc.get("problems") or []]
    extra = {"protocol": params["protocol"]} if setting == LOGLIK else {"setting": setting}
    ident = eval_identity(want["model"], want["trained"], want["benchmark"], setting, params, data, ids)
    return prov.embedded({**extra, **doc, "identity": ident}, path)


@pytest.fixture(scope="module")
def dag(tmp_path_factory):
    """The session's tiny toy DAG (tests/shared_dag.py: built once, by whichever module asks first); read only: a
    test that changes it works on ``shared_dag.copy_of(dag, tmp_path)``."""
    from shared_dag import tiny_dag

    return tiny_dag(tmp_path_factory)
