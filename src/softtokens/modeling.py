"""Load a causal LM and its tokenizer (hub id or local directory, the same code path), the
embedding scale that sets the soft-token noise, and the toy Llama built from scratch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class EmbeddingScale:
    """Scale of the input embedding matrix E (V x d), computed once per model.

    rms_norm: sqrt(mean_i ||e_i||^2), the root-mean-square token-embedding norm.
    rms_coordinate: sqrt(mean_ij E_ij^2) = rms_norm / sqrt(d).

    The paper sets sigma = 0.33 x 'the root-mean-square norm of the token embeddings, so that
    the noise is comparable but a bit smaller than the embeddings'. Isotropic noise of
    per-coordinate std sigma has norm ~ sigma sqrt(d); it is 'a bit smaller than the
    embeddings' only if sigma = gamma * rms_coordinate (noise norm ~ gamma * rms_norm).
    We use that reading; rms_norm is recorded beside it."""

    rms_norm: float
    rms_coordinate: float
    rows: int
    dim: int
    # the scales of the other noise placements (README, "Noise placements"); None in states saved
    # before they existed, which only embedding runs can have
    final_norm_rms: float | None = None   # RMS of the final norm's weight g: a normed hidden state's RMS
    head_rms_coordinate: float | None = None  # sqrt(mean_ij W_ij^2) of the output projection

    def sigma(self, noise_factor: float, placement: str = "embedding") -> float:
        """sigma of the Gaussian noise for a placement (gamma = noise_factor):
        - embedding: gamma * RMS coordinate of E (the paper's rule, read as above);
        - hidden: gamma * RMS(g), g the final norm's weight: the final hidden state is RMS-normed
          then scaled by g, so RMS(g) is its per-coordinate RMS, as RMS(E) is the embeddings';
        - logits: the hidden rule carried through the head, made isotropic: sigma_hidden x sqrt(d) x
          RMS(W) is the std that hidden noise induces on a typical logit (a row of W has norm
          ~ sqrt(d) RMS(W)). Top-k noise uses the same sigma on its k logits."""
        if placement == "embedding":
            return noise_factor * self.rms_coordinate
        if self.final_norm_rms is None or self.head_rms_coordinate is None:
            raise ValueError(f"noise placement {placement!r} needs the final norm and output head scales; this "
                             "embedding scale was recorded without them")
        if placement == "hidden":
            return noise_factor * self.final_norm_rms
        if placement == "logits":
            return noise_factor * self.final_norm_rms * self.dim ** 0.5 * self.head_rms_coordinate
        raise ValueError(f"unknown noise placement {placement!r}")

    def as_dict(self) -> dict:
        return {"rms_norm": self.rms_norm, "rms_coordinate": self.rms_coordinate, "rows": self.rows, "dim": self.dim,
                "final_norm_rms": self.final_norm_rms, "head_rms_coordinate": self.head_rms_coordinate}


@torch.no_grad()
def embedding_scale(model, vocab_rows: int | None = None) -> EmbeddingScale:
    """RMS of the rows of E that are real tokens (vocab_rows; Qwen pads E past its tokenizer)."""
    emb = model.get_input_embeddings().weight
    rows = emb[: vocab_rows or emb.shape[0]].float()
    ms_norm = rows.pow(2).sum(-1).mean().item()
    head = model.get_output_embeddings().weight[: rows.shape[0]].float()
    norm = getattr(model.get_decoder(), "norm", None)
    norm_w = getattr(norm, "weight", None)
    return EmbeddingScale(rms_norm=ms_norm ** 0.5, rms_coordinate=(ms_norm / rows.shape[1]) ** 0.5,
                          rows=rows.shape[0], dim=rows.shape[1],
                          final_norm_rms=None if norm_w is None else norm_w.float().pow(2).mean().sqrt().item(),
                          head_rms_coordinate=head.pow(2).mean().sqrt().item())


def noise_scale(model_path: str | Path, model, vocab_rows: int | None = None) -> tuple[EmbeddingScale, str]:
    """The embedding scale that sets sigma for a model, and where it came from.

    The rule, the same for training rollouts and test evaluation: sigma comes from the
    *base* model's E. A training checkpoint records its base's scale in trainer_state.json (fixed
    at the start of the run, kept across resumes); a base model (hub id or local directory
    without that record) is measured. So every model of a family decodes with the noise level
    its training used, and a table compares weights, not noise levels."""
    state = Path(model_path) / "trainer_state.json"
    if state.is_file():
        recorded = json.loads(state.read_text()).get("embedding_scale")
        if recorded:
            return EmbeddingScale(**recorded), "base model's E (recorded in the checkpoint's trainer_state.json)"
    return embedding_scale(model, vocab_rows), "this base model's E"


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load the tokenizer of {str(name_or_path)!r}: {err}. A hub id needs the network "
                             "or a filled HF cache; set the model's `source:` to a local directory otherwise.") from None
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str | Path, dtype: str = "float32", device: str | torch.device = "cpu"):
    """A causal LM from a hub id (e.g. meta-llama/Llama-3.2-3B-Instruct) or a local directory
    written by save_pretrained; the toy base and every checkpoint load through here."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=DTYPES[dtype])
    except OSError as err:  # a missing or unreadable directory, an id the hub cannot serve (offline)
        raise ModelLoadError(f"cannot load the model {str(name_or_path)!r}: {err}. A hub id needs the network or "
                             "a filled HF cache (HF_HOME); on a node without internet, set the model's `source:` in "
                             "config.yaml to a local directory written by save_pretrained.") from None
    except Exception as err:  # a damaged weights file (safetensors: "incomplete metadata", ...)
        raise ModelLoadError(f"cannot load the model {str(name_or_path)!r}: {type(err).__name__}: {err} "
                             "(a truncated or damaged weights file?)") from None
    return model.to(device)


class ModelLoadError(OSError):
    """A base model or checkpoint that cannot be read: the message names it and what to do."""


def check_plain_output_head(model) -> None:
    """The engine and the replay compute logits themselves (``output_logits``), so a model whose
    head does more than ``hidden @ W.T`` (soft-capping, a logit scale) would be silently mis-read."""
    cfg = model.config
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(cfg, key, None) not in (None, 1, 1.0):
            raise ValueError(f"{type(model).__name__}: config.{key}={getattr(cfg, key)!r}; the output head must be "
                             "a plain projection (hidden @ W.T), as in Llama and Qwen2")


def decoder_hidden(model, **inputs) -> torch.Tensor:
    """Last hidden states of the decoder stack (after its final norm), without the vocabulary
    projection, which ``output_logits`` does in float32."""
    return model.get_decoder()(**inputs).last_hidden_state


def float32_weights(model, vocab_rows: int | None = None, with_input: bool = False):
    """The output projection W[:vocab_rows] and, for the soft mixture, E[:vocab_rows], widened to
    at least float32 once per call site; a tied model gets one copy for both (a float32 copy of a
    128k x 3k matrix is 1.5 GB, and under autograd its gradient is another). float64 stays float64
    (gradient checks). Rows past ``vocab_rows`` (Qwen pads E) are never used."""
    W = model.get_output_embeddings().weight
    rows = vocab_rows or W.shape[0]
    wide = torch.promote_types(W.dtype, torch.float32)
    W32 = W[:rows].to(wide)
    if not with_input:
        return W32, None
    E = model.get_input_embeddings().weight
    return W32, (W32 if E.data_ptr() == W.data_ptr() else E[:rows].to(wide))


def output_logits(model, hidden: torch.Tensor, vocab_rows: int | None = None,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """Logits in float32 from (bf16) hidden states: ``hidden.float() @ W[:vocab_rows].float().T``
    (``weight``: that widened W, from float32_weights, when the caller already has it).

    Every product of two bf16 numbers is exact in float32 and the sum is accumulated and kept in
    float32, so the logits are not rounded to bf16's 8 significant bits. That matters for fuzzy
    tokens (tau = 1e-4): bf16 logits of magnitude 16-32 are spaced 0.125 apart, so two candidate
    tokens either tie exactly (a 50/50 mixture whose replay may not tie) or differ by >= 1250 tau
    (a one-hot); see README, "Precision and sharding"."""
    if weight is None:
        weight = float32_weights(model, vocab_rows)[0]
    return hidden.to(weight.dtype) @ weight.T


_FUSED_OK: dict[str, bool] = {}


def fused_wide_matmul(device: torch.device) -> bool:
    """Whether this device multiplies bf16 / fp16 matrices into a float32 result in one GEMM
    (``torch.mm(..., out_dtype=torch.float32)``: CUDA in recent torch; CPUs have no kernel). Probed
    once per device type; a torch without it answers False and callers keep float32 copies."""
    key = str(torch.device(device).type)
    if key not in _FUSED_OK:
        ok = False
        if key == "cuda":
            try:
                a = torch.ones(2, 8, dtype=torch.bfloat16, device=device)
                ok = bool(torch.mm(a, a.T, out_dtype=torch.float32).dtype == torch.float32)
            except (RuntimeError, TypeError, NotImplementedError):
                ok = False
        _FUSED_OK[key] = ok
    return _FUSED_OK[key]


def _mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, k) @ (k, m) -> float32, b in bf16 / fp16, one fused GEMM (fused_wide_matmul). An ``a``
    wider than ``b`` (float32 probabilities, a noised float32 hidden state) is split into its
    rounding to b's dtype plus the remainder, both multiplied in the one GEMM: the result carries
    ~16 bits of a's mantissa instead of 8 (relative error ~2^-17 per term), and each product is
    exact and summed in float32."""
    if a.dtype == b.dtype:
        return torch.mm(a, b, out_dtype=torch.float32)
    hi = a.to(b.dtype)
    lo = (a - hi.to(a.dtype)).to(b.dtype)
    both = torch.mm(torch.cat((hi, lo)), b, out_dtype=torch.float32)  # (2n, m)
    return both[: a.shape[0]] + both[a.shape[0]:]


class Float32Head:
    """The output projection and the soft mixture with float32 results, for decoding (no autograd).

    ``logits(hidden)`` = hidden @ W[:rows].T and ``mixture(p)`` = p @ E[:rows], both float32.
    Where the device has a fused bf16 -> float32 GEMM (CUDA), they read the bf16 W and E as they
    are: no float32 copy of a 128k x 3k matrix (1.5 GB, read at every decode step at twice the
    bytes). Elsewhere (CPU, float32 models) W and E are widened once, as ``float32_weights`` does;
    the CPU's numbers are unchanged by this class."""

    def __init__(self, model, vocab_rows: int | None = None, with_input: bool = False):
        W = model.get_output_embeddings().weight
        rows = vocab_rows or W.shape[0]
        self.fused = W.dtype in (torch.bfloat16, torch.float16) and fused_wide_matmul(W.device)
        if self.fused:
            E = model.get_input_embeddings().weight if with_input else None
            self.W, self.E = W[:rows], (None if E is None else E[:rows])
        else:
            self.W, self.E = float32_weights(model, vocab_rows, with_input)
        self.dtype = torch.float32 if self.fused else self.W.dtype  # of the results

    @property
    def path(self) -> str:
        return "fused bf16 GEMM, float32 output" if self.fused else f"{self.W.dtype} copies of W and E"

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., V) float32 logits."""
        if self.fused:
            flat = hidden.reshape(-1, hidden.shape[-1])
            return _mm_float32(flat, self.W.T).view(*hidden.shape[:-1], -1)
        return hidden.to(self.W.dtype) @ self.W.T

    def mixture(self, probs: torch.Tensor) -> torch.Tensor:
        """(N, V) float32 weights -> (N, d) float32 p @ E."""
        if self.fused:
            return _mm_float32(probs, self.E)
        return probs.to(self.E.dtype) @ self.E


def hub_revision(model) -> str | None:
    """The hub commit a model was loaded from (None for a local directory), for provenance:
    a hub id alone does not say which weights were used."""
    return getattr(model.config, "_commit_hash", None)


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------- toy model
SPECIAL_TOKENS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>"}


def train_toy_tokenizer(texts: list[str], vocab_size: int, whole_phrases: tuple[str, ...] = ()):
    """Byte-level BPE trained on the toy corpus, digits split one per token (arithmetic needs
    it) and merges allowed across spaces, wrapped as a left-padding PreTrainedTokenizerFast.

    ``whole_phrases`` become single tokens (the paper's constant prompt preamble): the text the
    model reads is unchanged, but a tiny model on 2 CPU cores need not attend over 120 tokens
    of boilerplate at every step."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in whole_phrases])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL_TOKENS["pad"],
                                   eos_token=SPECIAL_TOKENS["eos"], bos_token=SPECIAL_TOKENS["bos"],
                                   padding_side="left")


def build_toy_model(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                    intermediate_size: int, pad_id: int, eos_id: int, bos_id: int, seed: int,
                    max_positions: int = 512):
    """A tiny Llama with tied embeddings (like Llama-3.2-3B), randomly initialised."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                      num_attention_heads=num_heads, num_key_value_heads=num_heads,
                      intermediate_size=intermediate_size, max_position_embeddings=max_positions,
                      tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id,
                      bos_token_id=bos_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)
