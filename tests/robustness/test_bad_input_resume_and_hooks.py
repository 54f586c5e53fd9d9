"""A catalogue of bad inputs (one-line ValueError naming the problem; nothing on disk changed), CLI
errors (exit 2, one line on stderr), bit-exact resume after a kill, and hooks removed after errors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import forked
import pytest
import safetensors.torch
import torch
from conftest import build_task
from test_formats import file_config, hf_folder, small_model

import models
from analyses import inspect
from models.interp.subject import load_subject
from models.loading.sources.key_map import read_key_map
from models.loading.sources.task_json import read_task as task_from_dict
from models.training import standard, train
from probes import MarkovTreeTask

ROOT = Path(__file__).resolve().parents[2]


class Evil:
    """Unpickling this would run code (writes a file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def files(tmp_path):
    """Good and bad weight files, configs and task descriptions on disk."""
    model, task = small_model()
    sd = model.state_dict()
    cfg = file_config(model, task)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    torch.save(sd, tmp_path / "good.pt")
    raw = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "corrupt.pt").write_bytes(os.urandom(512))
    safetensors.torch.save_file(dict(sd), tmp_path / "good.safetensors")
    st = (tmp_path / "good.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(st[: len(st) - 7])
    torch.save(Evil(tmp_path / "PWNED"), tmp_path / "evil.pt")
    torch.save({**sd, "blocks.1.attn.W_KQ": sd["blocks.1.attn.W_KQ"] * float("nan")}, tmp_path / "nan.pt")
    safetensors.torch.save_file(
        {**sd, "b_root": torch.tensor([float("inf")] * task.d_vocab)}, tmp_path / "inf.safetensors"
    )
    torch.save({**sd, "blocks.0.attn.w_L": torch.zeros(2, 2)}, tmp_path / "shape.pt")
    torch.save({k: v for k, v in sd.items() if k != "b_root"}, tmp_path / "missing.pt")
    torch.save({**sd, "bogus": torch.zeros(1)}, tmp_path / "unexpected.pt")
    torch.save({"module.b_root": sd["b_root"], "b_root": sd["b_root"]}, tmp_path / "collide.pt")
    (tmp_path / "w.xyz").write_bytes(b"x")
    (tmp_path / "lonely").mkdir()
    torch.save(sd, tmp_path / "lonely" / "w.pt")
    (tmp_path / "vocab.json").write_text(json.dumps({**cfg, "model": {**cfg["model"], "d_vocab": 7}}))
    (tmp_path / "notjson.json").write_text("{ nope")
    return tmp_path, cfg, task


def _bad_task(**change) -> dict:
    d = build_task().to_dict()
    d.update(change)
    return d


# (name, call(tmp, cfg, task), expected substring of the one-line message)
CATALOGUE = [
    ("truncated .pt", lambda t, c, k: models.load(t / "truncated.pt", config=c), "not a readable PyTorch file"),
    ("corrupt .pt", lambda t, c, k: models.load(t / "corrupt.pt", config=c), "not a readable PyTorch file"),
    (
        "truncated .safetensors",
        lambda t, c, k: models.load(t / "truncated.safetensors", config=c),
        "not a readable safetensors file",
    ),
    ("pickle that runs code", lambda t, c, k: models.load(t / "evil.pt", config=c), "refusing to unpickle"),
    ("NaN weights", lambda t, c, k: models.load(t / "nan.pt", config=c), "NaN or Inf"),
    ("Inf weights", lambda t, c, k: models.load(t / "inf.safetensors", config=c), "NaN or Inf"),
    ("wrong shape", lambda t, c, k: models.load(t / "shape.pt", config=c), "wrong shape blocks.0.attn.w_L"),
    ("missing key", lambda t, c, k: models.load(t / "missing.pt", config=c), "missing b_root"),
    ("unexpected key", lambda t, c, k: models.load(t / "unexpected.pt", config=c), "unexpected bogus"),
    ("prefix collision", lambda t, c, k: models.load(t / "collide.pt", config=c), "both become 'b_root'"),
    ("unknown suffix", lambda t, c, k: models.load(t / "w.xyz", config=c), "is a .xyz file, not a weight file; expected .pt"),
    ("no config", lambda t, c, k: models.load(t / "lonely" / "w.pt"), "needs a config"),
    ("config not JSON", lambda t, c, k: models.load(t / "good.pt", config=t / "notjson.json"), "not valid JSON"),
    (
        "vocab disagrees with task",
        lambda t, c, k: models.load(t / "good.pt", config=t / "vocab.json"),
        "d_vocab=7 disagrees",
    ),
    (
        "config K != L but weights K = L",
        lambda t, c, k: models.load(t / "good.pt", config={**c, "model": {**c["model"], "n_copy_heads": 2}}),
        "wrong shape blocks.0.attn.w_H: got (3, 9), expected (2, 9)",
    ),
    ("missing checkpoint", lambda t, c, k: models.load(t / "nothing_here"), "does not exist"),
    (
        "key map names absent key",
        lambda t, c, k: models.load(t / "good.pt", config=c, key_map={"zz": "b_root"}),
        "not in the file",
    ),
    (
        "key map transposes a vector",
        lambda t, c, k: models.load(t / "good.pt", config=c, key_map={"b_root": {"to": "b_root", "transpose": True}}),
        "cannot transpose",
    ),
    (
        "key map bad reshape",
        lambda t, c, k: models.load(t / "good.pt", config=c, key_map={"b_root": {"to": "b_root", "reshape": [7, 7]}}),
        "cannot reshape",
    ),
    (
        "key map not JSON",
        lambda t, c, k: models.load(t / "good.pt", config=c, key_map=t / "notjson.json"),
        "not valid JSON",
    ),
    ("key map malformed entry", lambda t, c, k: read_key_map({"a": 3}), "must be a key name"),
    ("task kind", lambda t, c, k: task_from_dict(_bad_task(kind="gaussian"), "task.json"), "kind 'gaussian'"),
    ("task layout", lambda t, c, k: task_from_dict(_bad_task(layout="position-major"), "task.json"), "layout"),
    (
        "task non-stochastic pi",
        lambda t, c, k: task_from_dict(_bad_task(pi=[[0.5, 0.6], [0.5, 0.5]], d_vocab=2), "task.json"),
        "row-stochastic",
    ),
    ("task ragged pi", lambda t, c, k: task_from_dict(_bad_task(pi=[[1.0], [0.5, 0.5]]), "task.json"), "pi"),
    (
        "task bad n_examples",
        lambda t, c, k: task_from_dict(_bad_task(n_examples="ten"), "task.json"),
        "n_examples must be an integer",
    ),
    (
        "task d_vocab disagrees with pi",
        lambda t, c, k: task_from_dict(_bad_task(d_vocab=9), "task.json"),
        "d_vocab=9 disagrees",
    ),
    ("zeros in pi for Theorem 1", lambda t, c, k: models.theorem1_model(torch.eye(3), 2, 3, 10.0), "zero entries"),
    ("negative pi", lambda t, c, k: MarkovTreeTask(torch.tensor([[1.5, -0.5], [0.5, 0.5]]), 2, 3), "negative"),
    (
        "tokens outside the vocabulary",
        lambda t, c, k: models.load(t / "good.pt", config=c)(torch.full((1, k.n_tokens), k.d_vocab)),
        "token ids must lie",
    ),
    ("standard d_model vs heads", lambda t, c, k: standard.StandardConfig(d_model=30, n_heads=4), "multiple of"),
    ("theorem1 spec", lambda t, c, k: load_subject("theorem1:gamma=2"), "expected theorem1:beta=B"),
    # issue 14: every API entry point validates through probes.tasks.check_int/check_float and checkpoint
    ("alpha nan (API)", lambda t, c, k: MarkovTreeTask.random(3, 2, 3, alpha=float("nan")), "alpha must be a finite"),
    ("n_examples 10.9 (API)", lambda t, c, k: MarkovTreeTask(k.pi, 10.9, 3), "n_examples must be an integer"),
    ("task seed 2**64 (API)", lambda t, c, k: MarkovTreeTask.random(3, 2, 3, seed=2**64), "task seed must be in"),
    ("TrainConfig lr nan", lambda t, c, k: train.TrainConfig(lr=float("nan")), "lr must be a finite number > 0"),
    ("TrainConfig steps 2.5", lambda t, c, k: train.TrainConfig(steps=2.5), "steps must be an integer"),
    ("TrainConfig device", lambda t, c, k: train.TrainConfig(device="mps"), "device 'mps' cannot be used"),
    ("save without task", lambda t, c, k: models.save(models.load(t / "good.pt", config=c), t / "c"), "needs task="),
    (
        "save under /proc",
        lambda t, c, k: models.save(models.load(t / "good.pt", config=c), "/proc/robustness/c", task=k),
        "cannot create the folder",
    ),
    ("load dtype overflow", lambda t, c, k: models.load(t / "good.pt", config=c, dtype="float16"), "dtype must be"),
]


@pytest.mark.parametrize("name,call,expected", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_input_gives_one_line_error_and_changes_nothing(files, name, call, expected):
    tmp, cfg, task = files
    before = _snapshot(tmp)
    with pytest.raises(ValueError) as err:
        call(tmp, cfg, task)
    msg = str(err.value)
    assert expected in msg and "\n" not in msg, msg
    assert _snapshot(tmp) == before
    assert not (tmp / "PWNED").exists()  # the malicious pickle never ran


def test_hf_folder_bad_inputs(tmp_path):
    folder, _, _ = hf_folder(tmp_path)
    bad_vocab = json.loads((folder / "task.json").read_text())
    for change, expected in (
        ({"d_vocab": 7, "pi": torch.full((7, 7), 1 / 7).tolist(), "root": None}, "vocab_size=4 disagrees"),
        ({"seq_len": 50}, "positions"),
    ):
        (folder / "task.json").write_text(json.dumps({**bad_vocab, **change}))
        with pytest.raises(ValueError, match=expected):
            models.load(folder)
    with pytest.raises(ValueError, match="apply to weight files only"):
        models.load(folder, key_map={"a": "b"})
    (folder / "task.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        models.load(folder)
    (folder / "task.json").write_text(json.dumps(bad_vocab))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        models.load(folder)


def test_cli_errors_exit_2_with_one_line_and_keep_existing_files(files, capsys):
    tmp, _, _ = files
    keep = tmp / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    before = _snapshot(tmp)
    cases = [
        (inspect.main, ["--n-contexts", "0"], "--n-contexts must be in [2, "),
        (inspect.main, ["--out", str(tmp / "cfg.json" / "dir")], "is not a folder"),
        (inspect.main, ["--out", str(tmp / "cfg.json")], "is a file"),
        (
            inspect.main,
            ["--checkpoint", str(tmp / "corrupt.pt"), "--config", str(tmp / "cfg.json"), "--out", str(tmp / "o")],
            "not a readable PyTorch file",
        ),
        (standard.main, ["--d-model", "30", "--n-heads", "4", "--out", str(tmp / "s")], "multiple of"),
        (
            standard.main,
            [
                "--steps",
                "1",
                "--eval-every",
                "1",
                "--eval-contexts",
                "8",
                "--batch-size",
                "2",
                "--d-model",
                "8",
                "--n-heads",
                "2",
                "--out",
                str(keep),
            ],
            "refusing to overwrite",
        ),
        (train.main, ["--steps", "0", "--out", str(tmp / "t")], "steps must be >= 1"),
    ]
    for main, argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            from analyses.common import run_cli

            run_cli(main, argv) if main is inspect.main else main(argv)
        assert exit_info.value.code == 2, argv
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert expected in err[-1], (argv, err)
        assert not any("Traceback" in line for line in err)
    assert _snapshot(tmp) == before


def test_cli_subprocess_stderr_is_one_line(files):
    tmp, _, _ = files
    proc = forked.run(  # python -m, the imports done once (tests/helpers/forked.py)
        "analyses.inspect", "--checkpoint", str(tmp / "evil.pt"), "--config", str(tmp / "cfg.json"),
        "--out", str(tmp / "o"), cwd=ROOT, timeout=forked.HANG_S,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "refusing to unpickle" in proc.stderr
    assert not (tmp / "PWNED").exists()


def test_resume_after_a_kill_ends_with_the_same_weights(tmp_path, monkeypatch):
    common = {
        "d_vocab": 3,
        "n_examples": 2,
        "seq_len": 3,
        "steps": 6,
        "batch_size": 8,
        "eval_every": 3,
        "eval_contexts": 16,
    }
    full, full_history = train.train(train.TrainConfig(**common, out=str(tmp_path / "full")), progress=False)

    original = train._save

    def save_then_die(model, task, cfg, history, opt, sched, data_gen, step, path, *carry):
        original(model, task, cfg, history, opt, sched, data_gen, step, path, *carry)
        if step == 3:
            raise KeyboardInterrupt("killed after the step-3 checkpoint")

    monkeypatch.setattr(train, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train.train(train.TrainConfig(**common, out=str(tmp_path / "killed")), progress=False)
    monkeypatch.setattr(train, "_save", original)
    assert json.loads((tmp_path / "killed" / "train_state.json").read_text())["step"] == 3
    resumed, history = train.train(
        train.TrainConfig(**common, out=str(tmp_path / "killed"), resume=True), progress=False
    )
    assert [m["step"] for m in history] == [m["step"] for m in full_history]  # no eval lost or repeated
    assert history[-1]["nll"] == full_history[-1]["nll"]
    for k, v in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k


def _attached(model) -> int:
    return sum(len(hp._forward_hooks) + len(hp._backward_hooks) for hp in model.hook_dict.values())


def test_no_hook_survives_an_exception_in_a_hook(tmp_path):
    model, task = small_model()
    folder, _, hf_task = hf_folder(tmp_path)
    bridge = models.load(folder)

    def boom(x, hook):
        raise RuntimeError("hook failed")

    for m, t in ((model, task), (bridge, hf_task)):
        tokens, _ = t.sample(2, torch.Generator().manual_seed(0))
        with pytest.raises(RuntimeError, match="hook failed"):
            m.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", boom)])
        assert _attached(m) == 0
        with (
            pytest.raises(RuntimeError, match="hook failed"),
            m.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", boom)]),
        ):
            m(tokens)
        assert _attached(m) == 0
        before = m(tokens)
        assert torch.equal(m(tokens), before)  # still runs, unchanged
