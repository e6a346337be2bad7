"""How a CoT is decoded: the mode, temperature and noise of each of the six inference settings
(Section 4), and where a soft / fuzzy step's noise goes. Derived from a config's CoT keys in
one function, so that training rollouts, greedy validation and evaluation cannot disagree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from softtokens.config.grids import PAPER_RL
from softtokens.config.names import CONTINUOUS_MODES, COT_KEYS, PLACEMENTS, SETTINGS


class CotSetting(NamedTuple):
    """How the CoT is decoded."""

    mode: str            # "hard" | "soft" | "fuzzy"
    temperature: float   # CoT softmax temperature; 0 = argmax (hard greedy)
    noise_factor: float  # gamma; sigma = gamma * embedding RMS; 0 = no noise


class Placement(NamedTuple):
    """Where a soft / fuzzy CoT step's Gaussian noise goes (Appendix "Noise placement";
    docs/ablations.md). With p = softmax(z / tau) and the next input p @ E:
    - embedding (the paper's method): z = logits; input = p @ E + sigma N(0, I_d);
    - hidden: z = W (h + sigma N(0, I_d)), h the final hidden state before the output head; the
      input is the clean mixture of that noised distribution;
    - logits: z = logits + sigma N(0, I_V); with top_k > 0, z = the k largest logits plus
      sigma N(0, I_k), every other logit -inf (p is 0 outside the top k)."""

    where: str = "embedding"
    top_k: int = 0


EMBEDDING = Placement()


def placement_of(keys: Mapping) -> Placement:
    """The Placement named by a config's noise_placement / noise_top_k (absent: the paper's)."""
    where = keys.get("noise_placement", PAPER_RL["noise_placement"])
    top_k = int(keys.get("noise_top_k", PAPER_RL["noise_top_k"]) or 0)
    if where not in PLACEMENTS:
        raise ValueError(f"noise_placement {where!r}: one of {', '.join(PLACEMENTS)}")
    if top_k and where != "logits":
        raise ValueError("noise_top_k needs noise_placement 'logits'")
    return Placement(where, top_k)


# the paper's values of the config keys that say how a CoT is decoded
PAPER_COT = {k: PAPER_RL[k] for k in COT_KEYS}


def cot_settings(cot: Mapping) -> dict[str, CotSetting]:
    """The six inference settings (Section 4) from a config's CoT keys.

    Why one function: training rollouts decode with a mode's ``*_sample`` setting, greedy
    validation with its ``*_greedy`` one, and evaluation with all six. Derived here from the
    same keys, a change of ``soft_temperature`` (an ablation's τ) reaches test-time
    ``soft_greedy`` / ``soft_sample`` as it reaches training; it once did not."""
    missing = [k for k in COT_KEYS if k not in cot]
    if missing:
        raise KeyError(f"CoT settings need {', '.join(COT_KEYS)}; missing {', '.join(missing)}")
    gamma = float(cot["noise_factor"])
    out = {}
    for name, spec in SETTINGS.items():  # config.names: what each setting is
        mode, continuous = spec.mode, spec.mode in CONTINUOUS_MODES
        tau = float(cot[f"{mode}_temperature"]) if spec.temperature is None else float(spec.temperature)
        # greedy: hard at tau = 0 (argmax), soft / fuzzy at their tau without noise; sample: hard at
        # its temperature, soft / fuzzy with noise of factor gamma
        if spec.decoding == "greedy":
            out[name] = CotSetting(mode, tau if continuous else 0.0, 0.0)
        else:
            out[name] = CotSetting(mode, tau, gamma if continuous else 0.0)
    return out


# The paper's defaults, the public view. Answers are always greedy at test time.
INFERENCE_SETTINGS: dict[str, CotSetting] = cot_settings(PAPER_COT)


def is_stochastic(setting: CotSetting) -> bool:
    if setting.mode in CONTINUOUS_MODES:
        return setting.noise_factor > 0
    return setting.temperature > 0
