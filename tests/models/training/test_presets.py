"""Training presets: the flags they set, and the copyer initialisation their recipe relies on."""

from __future__ import annotations

import math

import pytest
import torch

from models import CausalTransformer
from models.training.train import PRESETS, TrainConfig, init_copyers, parse_args
from probes import head_assignment


def test_presets_set_their_fields_and_flags_override_them():
    assert parse_args([]) == parse_args(["--preset", "small"]) == TrainConfig()
    medium = parse_args(["--preset", "medium"])
    assert (medium.d_vocab, medium.n_examples, medium.seq_len) == (10, 32, 24)
    large = parse_args(["--preset", "large", "--steps", "7", "--init-demo", "4"])
    assert (large.d_vocab, large.n_examples, large.seq_len) == (20, 64, 32)
    assert (large.steps, large.init_demo) == (7, 4.0)
    for name, fields in PRESETS.items():
        cfg = parse_args(["--preset", name])
        assert all(getattr(cfg, k) == v for k, v in fields.items()), name


def test_unknown_preset_exits_with_code_2(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--preset", "huge"])
    assert e.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def _closed_form_purity(demo: float, offset: float, L: int, H: int) -> float:
    """Mass a freshly initialised head puts on its demonstration, averaged over target rows h: every
    example has one key at offset 0 (e^offset) and H-1 others (e^-offset); the target has h keys."""
    per_example = math.exp(offset) + (H - 1) * math.exp(-offset)
    masses = [
        math.exp(demo) * per_example / ((math.exp(demo) + L - 1) * per_example + h * math.exp(-offset))
        for h in range(H)
    ]
    return sum(masses) / H


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_initialisation_assigns_heads_one_to_one_and_purely(name):
    cfg = parse_args(["--preset", name])
    model = CausalTransformer(cfg.model_config())
    preferred = init_copyers(model, cfg.init_offset, cfg.init_demo, torch.Generator().manual_seed(cfg.seed))
    demos, purity = head_assignment(model.copyer_pattern(), cfg.n_examples)
    assert demos == preferred
    assert len(set(demos)) == len(demos)  # one head per demonstration (K = L)
    expected = _closed_form_purity(cfg.init_demo, cfg.init_offset, cfg.n_examples, cfg.seq_len)
    assert purity == pytest.approx([expected] * len(purity), abs=1e-5)
    assert min(purity) >= 0.93  # the scale recipe: purity at init does not fall as L grows


def test_scale_collects_a_run_into_the_histories_and_keeps_earlier_runs(tmp_path):
    import json

    from analyses import scale
    from models.training.train import train

    cfg = TrainConfig(steps=4, eval_every=2, eval_contexts=16, batch_size=8, out=str(tmp_path / "run"))
    train(cfg)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["training"]["history"]
    histories = tmp_path / "h.json"
    earlier = {"config": {**cfg.__dict__}, "history": [{**saved[0], "min_purity": 0.5, "n_heads": 12}]}
    histories.write_text(json.dumps({"earlier": earlier}))
    scale.main(["--histories", str(histories), "--from-runs", f"new=run={tmp_path / 'run'}", "--out", str(tmp_path)])
    got = json.loads(histories.read_text())
    assert set(got) == {"earlier", "new=run"}  # merged; the label may hold "="
    assert [m["step"] for m in got["new=run"]["history"]] == [m["step"] for m in saved]
    assert [m["min_purity"] for m in got["new=run"]["history"]] == [min(m["head_purity"]) for m in saved]
    assert (tmp_path / "scale.png").is_file()
