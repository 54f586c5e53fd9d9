"""The fourth robustness catalogue (issue 37): each class of failure the fourth adversarial pass found is a
RULE, tested across every place it applies, not as the one case that was found. The rules:

- size before read, for every weight format;
- every float that reaches a tensor checked for range (key-map constants included);
- every count flag bounded before work;
- every path kind (FIFO, socket, device, symlink loop, dangling link, non-UTF-8) named as what it is, and a
  valid input at a non-UTF-8 path read;
- one lock per output for every writer (trainers, ``--histories``, ``--json``);
- nothing deleted before its replacement is written (``--overwrite``'s snapshots, a symlinked ``--out``,
  a kill near a snapshot);
- never write into what you read, through ``from=`` specs and side configs;
- a loaded model whose weights do not cover its config, or the reverse, refused by name;
- no NaN or Inf written where a number is promised;
- every float flag finite and in range.

Each command runs as ``python -m`` runs it, in this process (``run``: tests/helpers/inproc.py), its exit code
and stderr captured: bad input must exit 2 with ONE line on stderr naming the problem, and leave every file as
it was. In a process of its own, forked from a server that has done the imports (``run_forked``:
tests/helpers/forked.py), run what only a process shows (another process holding a lock) and the refusals that
come before any work (count and float flags, the gallery), which are each entry point's smoke run as a user
starts it. A training that a case only reads or starts from is trained once a session (``trained``,
tests/conftest.py) and copied into the case's folder."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from unittest import mock

import forked
import inproc
import pytest
import safetensors.torch
import torch
from test_cli_bad_input import TINY
from test_formats import file_config, hf_folder, small_model
from test_formats_pipelines import (
    PaperLiteral,
    paper_key_map,
    small_task,
    tl_cfg_dict,
    tl_state,
    write_nanogpt,
    write_paper_literal,
    write_task,
)
from test_work_never_lost import tree

import models
from models.loading import checkpoint
from models.loading.checkpoint import training_lock
from models.loading.sources import resolve
from models.plumbing import io

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # a bound on a hang, not on speed: each case takes about a second
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
EVALUATE = ("models.evaluate", "--n-contexts", "8", "--batch-size", "8")
TRAIN = ("models.train", *TINY, "--steps", "2", "--eval-every", "2")
STANDARD = (
    "models.standard",
    *("--d-vocab", "3", "--n-examples", "2", "--seq-len", "3", "--n-layers", "1", "--n-heads", "2"),
    *("--d-model", "8", "--d-mlp", "8", "--batch-size", "4", "--eval-contexts", "8", "--steps", "2"),
    *("--eval-every", "2"),
)
BAD_NAME = os.fsdecode(b"ck\xff")  # a name the shell allows that is not UTF-8


def run(module: str, *argv: str, cwd: Path = ROOT) -> forked.Completed:
    """``python -m module argv`` in this process."""
    return inproc.run(module, *argv, cwd=cwd, env=ENV)


def run_forked(module: str, *argv: str, cwd: Path = ROOT) -> forked.Completed:
    """``python -m module argv`` in a process of its own."""
    return forked.run(module, *argv, cwd=cwd, env=ENV, timeout=TIMEOUT_S)


def refused(proc: forked.Completed, expected: str) -> None:
    """Exit 2 and one line on stderr that holds ``expected``, no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.args, proc.stderr[-2000:])
    assert len(lines) == 1, lines
    assert expected in lines[0], lines[0]


def ok(proc: forked.Completed) -> forked.Completed:
    assert proc.returncode == 0, (proc.args, proc.stderr[-2000:])
    return proc


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """Inputs of every format, made once; no case may change them (``unchanged`` checks)."""
    t = tmp_path_factory.mktemp("rules")
    model, task = small_model()
    models.save(model, t / "ckpt", task=task)
    (t / "wf").mkdir()
    safetensors.torch.save_file(model.state_dict(), t / "wf" / "w.safetensors")
    (t / "wf" / "w.json").write_text(json.dumps(file_config(model, task)))
    torch.save(model.state_dict(), t / "good.pt")
    (t / "cfg.json").write_text(json.dumps(file_config(model, task)))
    hf_folder(t, task)
    ptask = small_task()
    write_paper_literal(t / "paper", ptask, PaperLiteral(ptask.d_vocab, ptask.n_examples, ptask.seq_len))
    for name, change in {
        "pad_huge": lambda m: m["w_L"]["pad"].update(value=1e39),
        "default_huge": lambda m: m.setdefault("default", {}).update(b_root=-1e39),
    }.items():
        key_map = paper_key_map(ptask.d_vocab)
        change(key_map)
        (t / f"{name}.json").write_text(json.dumps(key_map))
    return t


def unchanged(folder: Path):
    """A context: every file under ``folder`` and the shipped checkpoint byte-identical afterwards."""

    class Same:
        def __enter__(self):
            self.before, self.shipped = tree(folder), tree(checkpoint.DEFAULT_CHECKPOINT)

        def __exit__(self, *exc):
            if exc[0] is None:
                assert tree(folder) == self.before
                assert tree(checkpoint.DEFAULT_CHECKPOINT) == self.shipped

    return Same()


# --- size before read, for every weight format ---------------------------------------------------------


def _formats(t: Path) -> dict[str, dict]:
    """A file of each weight format (and a key-mapped one), with what ``resolve`` needs."""
    model, task = small_model()
    t.mkdir(exist_ok=True)
    (t / "cfg.json").write_text(json.dumps(file_config(model, task)))
    torch.save(model.state_dict(), t / "w.pt")
    torch.save(model.state_dict(), t / "legacy.pt", _use_new_zipfile_serialization=False)
    safetensors.torch.save_file(model.state_dict(), t / "w.safetensors")
    ptask = small_task()
    paper, key_map = write_paper_literal(t / "paper", ptask, PaperLiteral(ptask.d_vocab, ptask.n_examples, ptask.seq_len))
    nano, _, _ = write_nanogpt(t / "nano", ptask, {})
    (t / "tl").mkdir()
    cfg = tl_cfg_dict(n_layers=1, d_model=8, d_head=4, n_heads=2, d_vocab=8, d_vocab_out=8, n_ctx=24, d_mlp=16)
    torch.save(tl_state(cfg, True), t / "tl" / "w.pt")
    (t / "tl" / "w.json").write_text(json.dumps(cfg))
    write_task(t / "tl", ptask, {})
    return {
        "state dict .pt": dict(spec=t / "w.pt", config=str(t / "cfg.json")),
        "legacy (non-zip) .pt": dict(spec=t / "legacy.pt", config=str(t / "cfg.json")),
        "safetensors": dict(spec=t / "w.safetensors", config=str(t / "cfg.json")),
        "key-mapped .pt": dict(spec=paper, key_map=str(key_map)),
        "nanoGPT ckpt.pt": dict(spec=nano),
        "TransformerLens .pt": dict(spec=t / "tl" / "w.pt"),
    }


@pytest.mark.parametrize(
    "name",
    ["state dict .pt", "legacy (non-zip) .pt", "safetensors", "key-mapped .pt", "nanoGPT ckpt.pt", "TransformerLens .pt"],
)
def test_every_weight_format_is_sized_before_a_byte_of_it_is_read(tmp_path, name):
    """With a memory bound below the file's size, every format is refused naming the file, and no reader
    (torch.load, safetensors) is ever called: the file is sized before it is read."""
    case = _formats(tmp_path)[name]
    size = case["spec"].stat().st_size
    with (
        mock.patch.object(io, "memory_limit", lambda device=None: (size, "a bound below the file (test)")),
        mock.patch("models.loading.sources.files._torch_load", side_effect=AssertionError("read before it was sized")),
        mock.patch("safetensors.torch.load_file", side_effect=AssertionError("read before it was sized")),
        pytest.raises(ValueError, match=r"reading .* would need about"),
    ):
        resolve(case.pop("spec"), **case)


def test_every_weight_format_reads_under_a_bound_above_its_size(tmp_path):
    """The converse: the same files load when the bound allows them (the check refuses only what is too big)."""
    for name, case in _formats(tmp_path).items():
        assert resolve(case.pop("spec"), **case).model is not None, name


# --- every float that reaches a tensor is checked for range ---------------------------------------------


@pytest.mark.parametrize(
    "key_map,expected",
    [
        ("pad_huge", "key map entry 'w_L': pad value 1e+39 is beyond the float32 range"),
        ("default_huge", "key map default 'b_root' -1e+39 is beyond the float32 range"),
    ],
)
def test_a_key_map_constant_beyond_the_tensors_dtype_names_the_key_and_the_dtype(lab, key_map, expected):
    with unchanged(lab):
        refused(run(*EVALUATE, "--checkpoint", str(lab / "paper" / "paper.pt"), "--key-map", str(lab / f"{key_map}.json")), expected)


def test_a_key_map_pad_into_an_integer_tensor_names_its_dtype(tmp_path):
    ptask = small_task()
    paper, _ = write_paper_literal(tmp_path / "p", ptask, PaperLiteral(ptask.d_vocab, ptask.n_examples, ptask.seq_len))
    state = torch.load(paper, weights_only=True)
    torch.save({**state, "w_L": state["w_L"].to(torch.int32)}, paper)
    with pytest.raises(ValueError, match="pad value -10000.0 would go into a tensor of dtype int32; expected float"):
        resolve(paper, key_map=paper_key_map(ptask.d_vocab))


# --- every count flag bounded before work -----------------------------------------------------------------

COUNT_FLAGS = [
    ("models.evaluate", "--n-contexts", str(10**12), "is more than the bound of 10000000 contexts"),
    ("analyses.inspect", "--n-contexts", str(10**12), "--n-contexts must be in [2, 10000000]"),
    ("analyses.head_ablation", "--n-contexts", str(10**12), "--n-contexts must be in [1, 10000000]"),
    ("analyses.init_gradient", "--n-contexts", str(10**7), "target sequences, more than the bound"),
    ("analyses.init_gradient", "--n-trees", str(10**9), "target sequences, more than the bound"),
    ("analyses.init_gradient", "--steps", str(10**12), "--steps must be in [1, 100000]"),
    ("analyses.circuit", "--curve-points", str(10**12), "--curve-points must be in [1, 1000]"),
]


@pytest.mark.parametrize("module,flag,value,expected", COUNT_FLAGS, ids=[f"{c[0]} {c[1]}" for c in COUNT_FLAGS])
def test_every_count_flag_is_bounded_before_any_work(tmp_path, module, flag, value, expected):
    """A huge count is one line at once (before a model is loaded or a context drawn), whatever chunking
    would have bounded its memory: the work itself grows with it."""
    start = time.perf_counter()
    out = ["--out", str(tmp_path / "out")] if module.startswith("analyses") else []
    refused(run_forked(module, flag, value, *out, cwd=tmp_path), expected)
    assert not (tmp_path / "out").exists()
    assert time.perf_counter() - start < TIMEOUT_S


# --- every path kind named as what it is ------------------------------------------------------------------


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("kinds")
    os.mkfifo(t / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(t / "sock"))
    os.symlink(t / "loop_b", t / "loop_a")
    os.symlink(t / "loop_a", t / "loop_b")
    os.symlink(t / "nowhere", t / "dangling")
    yield {
        "FIFO": (t / "fifo", "is a named pipe (FIFO)"),
        "socket": (t / "sock", "is a socket"),
        "device": (Path("/dev/null"), "is a device"),
        "symlink loop": (t / "loop_a", "is a symlink loop"),
        "dangling symlink": (t / "dangling", "which does not exist"),
    }
    sock.close()


PATH_FLAGS = {
    "--checkpoint": lambda lab, p: (*EVALUATE, "--checkpoint", str(p)),
    "--config": lambda lab, p: (*EVALUATE, "--checkpoint", str(lab / "good.pt"), "--config", str(p)),
    "--key-map": lambda lab, p: (*EVALUATE, "--checkpoint", str(lab / "good.pt"), "--config", str(lab / "cfg.json"), "--key-map", str(p)),
    "--json": lambda lab, p: (*EVALUATE, "--checkpoint", str(lab / "ckpt"), "--json", str(p)),
    "--out (train)": lambda lab, p: (*TRAIN, "--out", str(p)),
    "--out (analysis)": lambda lab, p: ("analyses.copyers", "--checkpoint", str(lab / "ckpt"), "--out", str(p)),
}


@pytest.mark.parametrize("kind", ["FIFO", "socket", "device", "symlink loop", "dangling symlink"])
@pytest.mark.parametrize("flag", list(PATH_FLAGS))
def test_every_path_flag_names_every_path_kind(lab, kinds, flag, kind):
    path, expected = kinds[kind]
    with unchanged(lab):
        refused(run(*PATH_FLAGS[flag](lab, path)), expected)


def test_a_checkpoint_at_a_path_that_is_not_utf8_reads_as_at_any_other(lab, tmp_path):
    """A valid checkpoint folder, weight file and Hugging Face folder at names the shell allows but UTF-8
    does not give the numbers they give at a UTF-8 name."""
    for source, argv in {
        "ckpt": lambda p: ("--checkpoint", str(p)),
        "wf": lambda p: ("--checkpoint", str(p / "w.safetensors")),
    }.items():
        shutil.copytree(lab / source, tmp_path / BAD_NAME)
        theirs = ok(run(*EVALUATE, *argv(lab / source), "--json", str(tmp_path / "a.json")))
        ours = ok(run(*EVALUATE, *argv(tmp_path / BAD_NAME), "--json", str(tmp_path / "b.json")))
        a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
        assert {k: v for k, v in a.items() if k != "command"} == {k: v for k, v in b.items() if k != "command"}
        assert theirs.stdout.split(":", 1)[1] == ours.stdout.split(":", 1)[1]
        shutil.rmtree(tmp_path / BAD_NAME)
    shutil.copytree(lab / "hf", tmp_path / BAD_NAME)
    assert models.load_subject(str(tmp_path / BAD_NAME)).model is not None


def test_an_output_at_a_name_that_is_not_utf8_is_named_as_such(lab, tmp_path):
    with unchanged(lab):
        refused(run(*TRAIN, "--out", str(tmp_path / BAD_NAME)), "is not valid UTF-8; expected a UTF-8 name for an output")
    assert list(tmp_path.iterdir()) == []


# --- one lock per output, for every writer --------------------------------------------------------------


def test_a_standard_training_into_an_out_another_trains_into_is_refused_at_once(tmp_path):
    out = tmp_path / "out"
    with io.exclusive_lock(training_lock(out), wait=False):  # as a running training (either trainer) holds it
        refused(run_forked(*STANDARD, "--out", str(out)), "another process is writing --out")
    assert not out.exists()


def test_two_standard_trainings_into_one_out_cannot_both_write_it(tmp_path, trained):
    """The second, run after the first (no --overwrite), is refused; the first model is kept byte for byte."""
    out = trained(STANDARD, tmp_path / "out")
    first = tree(out)
    refused(run(*STANDARD, "--seed", "1", "--out", str(out)), "is not empty")
    assert tree(out) == first


def _run_in_thread(*argv, cwd):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("proc", run_forked(*argv, cwd=cwd)))
    thread.start()
    return thread, box


def test_two_collections_into_one_histories_file_keep_every_run(lab, tmp_path, trained):
    """Two ``analyses.scale --from-runs`` at once take turns on ``--histories``: both runs are in it after
    (unlocked, each read the file, added its run and wrote it: one run was lost)."""
    train_run = trained(TRAIN, tmp_path / "run")
    histories = tmp_path / "h.json"
    lock = tmp_path / ".h.json.lock"
    with io.exclusive_lock(lock):  # both start, and wait on the lock, before either reads the file
        threads = [
            _run_in_thread("analyses.scale", "--from-runs", f"{label}={train_run}", "--histories", str(histories),
                           "--out", str(tmp_path / f"fig_{label}"), cwd=tmp_path)  # fmt: skip
            for label in ("first", "second")
        ]
        time.sleep(3)
        assert not histories.exists()  # neither wrote while the lock was held
    for thread, box in threads:
        thread.join()
        ok(box["proc"])
    assert set(json.loads(histories.read_text())) == {"first", "second"}


def test_a_json_output_is_checked_again_under_its_lock_before_it_is_replaced(lab, tmp_path):
    """While ``models.evaluate`` waits on the lock of its --json, another program writes that file: the run
    must not replace it (it is not this command's output), and the file is kept."""
    out = tmp_path / "m.json"
    with io.exclusive_lock(tmp_path / ".m.json.lock"):
        thread, box = _run_in_thread(*EVALUATE, "--checkpoint", str(lab / "ckpt"), "--json", str(out), cwd=tmp_path)
        time.sleep(3)
        out.write_text('{"someone": "else"}\n')
    thread.join()
    refused(box["proc"], "exists and is not an earlier output of python -m models.evaluate")
    assert out.read_text() == '{"someone": "else"}\n'


# --- nothing deleted before its replacement is written ---------------------------------------------------


def _run_with_snapshots(out: Path, *extra) -> forked.Completed:
    return run(*TRAIN, "--snapshot-every", "2", "--out", str(out), *extra)


def test_overwrite_keeps_the_old_snapshots_until_the_new_run_has_saved(tmp_path, trained):
    """A new run over an old one (--overwrite) that diverges before its first save leaves the old run,
    snapshots included, exactly as it was; one that saves replaces them, none of the old left to mix in."""
    out = trained((*TRAIN, "--snapshot-every", "2"), tmp_path / "run")
    old = tree(out)
    assert "snapshots/step_000002/model.safetensors" in old
    refused(_run_with_snapshots(out, "--overwrite", "--lr", "1e30"), "")  # diverges: NaN before step 2 saves
    assert tree(out) == old
    ok(_run_with_snapshots(out, "--overwrite", "--seed", "1", "--steps", "4", "--eval-every", "4"))
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == ["step_000002", "step_000004"]
    assert (out / "snapshots" / "step_000002" / checkpoint.WEIGHTS).read_bytes() != old["snapshots/step_000002/model.safetensors"]


@pytest.mark.parametrize("module", ["train", "standard"])
def test_a_symlinked_out_is_written_through_and_the_link_stays(tmp_path, module):
    """``--overwrite --out LINK``: the folder LINK points to is replaced, the link is kept, nothing is left
    beside either, and later runs through the link still work."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    command = TRAIN if module == "train" else STANDARD
    for seed in ("0", "1", "2"):
        ok(run(*command, "--snapshot-every", "2", "--seed", seed, "--overwrite", "--out", str(tmp_path / "link")))
        assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == str(target)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]
        assert (target / "snapshots" / "step_000002").is_dir()
        assert not [p for p in (target / "snapshots").iterdir() if p.name.startswith(".")]


FOUR_STEPS = (*TRAIN, "--steps", "4", "--snapshot-every", "2")  # a snapshot at steps 2 and 4


def test_a_kill_between_a_checkpoint_and_its_snapshot_is_mended_by_resume(tmp_path, trained):
    """Killed after the step-4 checkpoint was written and before its snapshot: the run's folder holds the
    resumable checkpoint of step 4 and no snapshots/step_000004. ``--resume`` writes the missing snapshot,
    with the step-4 weights."""
    out = trained(FOUR_STEPS, tmp_path / "run")
    shutil.rmtree(out / "snapshots" / "step_000004")  # the state the kill leaves
    assert json.loads((out / checkpoint.TRAIN_META).read_text())["step"] == 4
    ok(run(*FOUR_STEPS, "--out", str(out), "--resume"))
    snapshot = out / "snapshots" / "step_000004"
    assert (snapshot / checkpoint.WEIGHTS).read_bytes() == (out / checkpoint.WEIGHTS).read_bytes()
    assert json.loads((snapshot / checkpoint.CONFIG).read_text())["training"]["step"] == 4


def test_a_kill_inside_a_snapshot_write_leaves_nothing_after_resume(tmp_path, trained):
    """A kill -9 inside the write of snapshots/step_000002 leaves ``.step_000002.new`` and its ``.lock``
    there; the next run (``--resume``) recovers them, as it recovers --out itself."""
    out = trained(FOUR_STEPS, tmp_path / "run")
    snaps = out / "snapshots"
    shutil.copytree(snaps / "step_000002", snaps / ".step_000004.new")  # half a write, as the kill left it
    (snaps / ".step_000004.lock").write_text("")
    (snaps / ".step_000002.lock").write_text("")  # a lock file alone, its write done
    shutil.rmtree(snaps / "step_000004")
    ok(run(*FOUR_STEPS, "--out", str(out), "--resume"))
    assert sorted(p.name for p in snaps.iterdir()) == ["step_000002", "step_000004"]
    assert (snaps / "step_000004" / checkpoint.WEIGHTS).read_bytes() == (out / checkpoint.WEIGHTS).read_bytes()


# --- never write into what you read, through from= and side configs ----------------------------------------


READ_THROUGH = [
    ("theorem1 from= and --json its config", lambda t: (*EVALUATE, "--checkpoint", f"theorem1:beta=5,from={t / 'ckpt'}", "--json", str(t / "ckpt" / "config.json"), "--overwrite")),
    ("theorem1 from= and --out its folder", lambda t: ("analyses.copyers", "--checkpoint", f"theorem1:beta=5,from={t / 'ckpt'}", "--out", str(t / "ckpt"))),
    ("theorem1 without from= and --out the shipped folder", lambda t: ("analyses.copyers", "--checkpoint", "theorem1:beta=5", "--out", str(checkpoint.DEFAULT_CHECKPOINT))),
    ("weight file and --json its <stem>.json", lambda t: (*EVALUATE, "--checkpoint", str(t / "wf" / "w.safetensors"), "--json", str(t / "wf" / "w.json"), "--overwrite")),
    ("weight file and --json the config.json beside it", lambda t: (*EVALUATE, "--checkpoint", str(t / "good.pt"), "--config", str(t / "cfg.json"), "--json", str(t / "config.json"), "--overwrite")),
    ("weight file and --json the task.json beside it", lambda t: (*EVALUATE, "--checkpoint", str(t / "good.pt"), "--config", str(t / "cfg.json"), "--json", str(t / "task.json"), "--overwrite")),
    ("Hugging Face folder and --json inside it", lambda t: (*EVALUATE, "--checkpoint", str(t / "hf"), "--json", str(t / "hf" / "task.json"), "--overwrite")),
]


@pytest.mark.parametrize("name,argv", READ_THROUGH, ids=[c[0] for c in READ_THROUGH])
def test_no_output_is_written_into_a_file_the_spec_reads(lab, name, argv):
    with unchanged(lab):
        refused(run(*argv(lab)), "which this command reads; pick another path")


def test_the_gallery_never_replaces_a_readme_it_did_not_write(tmp_path):
    (tmp_path / "README.md").write_text("my notes\n")
    refused(run_forked("analyses.paper", "--out", str(tmp_path)), "holds a README.md that is not a gallery of python -m analyses.paper")
    assert (tmp_path / "README.md").read_text() == "my notes\n"


# --- a model whose weights do not cover its config, or the reverse, is refused by name ---------------------


def _edited_hf(lab: Path, tmp_path: Path, edit_state=None, edit_config=None) -> Path:
    folder = tmp_path / "hf"
    shutil.copytree(lab / "hf", folder)
    if edit_state:
        state = safetensors.torch.load_file(folder / "model.safetensors")
        safetensors.torch.save_file(edit_state(state), folder / "model.safetensors")
    if edit_config:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(edit_config(config)))
    return folder


HF_CASES = [
    ("a tensor missing", dict(edit_state=lambda s: {k: v for k, v in s.items() if k != "transformer.h.1.mlp.c_fc.weight"}),
     "missing h.1.mlp.c_fc.weight"),  # fmt: skip
    ("every tensor of a layer missing (config n_layer 3)", dict(edit_config=lambda c: {**c, "n_layer": 3}), "missing h.2."),
    ("a layer the config does not have (config n_layer 1)", dict(edit_config=lambda c: {**c, "n_layer": 1}), "not in the model h.1."),
    ("a tensor of an unknown name", dict(edit_state=lambda s: {**s, "transformer.extra.weight": torch.zeros(2)}), "not in the model extra.weight"),
    ("an int8 tensor", dict(edit_state=lambda s: {**s, "transformer.wpe.weight": s["transformer.wpe.weight"].to(torch.int8)}), "wpe.weight (I8) are not float tensors"),
]


@pytest.mark.parametrize("name,edit,expected", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_hugging_face_weights_that_do_not_cover_their_config_are_refused_by_name(lab, tmp_path, name, edit, expected):
    folder = _edited_hf(lab, tmp_path, **edit)
    with unchanged(tmp_path):
        refused(run(*EVALUATE, "--checkpoint", str(folder)), expected)


def test_hugging_face_weights_without_their_tied_copy_load_as_the_untied_model_with_that_copy(lab, tmp_path):
    """The converse: with tie_word_embeddings, lm_head.weight may be absent (save_pretrained drops it) and
    the folder loads, giving the numbers of the untied folder whose lm_head.weight is a copy of wte."""
    tied = _edited_hf(lab, tmp_path, edit_state=lambda s: {k: v for k, v in s.items() if k != "lm_head.weight"},
                      edit_config=lambda c: {**c, "tie_word_embeddings": True})  # fmt: skip
    (tmp_path / "tied").mkdir()
    tied.rename(tmp_path / "tied" / "hf")
    copied = _edited_hf(lab, tmp_path, edit_state=lambda s: {**s, "lm_head.weight": s["transformer.wte.weight"].clone()})
    a, b = models.load_subject(str(tmp_path / "tied" / "hf")), models.load_subject(str(copied))
    tokens, _ = a.task.sample(4, torch.Generator().manual_seed(0))
    assert torch.equal(a.log_probs(tokens), b.log_probs(tokens))


def test_a_nanogpt_checkpoint_without_model_args_says_so(tmp_path):
    path, _, _ = write_nanogpt(tmp_path / "nano", small_task(), {})
    ckpt = torch.load(path, weights_only=True)
    del ckpt["model_args"]
    torch.save(ckpt, path)
    refused(run(*EVALUATE, "--checkpoint", str(path)), "is a nanoGPT checkpoint without model_args")


def test_a_transformer_lens_model_that_cannot_predict_every_task_token_says_so(tmp_path):
    task = small_task()
    cfg = tl_cfg_dict(n_layers=1, d_model=8, d_head=4, n_heads=2, d_vocab=8, d_vocab_out=3, n_ctx=24, d_mlp=16)
    torch.save(tl_state({**cfg, "d_vocab": 8}, True) | {"unembed.W_U": torch.zeros(8, 3), "unembed.b_U": torch.zeros(3)}, tmp_path / "w.pt")
    (tmp_path / "w.json").write_text(json.dumps(cfg))
    write_task(tmp_path, task, {})
    refused(run(*EVALUATE, "--checkpoint", str(tmp_path / "w.pt")), "predicts d_vocab_out=3 tokens")


# --- no NaN or Inf written where a number is promised -----------------------------------------------------


def _strict_json(path: Path):
    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("n,batch", [(1025, 1024), (1, 1)])
def test_an_evaluation_with_a_chunk_of_one_context_writes_no_nan(lab, tmp_path, n, batch):
    """A last chunk of one context (1025 = 1024 + 1) has no standard error of its own: the JSON holds a
    finite one of all the contexts; a single context gives none, never NaN."""
    out = tmp_path / "m.json"
    ok(run("models.evaluate", "--checkpoint", str(lab / "ckpt"), "--n-contexts", str(n), "--batch-size", str(batch), "--json", str(out)))
    record = _strict_json(out)
    assert ("nll_gap_se" in record) == (n > 1)
    assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))


@pytest.mark.parametrize("n,batch", [(9, 8), (3, 1), (10, 3), (2, 1)])
def test_the_chunked_gap_standard_error_is_that_of_every_context_together(lab, n, batch):
    """``evaluate_subject`` in chunks against the same contexts (the same generator, the same chunk sizes)
    scored in one pass by our model and the Bayes oracle: per-context gaps, their standard error by NumPy."""
    from models.training.evaluate import evaluate_subject
    from probes.metrics import per_context_nll
    from probes.oracles import bayes

    subject = models.load_subject(str(lab / "ckpt"))
    chunked = evaluate_subject(subject, n, seed=5, batch_size=batch)
    g = torch.Generator().manual_seed(5)
    gaps = []
    for start in range(0, n, batch):
        tokens, _ = subject.task.sample(min(batch, n - start), g)
        with torch.no_grad():
            gaps.append(per_context_nll(subject.model(tokens), tokens) - per_context_nll(bayes(subject.task, tokens)[0], tokens))
    gaps = torch.cat(gaps).double().numpy()
    assert math.isclose(chunked["nll_gap"], gaps.mean(), rel_tol=1e-6, abs_tol=1e-9)
    assert math.isclose(chunked["nll_gap_se"], gaps.std(ddof=1) / math.sqrt(n), rel_tol=1e-6)


def test_training_on_one_evaluation_context_writes_no_nan(tmp_path):
    out = tmp_path / "run"
    ok(run(*TRAIN, "--eval-contexts", "1", "--out", str(out)))
    history = _strict_json(out / checkpoint.CONFIG)["training"]["history"]
    assert history and all("nll_gap_se" not in m for m in history)


# --- every float flag finite and in range --------------------------------------------------------------

FLOAT_FLAGS = [
    ("analyses.circuit", "--target"),
    ("analyses.circuit", "--threshold"),
    ("analyses.continuous", "--rho"),
    ("models.train", "--alpha"),
    ("models.train", "--lr"),
    ("models.train", "--gamma"),
    ("models.standard", "--alpha"),
    ("models.standard", "--lr"),
]


@pytest.mark.parametrize("value", ["nan", "-inf", "1e999"])
@pytest.mark.parametrize("module,flag", FLOAT_FLAGS, ids=[f"{m} {f}" for m, f in FLOAT_FLAGS])
def test_every_float_flag_refuses_a_value_that_is_not_finite(tmp_path, module, flag, value):
    proc = run_forked(module, f"{flag}={value}", "--out", str(tmp_path / "out"), cwd=tmp_path)
    refused(proc, "finite number")
    assert flag in proc.stderr
    assert list(tmp_path.iterdir()) == []


RANGES = [
    ("analyses.circuit", "--target", "1.5", "--target must be a share of the model's progress in (0, 1]"),
    ("analyses.circuit", "--target", "0", "--target must be a share"),
    ("analyses.circuit", "--threshold", "-1", "--threshold must be >= 0"),
    ("models.train", "--alpha", "1e308", "--alpha must be a finite number in (0, 1000000.0], got 1e+308"),
    ("models.standard", "--alpha", "1e308", "--alpha must be a finite number in (0, 1000000.0], got 1e+308"),
]


@pytest.mark.parametrize("module,flag,value,expected", RANGES, ids=[f"{c[0]} {c[1]} {c[2]}" for c in RANGES])
def test_every_float_flag_out_of_its_range_is_named_with_its_range(tmp_path, module, flag, value, expected):
    refused(run_forked(module, flag, value, "--out", str(tmp_path / "out"), cwd=tmp_path), expected)


# --- resuming: what was run is what is recorded -------------------------------------------------------------


def test_resume_with_other_steps_is_refused_and_changes_nothing(tmp_path, trained):
    """The cosine schedule spans --steps: a resumed run with more steps would not be the recorded run."""
    out = trained(TRAIN, tmp_path / "run")
    before = tree(out)
    refused(run(*TRAIN, "--steps", "8", "--resume", "--out", str(out)), "it was started with --steps 2")
    assert tree(out) == before


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["resume", "resume-overwrite"])
def test_a_corrupt_training_state_names_the_command_that_starts_afresh(tmp_path, trained, overwrite):
    out = trained(TRAIN, tmp_path / "run")
    (out / checkpoint.TRAIN_STATE).write_bytes(b"garbage")
    before = tree(out)
    refused(run(*TRAIN, "--resume", *overwrite, "--out", str(out)), "run without --resume, with --overwrite")
    assert tree(out) == before
    ok(run(*TRAIN, "--overwrite", "--out", str(out)))  # what the message says works


def test_from_runs_takes_a_folder_whose_name_holds_an_equals_sign(tmp_path, trained):
    folder = trained(TRAIN, tmp_path / "alpha=0.1")
    histories = tmp_path / "h.json"
    ok(run("analyses.scale", "--from-runs", f"alpha 0.1={folder}", "--histories", str(histories), "--out", str(tmp_path / "fig"), cwd=tmp_path))
    assert list(json.loads(histories.read_text())) == ["alpha 0.1"]
