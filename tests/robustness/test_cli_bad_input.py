"""The second robustness catalogue (issue 14): bad input at every command line, by kind. Each case runs
the CLI in-process and asserts exit code 2, exactly ONE line on stderr containing the expected text,
and every file under the test folder (hidden ones, folders, links) byte-identical afterwards, as well
as the shipped checkpoint. Kinds: work lost, hangs and memory bombs, wrong numbers with exit 0,
tracebacks, misleading messages."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import forked
import pytest
import safetensors.torch
import torch
from conftest import build_task
from test_formats import file_config, small_model
from test_work_never_lost import tree

import models
from analyses import copyers
from models.loading import checkpoint
from models.plumbing.io import UsageError, run_cli
from models.training import evaluate, train

ROOT = Path(__file__).resolve().parents[2]

LONG = "x" * 300
TINY = ["--d-vocab", "3", "--n-examples", "2", "--seq-len", "3", "--batch-size", "4", "--eval-contexts", "8"]
HUGE = str(10**10)


def _edit_config(folder: Path, change) -> None:
    config = json.loads((folder / checkpoint.CONFIG).read_text())
    change(config)
    (folder / checkpoint.CONFIG).write_text(json.dumps(config))


def _nested(depth: int) -> str:
    return '{"model": ' + "[" * depth + "]" * depth + "}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """Checkpoints, runs and files, good and bad, made once for every case (cases must not change them)."""
    t = tmp_path_factory.mktemp("lab")
    model, task = small_model()
    models.save(model, t / "ckpt", task=task)
    sd = model.state_dict()
    (t / "cfg.json").write_text(json.dumps(file_config(model, task)))
    torch.save(sd, t / "good.pt")
    train.main([*TINY, "--steps", "3", "--eval-every", "3", "--out", str(t / "run")])  # as _train() runs
    (t / "notes").mkdir()
    (t / "notes" / "precious.txt").write_text("precious")
    (t / "afile").write_text("not a folder")
    os.symlink(t / "nowhere" / "x", t / "dangling")

    def variant(name: str, source: str = "ckpt") -> Path:
        shutil.copytree(t / source, t / name)
        return t / name

    # training states that cannot be resumed
    (variant("bad_state_tensors", "run") / checkpoint.TRAIN_STATE).write_bytes(b"\x00" * 40)
    (variant("bad_state_json", "run") / checkpoint.TRAIN_META).write_text("{ nope")
    (variant("bad_state_fields", "run") / checkpoint.TRAIN_META).write_text(json.dumps({"step": 2}))
    (variant("bad_state_step", "run") / checkpoint.TRAIN_META).write_text(
        json.dumps({**json.loads((t / "run" / checkpoint.TRAIN_META).read_text()), "step": -3})
    )
    _edit_config(variant("no_record", "run"), lambda c: c.update(training=None))
    st = (t / "run" / checkpoint.TRAIN_STATE).read_bytes()
    (variant("truncated_state", "run") / checkpoint.TRAIN_STATE).write_bytes(st[: len(st) // 2])
    # configs that are not what they claim
    _edit_config(variant("model_list"), lambda c: c.update(model=[1, 2]))
    _edit_config(variant("task_missing"), lambda c: c.pop("task"))
    _edit_config(variant("task_null"), lambda c: c.update(task=None))
    (variant("nested") / checkpoint.CONFIG).write_text(_nested(100_000))
    (variant("not_json") / checkpoint.CONFIG).write_text("{ nope")
    _edit_config(variant("huge_seq_len"), lambda c: (c["model"].update(seq_len=10**6), c["task"].update(seq_len=10**6)))
    _edit_config(
        variant("big_seq_len"), lambda c: (c["model"].update(seq_len=60_000), c["task"].update(seq_len=60_000))
    )
    _edit_config(variant("task_disagrees"), lambda c: c["task"].update(n_examples=c["task"]["n_examples"] + 1))
    _edit_config(
        variant("fractional_l"), lambda c: (c["model"].update(n_examples=3.5), c["task"].update(n_examples=3.5))
    )
    _edit_config(variant("string_d"), lambda c: c["model"].update(d_vocab="4"))
    _edit_config(variant("unknown_field"), lambda c: c["model"].update(n_layers=7))
    (variant("stray_task") / "task.json").write_text(json.dumps(task.to_dict()))
    (variant("truncated_weights") / checkpoint.WEIGHTS).write_bytes(b"\x00" * 64)
    (variant("no_weights") / checkpoint.WEIGHTS).unlink()
    big = {k: v.double() for k, v in sd.items()}
    big["b_root"] = torch.full_like(big["b_root"], 1e300)
    safetensors.torch.save_file(big, variant("overflow") / checkpoint.WEIGHTS)
    safetensors.torch.save_file(big, t / "overflow.safetensors")
    (t / "overflow.json").write_text(json.dumps(file_config(model, task)))
    wide = small_model()[0].double()
    with torch.no_grad():
        wide.b_root.fill_(1e300)
    models.save(wide, t / "overflow64", task=task)  # a float64 checkpoint, fine as float64
    # tensors that are not dense float weights
    torch.save({**sd, "b_root": sd["b_root"].to_sparse()}, t / "sparse.pt")
    torch.save({**sd, "b_root": torch.empty(sd["b_root"].shape, device="meta")}, t / "meta.pt")
    torch.save({**sd, "b_root": sd["b_root"].to(torch.float8_e4m3fn)}, t / "float8.pt")
    torch.save({**sd, "b_root": sd["b_root"].long()}, t / "int.pt")
    with warnings.catch_warnings():  # quantized tensors are deprecated (and must still be refused)
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(sd["b_root"], 0.1, 0, torch.qint8)
    torch.save({**sd, "b_root": quantized}, t / "quantized.pt")
    # task descriptions
    tj = task.to_dict()
    (t / "frac_task.json").write_text(json.dumps({**tj, "n_examples": 10.9}))
    (t / "bool_task.json").write_text(json.dumps({**tj, "seq_len": True}))
    (t / "big_task.json").write_text(json.dumps({**tj, "seq_len": 10**6}))
    (t / "nested.json").write_text(_nested(100_000))
    (t / "cfgdir").mkdir()
    (t / "new\nline").mkdir()
    shutil.copytree(t / "ckpt", t / "new\nline" / "ckpt")
    shutil.rmtree(t / "new\nline" / "ckpt")  # a missing checkpoint whose path holds a newline
    return t


def _train(*argv):
    return train.main, [*TINY, "--steps", "3", "--eval-every", "3", *argv]


def _evaluate(*argv):
    return lambda a: run_cli(evaluate.main, a), ["--n-contexts", "8", "--batch-size", "8", *argv]


def _head_ablation(*argv):
    from analyses import head_ablation

    return lambda a: run_cli(head_ablation.main, a), [*argv]


def _copyers(*argv):
    return lambda a: run_cli(copyers.main, a), [*argv]


def _out(t: Path, name: str = "out") -> list[str]:
    return ["--out", str(t / name)]


# (kind, id, (t) -> (main, argv), expected text in the one line); one case a row, so rows look alike (`duplicates`
# pairs the table with itself: data, not logic)
CASES = [
    # --- work lost: nothing replaced unless asked; --resume only of a run that has training state -----
    ("work", "train into a checkpoint", lambda t: _train(*_out(t, "ckpt")), "refusing to replace it"),
    ("work", "train into a run", lambda t: _train(*_out(t, "run")), "--overwrite to replace it or --resume"),
    ("work", "resume without state", lambda t: _train("--resume", *_out(t, "ckpt")), "has no training state"),
    ("work", "resume a missing run", lambda t: _train("--resume", *_out(t, "absent")), "does not exist"),
    ("work", "train into other files", lambda t: _train(*_out(t, "notes")), "not a checkpoint folder"),
    ("work", "overwrite other files", lambda t: _train("--overwrite", *_out(t, "notes")), "not a checkpoint folder"),
    ("work", "train --out a file", lambda t: _train(*_out(t, "afile")), "is a file"),
    (
        "work",
        "resume, other config",
        lambda t: _train("--resume", "--seed", "5", *_out(t, "run")),
        "differs in ['seed']",
    ),
    ("work", "resume, state not tensors", lambda t: _train("--resume", *_out(t, "bad_state_tensors")), "unreadable"),
    ("work", "resume, state truncated", lambda t: _train("--resume", *_out(t, "truncated_state")), "unreadable"),
    ("work", "resume, state not JSON", lambda t: _train("--resume", *_out(t, "bad_state_json")), "not valid JSON"),
    (
        "work",
        "resume, state lacks fields",
        lambda t: _train("--resume", *_out(t, "bad_state_fields")),
        "not a training state",
    ),
    ("work", "resume, negative step", lambda t: _train("--resume", *_out(t, "bad_state_step")), "step must be >= 1"),
    ("work", "resume, no training record", lambda t: _train("--resume", *_out(t, "no_record")), "no training record"),
    ("work", "train --out dangling link", lambda t: _train(*_out(t, "dangling")), "which does not exist"),
    ("work", "train --out under /proc", lambda t: _train("--out", "/proc/robustness/x"), "is not writable"),
    ("work", "analysis --out a file", lambda t: _copyers(*_out(t, "afile")), "is a file"),
    ("work", "analysis --out dangling link", lambda t: _copyers(*_out(t, "dangling")), "which does not exist"),
    ("work", "analysis --out under /proc", lambda t: _copyers("--out", "/proc/robustness"), "not writable"),
    (
        "work",
        "evaluate --json in a file",
        lambda t: _evaluate("--json", str(t / "afile" / "m.json")),
        "is a file",
    ),
    ("work", "evaluate --json a folder", lambda t: _evaluate("--json", str(t / "notes")), "is a folder"),
    # --- hangs and memory bombs: sizes bounded, memory estimated before allocating ------------------
    ("bomb", "alpha nan", lambda t: _train("--alpha", "nan", *_out(t)), "--alpha must be a finite number in (0, 1000000.0]"),
    ("bomb", "alpha inf", lambda t: _train("--alpha", "inf", *_out(t)), "--alpha must be a finite number"),
    ("bomb", "alpha underflows", lambda t: _train("--alpha", "1e-300", *_out(t)), "--alpha=1e-300 is too small"),
    ("bomb", "gamma nan", lambda t: _train("--gamma", "nan", *_out(t)), "--gamma must be a finite number in [0, 1]"),
    ("bomb", "seq-len huge", lambda t: _train("--seq-len", "100000", *_out(t)), "--seq-len must be in [2, 65536]"),
    ("bomb", "n-examples huge", lambda t: _train("--n-examples", "70000", *_out(t)), "--n-examples must be in"),
    ("bomb", "d-vocab huge", lambda t: _train("--d-vocab", "5000", *_out(t)), "--d-vocab must be in [2, 4096]"),
    (
        "bomb",
        "context too long",
        lambda t: _train("--n-examples", "2000", "--seq-len", "1000", *_out(t)),
        "exceed the bound of 1048576",
    ),
    (
        "bomb",
        "heads huge",
        lambda t: _train("--n-copy-heads", "60000", *_out(t)),
        "the model of this config would need",
    ),
    ("bomb", "batch huge", lambda t: _train("--batch-size", HUGE, *_out(t)), "--batch-size 10000000000"),
    ("bomb", "eval contexts huge", lambda t: _train("--eval-contexts", HUGE, *_out(t)), "--eval-contexts 10000000000"),
    (
        "bomb",
        "evaluate chunk huge",
        lambda t: _evaluate("--n-contexts", HUGE, "--batch-size", HUGE),
        "--n-contexts 10000000000",
    ),
    ("bomb", "analysis n-contexts huge", lambda t: _head_ablation("--n-contexts", HUGE, *_out(t)), "--n-contexts must be in [1, 10000000]"),
    ("bomb", "config seq_len huge", lambda t: _evaluate("--checkpoint", str(t / "huge_seq_len")), "seq_len must be in"),
    ("bomb", "config seq_len vs weights", lambda t: _evaluate("--checkpoint", str(t / "big_seq_len")), "wrong shape"),
    (
        "bomb",
        "task.json seq_len huge",
        lambda t: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(t / "big_task.json")),
        "seq_len must be",
    ),
    ("bomb", "theorem1 beta nan", lambda t: _evaluate("--checkpoint", "theorem1:beta=nan"), "bad beta"),
    ("bomb", "theorem1 beta inf", lambda t: _evaluate("--checkpoint", "theorem1:beta=inf"), "bad beta"),
    # --- wrong numbers with exit 0: every float finite, integers integers, the task against the model -
    ("numbers", "lr nan", lambda t: _train("--lr", "nan", *_out(t)), "--lr must be a finite number > 0"),
    ("numbers", "lr inf", lambda t: _train("--lr", "inf", *_out(t)), "--lr must be a finite number > 0"),
    ("numbers", "lr negative", lambda t: _train("--lr", "-1", *_out(t)), "--lr must be a finite number > 0"),
    ("numbers", "lr zero", lambda t: _train("--lr", "0", *_out(t)), "--lr must be a finite number > 0"),
    ("numbers", "lr diverges", lambda t: _train("--lr", "1e30", *_out(t)), "training diverged at step 3"),
    ("numbers", "copyer lr scale nan", lambda t: _train("--copyer-lr-scale", "nan", *_out(t)), "--copyer-lr-scale"),
    ("numbers", "final lr fraction 2", lambda t: _train("--final-lr-fraction", "2", *_out(t)), "in [0, 1]"),
    ("numbers", "init demo nan", lambda t: _train("--init-demo", "nan", *_out(t)), "--init-demo must be a finite"),
    (
        "numbers",
        "init offset inf",
        lambda t: _train("--init-offset", "inf", *_out(t)),
        "--init-offset must be a finite",
    ),
    ("numbers", "rho 1", lambda t: _train("--task-kind", "continuous", "--rho", "1", *_out(t)), "--rho must be"),
    ("numbers", "rho nan", lambda t: _train("--rho", "nan", *_out(t)), "--rho must be a finite number in (0, 1)"),
    ("numbers", "seed negative", lambda t: _train("--seed", "-1", *_out(t)), "--seed must be in [0, "),
    ("numbers", "steps fractional", lambda t: _train("--steps", "2.5", *_out(t)), "invalid int value: '2.5'"),
    (
        "numbers",
        "float64 weights overflow float32 (file)",
        lambda t: _evaluate("--checkpoint", str(t / "overflow.safetensors"), "--config", str(t / "overflow.json")),
        "beyond the float32 range",
    ),
    (
        "numbers",
        "float64 weights overflow float32 (folder)",
        lambda t: _evaluate("--checkpoint", str(t / "overflow")),
        "beyond the float32 range",
    ),
    (
        "numbers",
        "--dtype float32 overflows float64 weights",
        lambda t: _evaluate("--checkpoint", str(t / "overflow64"), "--dtype", "float32"),
        "b_root overflow float32",
    ),
    (
        "numbers",
        "task disagrees with the model (evaluate)",
        lambda t: _evaluate("--checkpoint", str(t / "task_disagrees")),
        "the task's n_examples=4 disagrees with the model's n_examples=3",
    ),
    (
        "numbers",
        "task disagrees with the model (analysis)",
        lambda t: _copyers("--checkpoint", str(t / "task_disagrees"), *_out(t)),
        "disagrees with the model's",
    ),
    (
        "numbers",
        "task.json n_examples 10.9",
        lambda t: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(t / "frac_task.json")),
        "10.9",
    ),
    (
        "numbers",
        "task.json seq_len true",
        lambda t: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(t / "bool_task.json")),
        "seq_len",
    ),
    ("numbers", "config n_examples 3.5", lambda t: _evaluate("--checkpoint", str(t / "fractional_l")), "integer"),
    (
        "numbers",
        "key map with a folder",
        lambda t: _evaluate("--checkpoint", str(t / "ckpt"), "--key-map", str(t / "cfg.json")),
        "apply to weight files only",
    ),
    (
        "numbers",
        "config with a folder",
        lambda t: _evaluate("--checkpoint", str(t / "ckpt"), "--config", str(t / "cfg.json")),
        "apply to weight files only",
    ),
    # --- tracebacks: one line instead --------------------------------------------------------------
    (
        "traceback",
        "model section a list",
        lambda t: _evaluate("--checkpoint", str(t / "model_list")),
        "'model' section",
    ),
    ("traceback", "task missing", lambda t: _evaluate("--checkpoint", str(t / "task_missing")), "no task section"),
    ("traceback", "task null", lambda t: _evaluate("--checkpoint", str(t / "task_null")), "no task section"),
    ("traceback", "config nested deeply", lambda t: _evaluate("--checkpoint", str(t / "nested")), "nested too deeply"),
    ("traceback", "config not JSON", lambda t: _evaluate("--checkpoint", str(t / "not_json")), "not valid JSON"),
    ("traceback", "config d_vocab a string", lambda t: _evaluate("--checkpoint", str(t / "string_d")), "integer"),
    ("traceback", "config unknown field", lambda t: _evaluate("--checkpoint", str(t / "unknown_field")), "unknown"),
    (
        "traceback",
        "weights truncated",
        lambda t: _evaluate("--checkpoint", str(t / "truncated_weights")),
        "not a readable safetensors file",
    ),
    (
        "traceback",
        "weights missing",
        lambda t: _evaluate("--checkpoint", str(t / "no_weights")),
        "has no model.safetensors",
    ),
    (
        "traceback",
        "nested task.json",
        lambda t: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(t / "nested.json")),
        "nested too deeply",
    ),
    *(
        (
            "traceback",
            f"{kind} tensor in a .pt",
            lambda t, kind=kind: _evaluate("--checkpoint", str(t / f"{kind}.pt"), "--config", str(t / "cfg.json")),
            "b_root",
        )
        for kind in ("sparse", "meta", "float8", "int", "quantized")
    ),
    ("traceback", "long name --checkpoint", lambda t: _evaluate("--checkpoint", str(t / LONG)), "the limit is 255"),
    (
        "traceback",
        "long name --config",
        lambda t: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(t / LONG)),
        "limit is 255",
    ),
    ("traceback", "long name --out (train)", lambda t: _train("--out", str(t / LONG / "x")), "the limit is 255"),
    ("traceback", "long name --out (analysis)", lambda t: _copyers("--out", str(t / LONG)), "the limit is 255"),
    ("traceback", "long name --json", lambda t: _evaluate("--json", str(t / f"{LONG}.json")), "the limit is 255"),
    ("traceback", "NUL in a path", lambda t: _evaluate("--checkpoint", str(t / "a\x00b")), "NUL byte"),
    # --- messages that mislead: the flag that was wrong is named -------------------------------------
    (
        "message",
        "device unknown (evaluate)",
        lambda t: _evaluate("--device", "foo"),
        "--device 'foo' is not a torch device",
    ),
    ("message", "device unusable (evaluate)", lambda t: _evaluate("--device", "mps"), "--device 'mps' cannot be used"),
    ("message", "device cuda absent (evaluate)", lambda t: _evaluate("--device", "cuda:7"), "--device 'cuda:7'"),
    (
        "message",
        "device unusable (train)",
        lambda t: _train("--device", "mps", *_out(t)),
        "--device 'mps' cannot be used",
    ),
    ("message", "device unknown (analysis)", lambda t: _copyers("--device", "foo", *_out(t)), "--device 'foo'"),
    ("message", "seed 2**64 (evaluate)", lambda t: _evaluate("--seed", str(2**64)), "--seed must be in"),
    ("message", "seed 2**64 (train)", lambda t: _train("--seed", str(2**64), *_out(t)), "--seed must be in"),
    (
        "message",
        "task seed 2**64 (train)",
        lambda t: _train("--task-seed", str(2**64), *_out(t)),
        "--task-seed must be in",
    ),
    ("message", "seed 2**64 (analysis)", lambda t: _copyers("--seed", str(2**64), *_out(t)), "--seed must be in"),
    ("message", "threads 0", lambda t: _evaluate("--threads", "0"), "--threads must be in [1, 1024]"),
    ("message", "n-contexts 0", lambda t: _evaluate("--n-contexts", "0"), "--n-contexts must be >= 1"),
    (
        "message",
        "stray task.json",
        lambda t: _evaluate("--checkpoint", str(t / "stray_task")),
        "with a stray task.json",
    ),
    (
        "message",
        "--config a folder",
        lambda t: _evaluate("--checkpoint", str(t / "good.pt"), "--config", str(t / "cfgdir")),
        "is a folder",
    ),
    (
        "message",
        "--key-map a folder",
        lambda t: _evaluate(
            "--checkpoint", str(t / "good.pt"), "--config", str(t / "cfg.json"), "--key-map", str(t / "cfgdir")
        ),
        "is a folder",
    ),
    (
        "message",
        "newline in --checkpoint",
        lambda t: _evaluate("--checkpoint", str(t / "new\nline" / "ckpt")),
        "new\\nline",
    ),
    ("message", "newline in --out", lambda t: _copyers("--out", str(t / "afile" / "new\nline" / "x")), "new\\nline"),
    ("message", "unknown flag", lambda t: _train("--lrr", "1"), "unrecognized arguments: --lrr 1"),
]


def assert_one_line(main, argv: list[str], expected: str, folders: list[Path], capsys, code: int = 2) -> None:
    """``main(argv)`` exits ``code`` with exactly ONE line on stderr containing ``expected``, no warning
    and no traceback, and every file under ``folders`` and the shipped checkpoint byte-identical."""
    before, shipped = [tree(f) for f in folders], tree(checkpoint.DEFAULT_CHECKPOINT)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as exit_info:
        warnings.resetwarnings()  # Python's own defaults: what a user's terminal would show
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        main(argv)
    assert not caught, [str(w.message)[:120] for w in caught]  # a warning would be more lines on stderr
    out = capsys.readouterr()
    err = [line for line in out.err.splitlines() if line.strip()]
    assert exit_info.value.code == code, (argv, out.err)
    assert len(err) == 1, err
    assert expected in err[0], err
    assert "Traceback" not in out.err
    assert [tree(f) for f in folders] == before
    assert tree(checkpoint.DEFAULT_CHECKPOINT) == shipped


@pytest.mark.parametrize("kind,name,make,expected", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_cli_bad_input_is_one_line_exit_2_and_changes_nothing(lab, capsys, kind, name, make, expected):
    main, argv = make(lab)
    assert_one_line(main, argv, expected, [lab], capsys)


def test_catalogue_has_every_kind_and_sixty_cases():
    kinds = {c[0] for c in CASES}
    assert kinds == {"work", "bomb", "numbers", "traceback", "message"}
    assert len(CASES) >= 60


def test_a_bug_is_its_traceback_exit_1_and_bad_input_one_line_exit_2(capsys):
    """Errors by kind (issue 42): an exception that is not bad input is a bug of the suite: its traceback, a
    last line saying so and where to report it, exit code 1. Bad input (``UsageError``) stays one line and exit
    code 2, its traceback only with ``--debug``. A plain ValueError is not bad input."""

    def boom(argv):
        raise KeyError("deep inside")

    for bug in (boom, lambda argv: int("not a number")):  # a KeyError; a ValueError raised by Python itself
        with pytest.raises(SystemExit) as e:
            run_cli(bug, [], "python -m analyses.x")
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 1 and err[0] == "Traceback (most recent call last):"
        assert err[-1].startswith("python -m analyses.x: error: this is a bug in causal-icl-probes, not a problem with your input")
        assert "please report it" in err[-1]

    def bad(argv):
        raise UsageError("--n-contexts must be >= 1, got 0")

    with pytest.raises(SystemExit) as e:
        run_cli(bad, [], "python -m analyses.x")
    assert e.value.code == 2 and capsys.readouterr().err.splitlines() == [
        "python -m analyses.x: error: --n-contexts must be >= 1, got 0"
    ]
    with pytest.raises(SystemExit) as e:
        run_cli(bad, ["--debug"], "python -m analyses.x")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" in err and err.strip().splitlines()[-1].endswith("got 0")


def test_an_internal_error_in_an_analysis_exits_1_with_its_traceback(tmp_path):
    """A deliberately raised internal error inside an analysis's compute, through the analysis's own entry
    (``common.run`` of its ``main``, as ``python -m`` runs it), in a process of its own (forked from the
    suite's server, tests/helpers/forked.py): exit code 1, the traceback naming where it was raised, the bug
    line last, and no file written."""
    code = (
        "import sys\n"
        "from analyses import common, copyers\n"
        "def compute(subject, args):\n"
        "    raise RuntimeError('an invariant of the analysis broke')\n"
        "copyers.ANALYSIS.compute = compute\n"
        "common.run_cli(copyers.ANALYSIS.main, sys.argv[1:])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = forked.run("-c", code, "--out", str(tmp_path / "out"), cwd=ROOT, env=env)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last):" in err and "RuntimeError: an invariant of the analysis broke" in err
    assert err[-1].startswith("python -m analyses.copyers: error: this is a bug in causal-icl-probes")
    assert not (tmp_path / "out" / "copyers.json").exists()
    # the same entry with bad input: one line, exit 2
    proc = forked.run("-c", code, "--seed", "-1", cwd=ROOT, env=env)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "python -m analyses.copyers: error: --seed must be in [0, 9223372036854775807], got -1"
    ], proc.stderr


def test_save_refuses_a_model_without_its_task(tmp_path):
    model, task = small_model()
    with pytest.raises(ValueError, match="needs task="):
        models.save(model, tmp_path / "c")
    with pytest.raises(ValueError, match="disagrees"):
        models.save(model, tmp_path / "c", task=build_task(n_examples=4))
    assert list(tmp_path.iterdir()) == []
