"""`softtokens gpu-check` and the GPU-only paths it verifies, as far as a CPU can run them: the
command's smoke mode end to end (what CI runs, so the command cannot rot), the fused bf16 ->
float32 head with the CUDA GEMM emulated, the one-process-per-GPU rule, and the check's own
judgement (docs/gpu.md lists what only a GPU can show)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model

from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS
from softtokens.model import head as modeling
from softtokens.model.head import Float32Head

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The command as CI runs it, in this process (cli.main) from the repository root."""
    from softtokens.cli import main

    out = tmp_path_factory.mktemp("gpu-check")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        rc = main(["gpu-check", "--smoke", "--out", str(out), "--modes", "soft,hard"])
    return rc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


@pytest.mark.slow
def test_smoke_runs_every_section_and_passes(smoke):
    rc, report, summary = smoke
    assert rc == 0, summary
    assert report["passed"] is True and report["failed"] == []
    assert summary.startswith("# gpu-check: PASSED")
    for key in ("device", "torch", "cuda", "transformers", "model", "parameters", "compute_dtype", "random_model"):
        assert key in report
    assert report["compute_dtype"] == "bfloat16"  # the paper grid's, read from config.yaml
    assert report["random_model"]["entropy_nats"] == pytest.approx(1.0, abs=0.05)
    names = {c["check"] for c in report["checks"]}
    assert "hard greedy tokens equal HF generate (float32)" in names
    assert any("captured in a CUDA graph" in n for n in names)  # n/a on a CPU, present all the same
    assert {c["passed"] for c in report["checks"] if "CUDA graph" in c["check"]} == {None}


@pytest.mark.slow
def test_smoke_measures_what_the_issue_asks(smoke):
    _, report, _ = smoke
    engine = report["sections"]["engine"]
    assert set(engine["settings"]) == set(INFERENCE_SETTINGS)
    for row in engine["settings"].values():
        assert row["ms_per_step"] > 0 and row["bound_ms_per_step"] > 0 and row["graph"] == "not on CUDA"
    assert engine["noise"]["energy_per_dim"] == pytest.approx(1.0, abs=0.25)
    ab = engine["attention_ab"]  # the GPU attentions side by side (here the CPU's SDPA and eager FlexAttention)
    assert ab["sdpa"]["ms_per_step"] > 0 and ab["flex"]["ms_per_step"] > 0 and ab["flex"]["token_agreement"] == 1.0
    evaluation = report["sections"]["evaluation"]
    assert set(evaluation["settings"]) == set(INFERENCE_SETTINGS) and evaluation["loglik"]["rows"] > 0
    modes = report["sections"]["training"]["modes"]
    assert set(modes) == {"soft", "hard"}
    for mode, result in modes.items():
        assert len(result["steps"]) == 2
        for step in result["steps"]:
            assert step["seconds_rollout"] > 0 and step["seconds_update"] > 0
            assert step["reward_std"] >= 0 and step["replay_argmax_mismatch"] is not None
        assert "planned_GB" in result["memory"]
    assert modes["soft"]["master_moved"]["share"] >= 0.99
    assert any(s["reward_std"] > 0 for s in modes["soft"]["steps"])  # the stand-in grader gives a gradient
    # what the cost forecast reads: decode steps at the rows one GPU decodes, the update per micro-batch
    curve = engine["decode_curve"]
    assert [p["rows"] for p in curve] == [2, 4]
    assert all(set(p["ms_per_step"]) == {"hard_sample", "soft_sample"} and min(p["ms_per_step"].values()) > 0
               for p in curve)
    for result in modes.values():
        step = result["steps"][-1]
        assert step["micro_batches"] == 2 and step["update_tokens"] > 0
        assert step["seconds_update_per_micro_batch"] == pytest.approx(step["seconds_update"] / 2, abs=2e-3)
    # one update under the profiler: where its time goes, its host reads (the sums, once), its FLOP rate,
    # the forecast of its shape beside it
    prof = modes["soft"]["update_profile"]
    assert prof["host_reads"] <= 1 and prof["micro_batches"] == 2 and prof["optimizer"] == "fused"
    assert prof["tflops"] > 0 and prof["forecast_seconds"] > 0 and prof["top_kernels"]
    assert any(c["check"].startswith("soft: host reads in one update's loss pass") and c["passed"]
               for c in report["checks"])
    # and the forecast reads the report it wrote (a line through the smoke's two row counts)
    from softtokens.cost.forecast import throughput_from_gpu_check

    rates = throughput_from_gpu_check(report)
    assert set(rates.decode) == {"hard", "soft", "fuzzy"} and set(rates.update) == {"soft", "hard", "fuzzy"}
    assert rates.update["fuzzy"] == rates.update["soft"] and "fuzzy training from soft's" in rates.source
    assert all(c.fixed_s >= 0 and c.per_row_s >= 0 for c in rates.decode.values())


def test_gpu_check_needs_no_math_verify():
    """The device image has no math-verify: neither the check nor the training it drives imports it."""
    code = ("import sys, softtokens.gpucheck.run, softtokens.train.loop, softtokens.eval.math_eval; "
            "print('math_verify' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_a_failed_check_fails_the_report(tmp_path):
    from softtokens.gpucheck.shape import Report

    meta = {"device": {"name": "x"}, "torch": "t", "cuda": None, "transformers": "t", "model": "m",
            "parameters": 1, "compute_dtype": "bfloat16", "date": "d"}
    report = Report(tmp_path, meta)
    report.check("engine", "a", True, 1)
    report.check("engine", "b", None, "n/a")
    assert report.passed
    report.check("training", "c", False, 2.6, "<= 1.5")
    report.write()
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["passed"] is False and written["failed"] == ["training: c"]
    assert "**FAIL**" in (tmp_path / "gpu_check.md").read_text()


def _cuda_mm(monkeypatch):
    """torch.mm with out_dtype, as CUDA has it: bf16 products are exact in float32, summed in float32."""
    mm = torch.mm

    def fake(a, b, *, out_dtype=None):
        if out_dtype is None:
            return mm(a, b)
        assert a.dtype == b.dtype == torch.bfloat16 and out_dtype == torch.float32
        return mm(a.float(), b.float())

    monkeypatch.setattr(torch, "mm", fake)
    monkeypatch.setattr(modeling, "fused_wide_matmul", lambda device: True)


@torch.no_grad()
def test_fused_head_equals_float32_copies(monkeypatch, toy_tokenizer):
    """On CUDA the engine reads the bf16 W and E as they are (one GEMM with a float32 result): its
    logits equal the float32-copy path's; its mixtures of float32 weights (split into their bf16
    rounding plus remainder) are within 1e-4 of them, far below the noise sigma."""
    model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=2)
    copies = Float32Head(model, len(toy_tokenizer), with_input=True)
    assert not copies.fused  # a CPU has no such kernel
    _cuda_mm(monkeypatch)
    fused = Float32Head(model, len(toy_tokenizer), with_input=True)
    assert fused.fused and fused.W.dtype == torch.bfloat16 and fused.dtype == torch.float32
    hidden = torch.randn(5, model.config.hidden_size).bfloat16()
    torch.testing.assert_close(fused.logits(hidden), copies.logits(hidden), rtol=0, atol=1e-6)
    hidden32 = torch.randn(5, model.config.hidden_size)  # a noised float32 hidden state (hidden placement)
    torch.testing.assert_close(fused.logits(hidden32), copies.logits(hidden32), rtol=1e-4, atol=1e-4)
    probs = torch.softmax(torch.randn(5, len(toy_tokenizer)) * 3, -1)
    scale = float(copies.mixture(probs).abs().max())
    torch.testing.assert_close(fused.mixture(probs), copies.mixture(probs), rtol=0, atol=1e-4 * scale)
    with pytest.raises(AssertionError):  # without the remainder the bf16 rounding of p shows
        torch.testing.assert_close(probs.bfloat16().float() @ copies.E, copies.mixture(probs), rtol=0,
                                   atol=1e-4 * scale)


def test_engine_with_the_fused_head_decodes_as_with_copies(monkeypatch, toy_tokenizer, toy_rows):
    """A whole bf16 rollout through the fused head takes the same tokens as through float32 copies."""
    from softtokens.data.prompt import format_prompt

    model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=2)
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    args = (prompts, INFERENCE_SETTINGS["fuzzy_greedy"], 0.0, [1, 2, 3], 12, 3)
    plain = CotEngine(model, toy_tokenizer).generate(*args)
    _cuda_mm(monkeypatch)
    fused = CotEngine(model, toy_tokenizer).generate(*args)
    assert torch.equal(plain.step_ids, fused.step_ids)
    torch.testing.assert_close(plain.noisy_inputs, fused.noisy_inputs, rtol=0, atol=1e-3)


def test_one_process_per_gpu(monkeypatch):
    """Two processes on a node with one visible GPU: a clear error before NCCL's vague one."""
    from softtokens.train.distributed import DataParallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match="1 GPU\\(s\\) visible: launch one process per GPU"):
        DataParallel()


@pytest.mark.parametrize("name", ["fuzzy_sample", "soft_sample", "hard_sample"])
def test_update_pass_with_bf16_gemms_equals_float32_copies(monkeypatch, toy_tokenizer, toy_rows, name):
    """The update pass's head and mixture as bf16 GEMMs with float32 results, forward and backward
    (model.head.WideMatmul; CUDA's kernel emulated on the CPU) against the float32 copies of W and E:
    the same log-probabilities and gradients to bf16's rounding of the float32 operands' remainders."""
    from softtokens.data.prompt import format_prompt
    from softtokens.model.head import ReplayHead
    from softtokens.train.rloo import rollout_log_probs

    model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=4)
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:3]]
    setting = INFERENCE_SETTINGS[name]
    rollout = CotEngine(model, toy_tokenizer).generate(prompts, setting, 0.05 if setting.noise_factor else 0.0,
                                                       [1, 2, 3], 10, 3, answer_temperature=1.0)
    results = {}
    for fused in (False, True):
        if fused:
            _cuda_mm(monkeypatch)
        assert ReplayHead(model, len(toy_tokenizer)).fused == fused
        model.zero_grad()
        out = rollout_log_probs(model, rollout, 0.05, 1.0, len(toy_tokenizer))
        (out.cot.sum() + out.answer.sum()).backward()
        results[fused] = (out.cot.detach(), out.answer.detach(),
                          {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
    (cot0, ans0, g0), (cot1, ans1, g1) = results[False], results[True]
    torch.testing.assert_close(cot1, cot0, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ans1, ans0, rtol=1e-4, atol=1e-3)
    assert set(g0) == set(g1)
    for n in g0:
        scale = float(g0[n].abs().max()) + 1e-12
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=2e-2 * scale, msg=n)


def test_wide_matmul_gradients_by_hand(monkeypatch):
    """a @ b and its two gradients from bf16 GEMMs: a float32 operand keeps ~16 bits through its remainder."""
    from softtokens.model.head import WideMatmul, wide_mm

    _cuda_mm(monkeypatch)
    torch.manual_seed(0)
    a = torch.randn(6, 5, requires_grad=True)                 # float32: split into bf16 + remainder
    b = torch.randn(5, 4).bfloat16().requires_grad_(True)     # bf16 as it is
    out = WideMatmul.apply(a, b)
    assert out.dtype == torch.float32
    ref = a.detach() @ b.detach().float()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)
    grad = torch.randn(6, 4)
    out.backward(grad)
    torch.testing.assert_close(a.grad, grad @ b.detach().float().T, rtol=0, atol=1e-3)
    assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.bfloat16
    torch.testing.assert_close(b.grad.float(), (a.detach().T @ grad).bfloat16().float(), rtol=1e-2, atol=1e-2)
    both = wide_mm(torch.randn(3, 5), torch.randn(5, 2))   # both float32: a and its remainder in one GEMM, b's remainder in another
    assert both.dtype == torch.float32


def test_the_papers_sizes_refuse_to_run_without_a_gpu(tmp_path, capsys):
    """Without a CUDA device (this machine, CI), gpu-check at the paper's sizes stops at once, says
    why and what to run instead, and writes no report that could read as passed."""
    from softtokens.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["gpu-check", "--out", str(tmp_path / "gc")])
    assert stop.value.code != 0 and "no CUDA device here" in str(stop.value.code) and "--smoke" in str(stop.value.code)
    with pytest.raises(SystemExit, match="--device cpu"):
        main(["gpu-check", "--out", str(tmp_path / "gc"), "--device", "cpu"])
    assert not (tmp_path / "gc").exists()


def test_a_report_that_checked_nothing_has_not_passed(tmp_path):
    from softtokens.gpucheck.shape import Report

    meta = {"device": {"name": "x"}, "torch": "t", "cuda": None, "transformers": "t", "model": "m",
            "parameters": 1, "compute_dtype": "bfloat16", "date": "d"}
    report = Report(tmp_path, meta)
    assert not report.passed and report.summary().startswith("# gpu-check: FAILED: no check applied")
    report.check("engine", "CUDA graph", None, "no CUDA device")
    assert not report.passed   # only checks that do not apply here
    report.check("engine", "tokens equal", True)
    assert report.passed



# ---------------------------------------------------------------- a GPU session that cannot return empty
def _interrupted(tmp_path, args: list[str], marker: str, point: str):
    """gpu-check --smoke in a process of its own, SIGTERM sent once ``marker`` is printed: what it left."""
    import os
    import signal
    import time

    out, work = tmp_path / "gc", tmp_path / "work"
    (work / "left-by-an-earlier-run").mkdir(parents=True)   # --work-dir is emptied at the start
    proc = subprocess.Popen([sys.executable, "-m", "softtokens", "gpu-check", "--smoke", "--out", str(out),
                             "--work-dir", str(work), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen, deadline = [], time.monotonic() + 300
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            proc.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(seen[-20:])
    rest = proc.communicate(timeout=120)[0]
    print(f"interrupted {point}: at '{marker.strip()}', rc {proc.returncode}")
    return proc.returncode, json.loads((out / "gpu_check.json").read_text()), work, "".join(seen) + rest


@pytest.mark.parametrize("point,args,marker,section", [
    ("during the engine section", [], "[gpu-check] engine hard_greedy:", "engine"),
    ("mid-training", ["--modes", "soft,hard"], "[gpu-check] training soft step 1:", "training"),
    ("during the head-loss A/B", ["--speed"], "section 3 of 3: head_loss", "head_loss"),
])
@pytest.mark.slow
def test_a_cut_gpu_check_leaves_a_valid_partial_report_and_no_work_dir(tmp_path, point, args, marker, section):
    """The rehearsal of a lease cut at any second: SIGTERM at three points of a run; each time the JSON is
    whole, says it is incomplete and where it stopped, the forecast's refit reads it and names what it lacks,
    and the work directory holds nothing (its clean-up ran)."""
    from softtokens.rates.throughput import missing_parts, throughput_from_gpu_check

    rc, report, work, log = _interrupted(tmp_path, args, marker, point)
    assert rc == 130, log[-3000:]
    assert report["complete"] is False and report["interrupted"] == f"SIGTERM during {section}", report.get("interrupted")
    assert list(work.iterdir()) == [], list(work.iterdir())
    lacking = missing_parts(report)
    assert lacking and any("not marked complete" in m or "SIGTERM" in m for m in lacking)
    assert f"the forecast's refit from this file lacks: {'; '.join(lacking)}" in log   # said where it is made
    rates = throughput_from_gpu_check(report)   # never a KeyError: what is not there is borrowed, and named
    assert set(rates.update) == {"hard", "soft", "fuzzy"} and "from the default rates" in rates.source


def test_the_session_stops_at_once_without_its_wheels(tmp_path):
    """`bash benchmarks/device/session.sh` where .whl/ is empty: non-zero within 30 s, before building anything."""
    import os
    import shutil
    import time

    copy = tmp_path / "repo"
    (copy / "benchmarks" / "device").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks/device/session.sh", copy / "benchmarks/device/session.sh")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "benchmarks/device/session.sh"], cwd=copy, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "OUT": str(tmp_path / "out")})
    assert proc.returncode != 0 and time.monotonic() - t0 < 30
    assert "no wheels in .whl/" in proc.stderr
