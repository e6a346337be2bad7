"""The inference settings have one home (config.names.SETTINGS): what a setting is (its CoT mode, greedy or
sampled, its temperature), the tables' columns, the figures' panels, the forecast's samples, the
schema's enum and the wildcard all ask it. A seventh setting is one entry there plus its tests."""

import re
from pathlib import Path

from softtokens.engine.settings import INFERENCE_SETTINGS, PAPER_COT, cot_settings
from softtokens.report.figures import setting_grid
from softtokens.report.tables import setting_columns
from softtokens.config import names
from softtokens.store import paths
from softtokens.config.grids import EVAL_DEFAULTS, load_schema

SRC = Path(__file__).resolve().parents[1] / "src" / "softtokens"


def test_every_list_of_settings_is_the_registrys():
    assert names.SETTING_NAMES == tuple(names.SETTINGS) and set(names.TABLE_SETTINGS) == set(names.SETTINGS)
    assert names.TABLE_SETTINGS == ("hard_greedy", "hard_sample", "fuzzy_greedy", "fuzzy_sample", "soft_greedy",
                                    "soft_sample")   # the paper's tables: hard, fuzzy, soft
    assert list(INFERENCE_SETTINGS) == list(names.SETTINGS)
    assert load_schema()["$defs"]["setting"]["enum"] == list(names.SETTINGS) == EVAL_DEFAULTS["settings"]
    assert all(re.fullmatch(paths.WILDCARDS["setting"], s) for s in names.SETTINGS)
    assert [names.setting_mode(s) for s in names.SETTINGS] == ["hard", "hard", "soft", "soft", "fuzzy", "fuzzy"]
    assert [names.is_sampled(s) for s in names.SETTINGS] == [False, True] * 3
    assert names.setting_name("soft", "sample") == "soft_sample" and names.setting_label("fuzzy_greedy") == "Fuzzy Greedy"


def test_a_seventh_setting_is_one_entry(monkeypatch):
    """Hard CoTs sampled at tau = 0.6 (a setting the paper does not run): one entry in the registry, and the
    engine decodes it at 0.6, the appendix table gets its pass@1 and pass@n columns, the figures a panel."""
    monkeypatch.setitem(names.SETTINGS, "hard_sample_t0.6", names.SettingSpec("hard", "sample", 0.6))
    settings = cot_settings(PAPER_COT)
    assert settings["hard_sample_t0.6"].temperature == 0.6 and settings["hard_sample"].temperature == 1.0
    assert names.is_sampled("hard_sample_t0.6") and names.setting_mode("hard_sample_t0.6") == "hard"
    assert names.table_settings()[:3] == ("hard_greedy", "hard_sample", "hard_sample_t0.6")
    cols = setting_columns(list(names.table_settings()), 32)
    assert cols[("hard_sample_t0.6", "pass@n")] == "Hard Sample τ=0.6 pass@32"
    columns, rows, at = setting_grid({"hard_greedy", "hard_sample", "hard_sample_t0.6"})
    assert columns == [("hard", None), ("hard", 0.6)] and rows == ["greedy", "sample"]
    assert at[(("hard", 0.6), "sample")] == "hard_sample_t0.6"


def test_no_module_reads_a_settings_kind_off_its_name():
    """Outside config/names.py and engine/settings.py, no code decides what a setting is from its spelling
    (a '_greedy' / '_sample' suffix, or a name built as f'{mode}_{decoding}')."""
    pattern = re.compile(r"""endswith\(["']_(greedy|sample)["']\)|["']_(greedy|sample)["'] in |f["']\{\w+\}_(greedy|sample|\{\w+\})["']""")
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).as_posix() in ("config/names.py", "engine/settings.py"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(SRC)}:{i}: {line.strip()}")
    assert offenders == []


def test_the_loaders_are_the_data_layers_registry():
    """The schema no longer types the loaders out: a config names one of data.sources.LOADERS, and an
    unknown one is refused with that list."""
    import copy

    import pytest
    import yaml

    from softtokens.data.sources import GENERATED, LOADERS, SOURCES, loader_kind, test_size
    from softtokens.config.grids import ConfigError, check_config

    assert "enum" not in load_schema()["$defs"]["dataset"]["properties"]["loader"]
    assert LOADERS == (*SOURCES, *GENERATED)
    assert test_size("arc") == SOURCES["arc"].test_size == 1172 and test_size("toy") is None
    config = yaml.safe_load((SRC.parents[1] / "config.yaml").read_text())
    bad = copy.deepcopy(config)
    bad["grids"]["paper"]["datasets"]["gsm8k"]["loader"] = "gsm9k"
    with pytest.raises(ConfigError, match=r"'grids.paper.datasets.gsm8k.loader': 'gsm9k' is not one of gsm8k, math"):
        check_config(bad, loader_kind)
