"""The third robustness catalogue (issue 23): every entry point on the one convention of ``models.cli``.
``models.standard``, ``bench``, ``analyses.scale``, ``analyses.attention_view`` and
``analyses.linear_probes`` beside ``models.train`` and ``models.evaluate``: flags validated before any
work, no file written over an input or another format's checkpoint, no set written half, messages that
name the thing (a FIFO, a symlink loop, an undecodable name, a list of 20 000 keys cut with a count).
Each case runs the CLI in-process under a time bound and asserts its exit code (2, or 130 for Ctrl-C),
exactly ONE line on stderr containing the expected text, and every file of the test folder and of the
shipped checkpoints byte-identical afterwards (``test_cli_bad_input.assert_one_line``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from unittest import mock

import forked
import pytest
import torch
from test_cli_bad_input import HUGE, TINY, _evaluate, _out, _train, assert_one_line
from test_formats import file_config, hf_folder, small_model

import bench.__main__ as bench
import models
from analyses import attention_view, linear_probes, scale
from models.loading import checkpoint
from models.plumbing.io import run_cli
from models.plumbing.progress import progress
from models.training import standard

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = forked.HANG_S  # a hang, not a time limit: each case takes seconds alone, longer on a busy machine
STANDARD = [
    *("--d-vocab", "3", "--n-examples", "2", "--seq-len", "3", "--n-layers", "1", "--n-heads", "2"),
    *("--d-model", "8", "--d-mlp", "8", "--batch-size", "4", "--eval-contexts", "8", "--steps", "2"),
    *("--eval-every", "2"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, trained) -> Path:
    """Checkpoints of two formats, a training run, histories and files, made once (cases must not change them)."""
    t = tmp_path_factory.mktemp("lab")
    model, task = small_model()
    models.save(model, t / "ckpt", task=task)  # ours, without a training record
    torch.save(model.state_dict(), t / "good.pt")
    (t / "cfg.json").write_text(json.dumps(file_config(model, task)))
    hf_folder(t, task)  # t / "hf": a Hugging Face folder, the format models.standard writes
    shutil.copytree(t / "hf", t / "hf_other_shapes")
    config = json.loads((t / "hf_other_shapes" / checkpoint.CONFIG).read_text())
    (t / "hf_other_shapes" / checkpoint.CONFIG).write_text(json.dumps({**config, "n_embd": 2 * config["n_embd"]}))
    trained(("models.train", *TINY, "--steps", "2", "--eval-every", "2"), t / "run")  # test_each_rule_everywhere's TRAIN
    shutil.copytree(t / "run", t / "empty_run")
    config = json.loads((t / "empty_run" / checkpoint.CONFIG).read_text())
    config["training"]["history"] = []
    (t / "empty_run" / checkpoint.CONFIG).write_text(json.dumps(config))
    collected = scale.collect({"run": t / "run"})
    (t / "histories.json").write_text(json.dumps(collected))
    (t / "empty_histories.json").write_text(json.dumps({"run": {**collected["run"], "history": []}}))
    (t / "garbage.json").write_text("{ nope")
    (t / "notes").mkdir()
    (t / "notes" / "precious.txt").write_text("precious")
    (t / "afile").write_text("not a folder")
    (t / "blocked").mkdir()  # an earlier attention view whose JSON name is taken by a folder
    (t / "blocked" / "attention_view.html").write_text("the old page")
    (t / "blocked" / "attention_view.json").mkdir()
    (t / "long_map.json").write_text(json.dumps({f"absent.{i}": "b_root" for i in range(20_000)}))
    return t


@pytest.fixture(scope="module")
def specials(tmp_path_factory) -> Path:
    """A FIFO, a symlink loop and a name of undecodable bytes, outside ``lab`` (``tree`` would block on
    the FIFO); ``test_..._changes_nothing`` checks their modes instead."""
    t = tmp_path_factory.mktemp("specials")
    os.mkfifo(t / "fifo.json")
    os.symlink(t / "loop_b", t / "loop_a")
    os.symlink(t / "loop_a", t / "loop_b")
    (t / os.fsdecode(b"bad\xff.safetensors")).write_bytes(b"\x00" * 16)
    return t


def _standard(*argv):
    return standard.main, [*STANDARD, *argv]


def _bench(*argv):
    return bench.main, ["--quick", "--only", "bma", *argv]


def _scale(t: Path, *argv):
    return lambda a: run_cli(scale.main, a), [*_out(t, "scale_out"), *argv]


def _view(*argv):
    return lambda a: run_cli(attention_view.main, a), list(argv)


def _probes(*argv):
    return lambda a: run_cli(linear_probes.main, a), ["--n-contexts", "8", *argv]


def _interrupted(main, target: str):
    """``main`` with ``target`` (a function it calls mid-run) raising KeyboardInterrupt: Ctrl-C."""

    def run(argv):
        def quiet(*a, **kw):  # the progress bar is not part of the error
            return progress(*a, **{**kw, "enabled": False})

        with mock.patch(target, side_effect=KeyboardInterrupt), mock.patch("models.training.standard.progress_bar", quiet):
            main(argv)

    return run


BAD_NAME = os.fsdecode(b"bad\xff.safetensors")
SHIPPED_STANDARD_CONFIG = str(checkpoint.STANDARD_CHECKPOINT / checkpoint.CONFIG)

# (kind, id, (lab, specials) -> (main, argv), expected text in the one line[, exit code]); one case a row, so rows
# look alike (`duplicates` pairs the table with itself: data, not logic)
CASES = [
    # --- models.standard on the convention: every flag checked before training --------------------
    ("traceback", "standard --device mps", lambda t, s: _standard("--device", "mps", *_out(t)), "--device 'mps' cannot"),
    ("traceback", "standard --device foo", lambda t, s: _standard("--device", "foo", *_out(t)), "is not a torch device"),
    ("traceback", "standard --seed 2**64", lambda t, s: _standard("--seed", str(2**64), *_out(t)), "--seed must be in"),
    (
        "traceback",
        "standard --task-seed 2**64",
        lambda t, s: _standard("--task-seed", str(2**64), *_out(t)),
        "--task-seed must be in",
    ),
    ("traceback", "standard --threads 0", lambda t, s: _standard("--threads", "0", *_out(t)), "--threads must be in"),
    ("traceback", "standard --threads 10**6", lambda t, s: _standard("--threads", "1000000", *_out(t)), "[1, 1024]"),
    ("traceback", "standard --batch-size 0", lambda t, s: _standard("--batch-size", "0", *_out(t)), "--batch-size must"),
    (
        "traceback",
        "standard --batch-size huge",
        lambda t, s: _standard("--batch-size", HUGE, *_out(t)),
        "--batch-size 10000000000",
    ),
    ("traceback", "standard --out under /proc", lambda t, s: _standard("--out", "/proc/robustness"), "not writable"),
    ("traceback", "standard --out a file", lambda t, s: _standard(*_out(t, "afile")), "is a file"),
    ("traceback", "standard --out in a file", lambda t, s: _standard(*_out(t, "afile/such/x")), "is not a folder"),
    (
        "traceback",
        "standard Ctrl-C",
        lambda t, s: (_interrupted(standard.main, "models.training.standard._descend"), [*STANDARD, *_out(t)]),
        "python -m models.standard: error: interrupted",
        130,
    ),
    # --- bench on the convention ------------------------------------------------------------------
    ("traceback", "bench --device mps", lambda t, s: _bench("--device", "mps"), "--device 'mps' cannot be used"),
    ("traceback", "bench --threads 0", lambda t, s: _bench("--threads", "0"), "--threads must be in [1, 1024]"),
    ("traceback", "bench --json in a file", lambda t, s: _bench("--json", str(t / "afile" / "b.json")), "is a file"),
    ("traceback", "bench --json a folder", lambda t, s: _bench("--json", str(t / "notes")), "is a folder"),
    ("traceback", "bench --only nothing", lambda t, s: _bench("--only", "nothing"), "invalid choice: 'nothing'"),
    # --- never write over an input, or another format's checkpoint ------------------------------
    (
        "work",
        "bench --json the standard checkpoint's config",
        lambda t, s: _bench("--json", SHIPPED_STANDARD_CONFIG),
        "which this command reads",
    ),
    (
        "work",
        "evaluate --json its checkpoint's config",
        lambda t, s: _evaluate("--checkpoint", str(t / "ckpt"), "--json", str(t / "ckpt" / "config.json")),
        "which this command reads",
    ),
    (
        "work",
        "evaluate --json onto a file it did not write",
        lambda t, s: _evaluate("--checkpoint", str(t / "ckpt"), "--json", str(t / "notes" / "precious.txt")),
        "exists and is not an earlier output of python -m models.evaluate",
    ),
    (
        "work",
        "evaluate --json onto another command's JSON",
        lambda t, s: _evaluate("--checkpoint", str(t / "ckpt"), "--json", str(t / "histories.json")),
        "refusing to replace it (pass --overwrite",
    ),
    (
        "work",
        "bench --json onto a file it did not write",
        lambda t, s: _bench("--json", str(t / "garbage.json")),
        "exists and is not an earlier output of python -m bench",
    ),
    (
        "work",
        "train --overwrite onto a Hugging Face folder",
        lambda t, s: _train("--overwrite", *_out(t, "hf")),
        "holds a Hugging Face folder; refusing to replace it",
    ),
    (
        "work",
        "train --resume --overwrite onto a Hugging Face folder",
        lambda t, s: _train("--resume", "--overwrite", *_out(t, "hf")),
        "holds a Hugging Face folder",
    ),
    (
        "work",
        "standard --overwrite onto our checkpoint",
        lambda t, s: _standard("--overwrite", *_out(t, "ckpt")),
        "holds a checkpoint folder of ours; refusing to replace it",
    ),
    (
        "work",
        "standard --overwrite onto other files",
        lambda t, s: _standard("--overwrite", *_out(t, "notes")),
        "is not a checkpoint folder",
    ),
    ("work", "standard onto its own format", lambda t, s: _standard(*_out(t, "hf")), "pass --overwrite"),
    (
        "work",
        "scale --from-runs an empty history",
        lambda t, s: _scale(t, "--from-runs", f"e={t / 'empty_run'}", "--histories", str(t / "histories.json")),
        "its history is empty",
    ),
    (
        "work",
        "scale --from-runs a checkpoint with no training",
        lambda t, s: _scale(t, "--from-runs", f"c={t / 'ckpt'}", "--histories", str(t / "histories.json")),
        "has no training history",
    ),
    (
        "work",
        "scale --from-runs not a checkpoint",
        lambda t, s: _scale(t, "--from-runs", f"n={t / 'notes'}", "--histories", str(t / "histories.json")),
        "has no config.json",
    ),
    (
        "work",
        "scale --histories inside a run it reads",
        lambda t, s: _scale(t, "--from-runs", f"r={t / 'run'}", "--histories", str(t / "run" / "config.json")),
        "which this command reads",
    ),
    (
        "work",
        "scale --histories in a file",
        lambda t, s: _scale(t, "--from-runs", f"r={t / 'run'}", "--histories", str(t / "afile" / "h.json")),
        "is a file",
    ),
    (
        "work",
        "attention_view set blocked by a folder",
        lambda t, s: _view("--checkpoint", str(t / "ckpt"), *_out(t, "blocked")),
        "attention_view.json is a folder",
    ),
    (
        "work",
        "linear_probes --out inside --standard",
        lambda t, s: _probes("--checkpoint", str(t / "ckpt"), "--standard", str(t / "hf"), *_out(t, "hf/probes")),
        "which this command reads",
    ),
    # --- the other analyses' flags and inputs ------------------------------------------------------
    ("traceback", "scale --from-runs no label", lambda t, s: _scale(t, "--from-runs", str(t / "run")), "LABEL=FOLDER"),
    (
        "traceback",
        "scale --histories missing",
        lambda t, s: _scale(t, "--histories", str(t / "none.json")),
        "does not exist; collect it",
    ),
    ("traceback", "scale --histories not JSON", lambda t, s: _scale(t, "--histories", str(t / "garbage.json")), "JSON"),
    (
        "traceback",
        "scale --histories an empty run",
        lambda t, s: _scale(t, "--histories", str(t / "empty_histories.json")),
        "run 'run': its history is empty",
    ),
    ("traceback", "scale --seed 2**64", lambda t, s: _scale(t, "--seed", str(2**64)), "--seed must be in"),
    (
        "traceback",
        "attention_view --context -1",
        lambda t, s: _view("--checkpoint", str(t / "ckpt"), "--context", "-1", *_out(t)),
        "--context must be >= 0",
    ),
    (
        "traceback",
        "attention_view --device mps",
        lambda t, s: _view("--checkpoint", str(t / "ckpt"), "--device", "mps", *_out(t)),
        "--device 'mps'",
    ),
    (
        "traceback",
        "attention_view --out a file",
        lambda t, s: _view("--checkpoint", str(t / "ckpt"), *_out(t, "afile")),
        "is a file",
    ),
    (
        "traceback",
        "linear_probes --standard a disentangled checkpoint",
        lambda t, s: _probes("--checkpoint", str(t / "ckpt"), "--standard", str(t / "ckpt"), *_out(t)),
        "expected a standard transformer",
    ),
    (
        "traceback",
        "linear_probes --standard missing",
        lambda t, s: _probes("--checkpoint", str(t / "ckpt"), "--standard", str(t / "absent"), *_out(t)),
        "does not exist",
    ),
    ("traceback", "linear_probes --threads 0", lambda t, s: _probes("--threads", "0", *_out(t)), "--threads must be in"),
    # --- messages that name the thing -------------------------------------------------------------
    (
        "message",
        "--config a FIFO",
        lambda t, s: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(s / "fifo.json")),
        "is a named pipe (FIFO)",
    ),
    (
        "message",
        "--config a symlink loop",
        lambda t, s: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(s / "loop_a")),
        "is a symlink loop",
    ),
    (
        "message",
        "--checkpoint a symlink loop",
        lambda t, s: _evaluate("--checkpoint", str(s / "loop_a")),
        "symlink loop",
    ),
    (
        "message",
        "--checkpoint a bad file of an undecodable name (read, and named as what it is)",
        lambda t, s: _evaluate("--checkpoint", str(s / BAD_NAME), "--config", str(t / "cfg.json")),
        "is not a readable safetensors file",
    ),
    (
        "message",
        "key map naming 20 000 absent keys",
        lambda t, s: _evaluate(
            "--checkpoint", str(t / "good.pt"), "--config", str(t / "cfg.json"), "--key-map", str(t / "long_map.json")
        ),
        "... and 19995 more",
    ),
    (
        "message",
        "Hugging Face weights of other shapes than its config",
        lambda t, s: _evaluate("--checkpoint", str(t / "hf_other_shapes")),
        "h.0.attn.c_attn.bias [24] vs [48]",
    ),
]


def modes(folder: Path) -> dict[str, int]:
    return {p.name: os.lstat(p).st_mode for p in folder.iterdir()}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_entry_point_bad_input_is_one_line_and_changes_nothing(lab, specials, capsys, case):
    kind, name, make, expected, *code = case
    main, argv = make(lab, specials)
    before = modes(specials)
    with forked.bounded(BOUND_S):
        assert_one_line(main, argv, expected, [lab, checkpoint.STANDARD_CHECKPOINT], capsys, *code)
    assert modes(specials) == before
    assert all(len(line) < 1000 for line in capsys.readouterr().err.splitlines())


def test_json_replaces_only_its_own_earlier_output_unless_overwrite(lab, tmp_path, capsys):
    """``--json`` is an output under the rules of ``--out``: a file the command wrote before is replaced;
    any other file only with ``--overwrite`` (the refusals are catalogue cases above)."""
    main, argv = _evaluate("--checkpoint", str(lab / "ckpt"), "--json", str(tmp_path / "m.json"))
    main(argv)
    first = json.loads((tmp_path / "m.json").read_text())
    assert first["command"].startswith("python -m models.evaluate ") and first["n_contexts"] == 8
    main([*argv, "--seed", "5"])  # its own earlier output: replaced without --overwrite
    assert json.loads((tmp_path / "m.json").read_text())["seed"] == 5
    other = tmp_path / "notes.txt"
    other.write_text("a note")
    main, argv = _evaluate("--checkpoint", str(lab / "ckpt"), "--json", str(other), "--overwrite")
    main(argv)
    assert json.loads(other.read_text())["seed"] == first["seed"]


def test_catalogue_has_thirty_cases_of_every_kind():
    assert {c[0] for c in CASES} == {"work", "traceback", "message"}
    assert len(CASES) >= 30


def _python(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, **kw)


def test_a_malformed_omp_num_threads_is_one_line_not_libgomps(tmp_path):
    p = _python(["-m", "models.evaluate", "--n-contexts", "8"], {"OMP_NUM_THREADS": "abc"}, stdout=subprocess.PIPE)
    out, err = p.communicate(timeout=BOUND_S)
    assert p.returncode == 2 and out == ""
    assert err.strip().splitlines() == [
        "python -m models.evaluate: error: environment variable OMP_NUM_THREADS='abc' is not a positive integer; unset it "
        "(--threads sets torch's threads)"
    ]


def test_a_reader_that_goes_away_ends_a_successful_run_quietly(lab, tmp_path):
    """``python -m analyses.scale ... | head -c 0``: the figures are written, exit 0, nothing on stderr."""
    out = tmp_path / "figs"
    p = _python(
        ["-m", "analyses.scale", "--histories", str(lab / "histories.json"), "--out", str(out)], stdout=subprocess.PIPE
    )
    p.stdout.close()  # the reader has gone before the first line is printed
    assert p.wait(timeout=BOUND_S) == 0
    assert p.stderr.read() == ""
    assert sorted(f.name for f in out.iterdir()) == ["scale.json", "scale.pdf", "scale.png"]
    assert stat.S_ISREG(os.lstat(out / "scale.json").st_mode)
