"""The words the whole project spells the same way: the CoT modes, the six inference settings,
the noise placements, the config keys that say how a CoT is decoded. One home, so that the
config schema's enums (config.load_schema), the Snakemake wildcard patterns (paths.py), the
engine (engine/settings.py) and the tables cannot disagree about them."""

from __future__ import annotations

import re
from typing import NamedTuple

MODES = ("hard", "soft", "fuzzy")
CONTINUOUS_MODES = ("soft", "fuzzy")   # one code path: they differ only in the mixture's temperature
DECODINGS = ("greedy", "sample")       # a CoT without and with randomness (sampling or Gaussian noise)
# the paper's tables list hard, then fuzzy, then soft
TABLE_MODES = ("hard", "fuzzy", "soft")


class SettingSpec(NamedTuple):
    """What an inference setting is (engine.settings.cot_settings turns it into a CotSetting)."""

    mode: str                          # the CoT's mode
    decoding: str                      # greedy (no randomness) | sample (n CoTs per problem)
    temperature: float | None = None   # the CoT temperature; None: the config's {mode}_temperature


def _section4() -> dict[str, SettingSpec]:
    return {f"{m}_{d}": SettingSpec(m, d) for m in MODES for d in DECODINGS}


# The inference settings: the six of Section 4. Every module asks this registry (setting_mode,
# is_sampled, setting_label, setting_name, table_settings) what a setting is; a seventh setting is
# one more entry here (and its tests), not a rule typed into each table.
SETTINGS: dict[str, SettingSpec] = _section4()
SETTING_NAMES = tuple(SETTINGS)


def table_settings() -> tuple[str, ...]:
    """The settings in the order the paper's tables print them: hard, then fuzzy, then soft (within
    a mode, the registry's order)."""
    return tuple(sorted(SETTINGS, key=lambda n: TABLE_MODES.index(SETTINGS[n].mode)))


TABLE_SETTINGS = table_settings()   # the tables' column order


def settings_of(modes) -> tuple[str, ...]:
    """The settings whose CoT is one of ``modes``, in the tables' order (Table 1's: those of 'hard')."""
    return tuple(s for s in TABLE_SETTINGS if SETTINGS[s].mode in modes)


def setting_mode(setting: str) -> str:
    """The CoT mode of an inference setting ('soft_sample' -> 'soft')."""
    return _spec(setting).mode


def setting_decoding(setting: str) -> str:
    """'greedy' or 'sample': whether an inference setting's CoT is drawn with randomness."""
    return _spec(setting).decoding


def is_sampled(setting: str) -> bool:
    """Whether an evaluation in this setting draws n CoTs per problem (and so has a pass@n)."""
    return _spec(setting).decoding == "sample"


def setting_name(mode: str, decoding: str) -> str:
    """The Section 4 setting of a CoT mode and decoding (training rollouts: 'sample', validation: 'greedy')."""
    for name, spec in SETTINGS.items():
        if (spec.mode, spec.decoding, spec.temperature) == (mode, decoding, None):
            return name
    raise ValueError(f"no inference setting decodes {mode!r} CoTs {decoding!r} (settings: {', '.join(SETTINGS)})")


def setting_label(setting: str) -> str:
    """How a table heads a setting's column: 'Hard Greedy', 'Soft Sample'."""
    spec = _spec(setting)
    extra = f" τ={spec.temperature:g}" if spec.temperature is not None else ""
    return f"{spec.mode.capitalize()} {spec.decoding.capitalize()}{extra}"


def _spec(setting: str) -> SettingSpec:
    if setting not in SETTINGS:
        raise ValueError(f"unknown inference setting {setting!r} (known: {', '.join(SETTINGS)})")
    return SETTINGS[setting]


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
# A model's `source:`: the toy the workflow builds and trains from scratch, a model a pip package ships that the
# workflow builds into a model directory (``pip:NAME``: model.packaged), or else a hub id or a local directory.
TOY_SOURCE = "toy"
PACKAGED_PREFIX = "pip:"


def packaged_name(source: str) -> str | None:
    """NAME of a ``pip:NAME`` source (model.packaged.PACKAGED), else None."""
    return source[len(PACKAGED_PREFIX):] if source.startswith(PACKAGED_PREFIX) else None


def built_by_workflow(source: str) -> bool:
    """Whether a base model is a job's output (results/GRID/models/MODEL) rather than read from outside."""
    return source == TOY_SOURCE or packaged_name(source) is not None


def alternation(names) -> str:
    """A regular expression matching exactly one of ``names`` (longest first: an alternation tries them
    in order); one that matches nothing for no names. Wildcard constraints and the path patterns use it."""
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)"


SETTING_RE = alternation(SETTINGS)
ARM_RE = rf"(?:{MODE_RE})(?:@{VARIANT_RE})?"
