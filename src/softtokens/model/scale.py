"""Load a causal LM and its tokenizer (hub id or local directory, the same code path), the
embedding scale that sets the soft-token noise, and the toy Llama built from scratch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from softtokens.model.checkpoint import TrainerState


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
    # the scales of the other noise placements (docs/ablations.md, "Noise placements"); None in states saved
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
    if TrainerState.exists(model_path):
        recorded = TrainerState.read(model_path).embedding_scale
        return EmbeddingScale(**recorded), "base model's E (recorded in the checkpoint's trainer_state.json)"
    return embedding_scale(model, vocab_rows), "this base model's E"
