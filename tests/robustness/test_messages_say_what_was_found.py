"""Issues 41 and 45, messages: a refusal names the file, the tensor or field, what was found and what was
expected, and the paths an entry point prints or draws are the ones given, whatever bytes they hold. Checked
in-process (``models.load``, an entry point's ``main``): none of these needs a process of its own."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_edelman import theirs  # noqa: F401 (a fixture: their Relative_Transformer and CfgNode)
from test_edelman import write_checkpoint as write_edelman
from test_formats_pipelines import small_task, write_nanogpt

import models
from analyses import copyers
from models.plumbing.io import run_cli
from models.training import evaluate

BAD_NAME = b"ck\xff"  # a name the shell allows that is not UTF-8


def one_line_exit(capsys, main, argv) -> str:
    """``main(argv)`` as its command line runs it: exit 2 and one line on stderr, returned."""
    with pytest.raises(SystemExit) as e:
        run_cli(main, argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_a_300_mb_npz_given_as_task_json_is_named_as_a_zip_archive(tmp_path):
    """Not "expected a small JSON file" alone: what the file is (from its first bytes) and how large."""
    path = write_nanogpt(tmp_path, small_task(), {})[0]
    with open(tmp_path / "task.json", "wb") as f:  # a .npz renamed: zip's first bytes, 300 MB (sparse on disk)
        f.write(b"PK\x03\x04")
        f.truncate(300 * 10**6)
    with pytest.raises(ValueError) as e:
        models.load(path)
    assert str(e.value) == (
        f"task.json {str(tmp_path / 'task.json')!r} is a zip archive (a NumPy .npz or a PyTorch file), not JSON, of "
        "300.0 MB; expected a small JSON file (at most 256 MiB)"
    )


def test_a_png_given_as_task_json_is_named_as_a_png(tmp_path):
    path = write_nanogpt(tmp_path, small_task(), {})[0]
    (tmp_path / "task.json").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    with pytest.raises(ValueError, match=r"task.json '.*task.json' is a PNG image, not JSON; expected a JSON file"):
        models.load(path)


def test_an_edelman_config_with_n_head_0_names_the_file_and_the_field(tmp_path, theirs, capsys):  # noqa: F811
    path = write_edelman(tmp_path, theirs)[0]
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_head": 0}))
    line = one_line_exit(capsys, evaluate.main, ["--checkpoint", str(path), "--n-contexts", "8"])
    assert line.endswith(f"{path}: its config {str(tmp_path / 'config.json')!r}: n_head=0; expected an integer >= 1")
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_embd": 15, "n_head": 2}))
    with pytest.raises(ValueError, match="n_embd=15 is not a multiple of n_head=2; expected one"):
        models.load(path)


def test_a_hub_name_says_it_is_not_fetched_and_names_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        models.load("gpt2")
    assert str(e.value) == (
        "--checkpoint 'gpt2' does not exist; expected a checkpoint folder, a weight file, a shipped name (default, "
        "standard) or theorem1:beta=B[,from=FOLDER]; names on the Hugging Face hub are not fetched: download it "
        "(huggingface-cli download gpt2 --local-dir gpt2), add a task.json beside its config.json and pass that folder"
    )
    with pytest.raises(ValueError, match="download openai-community/gpt2 --local-dir gpt2"):
        models.load("openai-community/gpt2")
    (tmp_path / "runs").mkdir()
    for local in ("missing.pt", "runs/typo"):  # a file name, a folder in a folder that exists: no hub to speak of
        with pytest.raises(ValueError, match=f"'{local}' does not exist; expected a checkpoint folder") as e:
            models.load(local)
        assert "hub" not in str(e.value)


@pytest.mark.parametrize(
    "name,head,what",
    [
        ("figure.png", b"\x89PNG\r\n\x1a\n", "a PNG image"),
        ("paper.pdf", b"%PDF-1.7\n", "a PDF document"),
        ("weights.pt", b"\x89PNG\r\n\x1a\n", "a PNG image"),  # a PNG under a weight file's name
        ("notes.txt", b"hello\n", "a .txt file"),
    ],
)
def test_a_file_that_is_not_a_weight_file_is_named_for_what_it_is(tmp_path, name, head, what):
    """Not "needs a config": the file's kind (its first bytes, else its suffix) and the weight files expected."""
    (tmp_path / name).write_bytes(head + bytes(64))
    with pytest.raises(ValueError) as e:
        models.load(tmp_path / name)
    assert str(e.value) == (
        f"--checkpoint {str(tmp_path / name)!r} is {what}, not a weight file; expected .pt, .pth, .bin, "
        ".safetensors, .npz (with its config and task.json beside it) or a checkpoint folder"
    )


def test_the_folder_written_is_reported_as_given(tmp_path, monkeypatch, capsys):
    """``--out`` given as an absolute path from another folder: the last line names that path, not ``../ha2``."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    copyers.main(["--out", str(tmp_path / "ha2")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"wrote 3 files to {tmp_path / 'ha2'}/: "), last


def test_an_analysis_of_a_checkpoint_at_a_path_that_is_not_utf8_draws_its_title(tmp_path, capsys):
    """The figure's title holds the model's name: its bytes that are not UTF-8 are drawn escaped (``ck\\xff``),
    where matplotlib's set_text refused the name; the JSON keeps the name itself."""
    folder = os.fsdecode(bytes(tmp_path) + b"/" + BAD_NAME)
    shutil.copytree(models.DEFAULT_CHECKPOINT, folder)
    copyers.main(["--checkpoint", folder, "--out", str(tmp_path / "o")])
    record = json.loads((tmp_path / "o" / "copyers.json").read_text())
    assert record["checkpoint"] == folder and (tmp_path / "o" / "copyers.png").stat().st_size > 0
    from analyses.common import title_name

    assert title_name(folder) == "ck\\xff" and title_name("runs/my model/") == "my model"
