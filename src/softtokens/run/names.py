"""The words the whole project spells the same way: the CoT modes, the six inference settings,
the noise placements, the config keys that say how a CoT is decoded. One home, so that the
config schema's enums (config.load_schema), the Snakemake wildcard patterns (paths.py), the
engine (engine/settings.py) and the tables cannot disagree about them."""

from __future__ import annotations

MODES = ("hard", "soft", "fuzzy")
CONTINUOUS_MODES = ("soft", "fuzzy")   # one code path: they differ only in the mixture's temperature
DECODINGS = ("greedy", "sample")       # a CoT without and with randomness (sampling or Gaussian noise)
# the six inference settings of Section 4: {mode}_{decoding}
SETTING_NAMES = tuple(f"{m}_{d}" for m in MODES for d in DECODINGS)
# the paper's tables list hard, then fuzzy, then soft
TABLE_MODES = ("hard", "fuzzy", "soft")
TABLE_SETTINGS = tuple(f"{m}_{d}" for m in TABLE_MODES for d in DECODINGS)


def setting_mode(setting: str) -> str:
    """The CoT mode of an inference setting ('soft_sample' -> 'soft')."""
    return _setting_parts(setting)[0]


def setting_decoding(setting: str) -> str:
    """'greedy' or 'sample': whether an inference setting's CoT is drawn with randomness."""
    return _setting_parts(setting)[1]


def _setting_parts(setting: str) -> tuple[str, str]:
    mode, _, decoding = setting.rpartition("_")
    if setting not in SETTING_NAMES:
        raise ValueError(f"unknown inference setting {setting!r} (known: {', '.join(SETTING_NAMES)})")
    return mode, decoding
# where a soft / fuzzy step's Gaussian noise goes: the paper's, then its appendix ablations
PLACEMENTS = ("embedding", "hidden", "logits")
OOD_PROTOCOLS = ("generative", "cloze")

# the keys of `rl:` that say how a CoT is decoded; engine.settings.cot_settings turns them into
# the six inference settings, the training rollout setting and the validation setting
COT_KEYS = ("hard_temperature", "soft_temperature", "fuzzy_temperature", "noise_factor")
# where a soft / fuzzy step's noise goes; they flow with the CoT keys
PLACEMENT_KEYS = ("noise_placement", "noise_top_k")

VARIANT_RE = r"[A-Za-z0-9_.+-]+"
MODE_RE = "|".join(MODES)
SETTING_RE = rf"(?:{MODE_RE})_(?:{'|'.join(DECODINGS)})"
ARM_RE = rf"(?:{MODE_RE})(?:@{VARIANT_RE})?"
