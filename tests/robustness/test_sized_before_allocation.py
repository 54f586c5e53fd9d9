"""The third robustness catalogue (issue 23), sizes and numbers: every model, from every format, and every
size flag is sized from its config before a tensor is allocated, and a forward pass that yields NaN says
so. Each case runs the command in a fresh process under an address-space limit (``RLIMIT_AS``,
``LIMIT_BYTES``) and a timeout, and asserts exit code 2, exactly ONE line on stderr containing the
expected text, no traceback, and every file under the test folder (and the shipped checkpoints)
byte-identical afterwards. Beside the catalogue: each size estimate against the true allocation of
small real models (torch's own storages), and the digest reading only the files that define a model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import forked
import pytest
import safetensors.torch
import test_formats_pipelines as pipelines
import torch
from conftest import build_task
from test_cli_bad_input import HUGE, _edit_config
from test_formats import file_config, hf_folder, small_model
from test_work_never_lost import tree

import models
from models.loading import checkpoint
from models.loading.sources import resolve
from models.loading.sources.files import Found
from models.nets.build import model_bytes
from models.nets.causal_transformer import CausalTransformer
from models.nets.hooked_transformer import HookedTransformer, HookedTransformerConfig
from models.plumbing.io import MAX_TENSORS

ROOT = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 4 * 10**9  # address space of each case: a full analysis of the shipped models needs < 3 GB
TIMEOUT_S = forked.HANG_S  # a hang only (each case is refused in seconds); LIMIT_BYTES stops a built model
BIG = 10**12


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run(module: str, *argv: str, cwd: Path) -> forked.Completed:
    """``python -m module argv`` in a process of its own (forked from a server that has done the imports:
    ``tests/helpers/forked.py``), memory- and time-bounded."""
    return forked.run(module, *argv, cwd=cwd, env=ENV, limit=LIMIT_BYTES, timeout=TIMEOUT_S)


def fresh_interpreter(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The same in a new interpreter (``python -m``), as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limit, cwd=cwd, env=ENV,
    )  # fmt: skip


def _tl_folder(t: Path, name: str, **change) -> Path:
    """A TransformerLens state dict (w.pt) whose config (w.json) is a small real one, changed by ``change``."""
    task = pipelines.small_task()
    cfg = pipelines.tl_cfg_dict(
        n_layers=1, d_model=8, d_head=4, n_heads=2, d_vocab=8, d_vocab_out=8, n_ctx=24, d_mlp=16
    )
    (t / name).mkdir()
    state = pipelines.tl_state(cfg, True)
    torch.save(state, t / name / "w.pt")
    (t / name / "w.json").write_text(json.dumps({**cfg, **change}))
    pipelines.write_task(t / name, task, {})
    return t / name / "w.pt"


def _nanogpt(t: Path, name: str, **change) -> Path:
    path, _, _ = pipelines.write_nanogpt(t / name, pipelines.small_task(), {})
    ckpt = torch.load(path, weights_only=True)
    ckpt["model_args"].update(change)
    torch.save(ckpt, path)
    return path


def _hf(t: Path, name: str, **change) -> Path:
    folder, _, _ = hf_folder(t, pipelines.small_task(), name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    return folder


def _overflowing(state: dict, key: str, value: float = 3e38) -> dict:
    """``state`` with ``key`` filled with ``value``: finite float32 weights whose sums overflow to Inf."""
    return {**state, key: torch.full_like(state[key], value)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """Every model, good and bad, made once for every case (cases must not change them)."""
    t = tmp_path_factory.mktemp("sizes")
    _tl_folder(t, "tl")
    for name, change in {
        "tl_layers": dict(n_layers=10**9),
        "tl_many_layers": dict(n_layers=MAX_TENSORS // 10, d_model=2, d_head=1, d_mlp=2),
        "tl_ctx": dict(n_ctx=BIG),
        "tl_d_model": dict(d_model=10**7, d_head=5 * 10**6),
        "tl_vocab": dict(d_vocab=BIG, d_vocab_out=BIG),
        "tl_d_mlp": dict(d_mlp=BIG),
        "tl_heads": dict(n_heads=10**7),
        "tl_over_limit": dict(d_vocab=2 * 10**8, d_vocab_out=8),  # 6.4 GB: more than LIMIT_BYTES, less than RAM
        "tl_attn_scale": dict(attn_scale=1e-300),
    }.items():
        _tl_folder(t, name, **change)
    hot = _tl_folder(t, "tl_hot")
    torch.save(_overflowing(torch.load(hot, weights_only=True), "embed.W_E"), hot)
    _nanogpt(t, "nano")
    for name, change in {
        "nano_layers": dict(n_layer=10**9),
        "nano_many_layers": dict(n_layer=MAX_TENSORS),
        "nano_block": dict(block_size=BIG),
        "nano_embd": dict(n_embd=10**7, n_head=1),
        "nano_vocab": dict(vocab_size=BIG),
    }.items():
        _nanogpt(t, name, **change)
    hot = _nanogpt(t, "nano_hot")
    ckpt = torch.load(hot, weights_only=True)
    ckpt["model"] = _overflowing(ckpt["model"], "transformer.wpe.weight")
    torch.save(ckpt, hot)
    for name, change in {
        "hf_layers": dict(n_layer=10**9),
        "hf_many_layers": dict(n_layer=MAX_TENSORS),
        "hf_positions": dict(n_positions=BIG),
        "hf_embd": dict(n_embd=10**7),
        "hf_vocab": dict(vocab_size=BIG),
        "hf_unscaled_layers": dict(n_layer=10**9, scale_attn_weights=False),
        "hf_unscaled_vocab": dict(vocab_size=BIG, scale_attn_weights=False),
    }.items():
        _hf(t, name, **change)
    hot = _hf(t, "hf_hot") / "model.safetensors"
    safetensors.torch.save_file(_overflowing(safetensors.torch.load_file(hot), "transformer.wpe.weight"), hot)
    task = pipelines.small_task()
    literal = pipelines.PaperLiteral(task.d_vocab, task.n_examples, task.seq_len)
    pipelines.write_paper_literal(t / "paper", task, literal)
    pad, place = pipelines.paper_key_map(task.d_vocab), pipelines.paper_key_map(task.d_vocab)
    pad["w_L"]["pad"]["after"] = BIG
    place["W_KQ"]["place"]["shape"] = [10**6, 10**6]
    (t / "pad_map.json").write_text(json.dumps(pad))
    (t / "place_map.json").write_text(json.dumps(place))
    model, task = small_model()
    models.save(model, t / "ckpt", task=task)
    (t / "cfg.json").write_text(json.dumps(file_config(model, task)))
    torch.save(_overflowing(_overflowing(model.state_dict(), "blocks.0.attn.w_H"), "blocks.0.attn.w_L"), t / "hot.pt")
    big = build_task(d_vocab=400, n_examples=200, seq_len=2)  # its construction: ((K+1) d)^2 float64 = 52 GB
    shutil.copytree(t / "ckpt", t / "bigtask")
    _edit_config(
        t / "bigtask",
        lambda c: (c.update(task=big.to_dict()), c["model"].update(d_vocab=400, n_examples=200, seq_len=2)),
    )
    (t / "out").mkdir()
    return t


def _evaluate(*argv: str):
    return "models.evaluate", ["--n-contexts", "8", "--batch-size", "8", *argv]


def _inspect(*argv: str):
    return "analyses.inspect", ["--n-contexts", "8", *argv]


def _analysis(t: Path, name: str, *argv: str):
    extra = {"bma_agreement": ["--train-L", "none"], "attention_view": []}.get(name, ["--n-contexts", "8"])
    return f"analyses.{name}", [*extra, *argv, "--out", str(t / "out")]


def _ck(t: Path, name: str) -> str:
    return (
        str(t / name / "w.pt")
        if name.startswith("tl")
        else str(t / name / "ckpt.pt")
        if name.startswith("nano")
        else str(t / name)
    )


def _bomb(name: str, checkpoint: str, expected: str):
    """A CASES row: ``models.evaluate --checkpoint`` on the model built as ``checkpoint`` is refused."""
    return "bomb", name, lambda t: _evaluate("--checkpoint", _ck(t, checkpoint)), expected


NEEDS = "would need about"
LAYERS = "n_layers=1000000000"  # a billion layers: the one line names the model it refuses by its size
TENSORS = "tensors, more than the bound of"
NAN = "the forward pass gave NaN or Inf"
ULIMIT = "what the address-space limit (ulimit -v) leaves"

# (kind, id, (t) -> (module, argv), expected text in the one line)
CASES = [
    # --- hangs and memory: every model sized from its config before a tensor exists --------------------
    _bomb("TransformerLens n_layers 1e9", "tl_layers", LAYERS),
    _bomb("TransformerLens 2000 layers of width 2", "tl_many_layers", TENSORS),
    _bomb("TransformerLens n_ctx 1e12", "tl_ctx", NEEDS),
    _bomb("TransformerLens d_model 1e7", "tl_d_model", NEEDS),
    _bomb("TransformerLens d_vocab 1e12", "tl_vocab", NEEDS),
    _bomb("TransformerLens d_mlp 1e12", "tl_d_mlp", NEEDS),
    _bomb("TransformerLens n_heads 1e7", "tl_heads", NEEDS),
    _bomb("TransformerLens over ulimit -v, under RAM", "tl_over_limit", ULIMIT),
    _bomb("nanoGPT n_layer 1e9", "nano_layers", LAYERS),
    _bomb("nanoGPT 20 000 layers", "nano_many_layers", TENSORS),
    _bomb("nanoGPT block_size 1e12", "nano_block", NEEDS),
    _bomb("nanoGPT n_embd 1e7", "nano_embd", NEEDS),
    _bomb("nanoGPT vocab_size 1e12", "nano_vocab", NEEDS),
    _bomb("Hugging Face n_layer 1e9", "hf_layers", TENSORS),
    _bomb("Hugging Face 20 000 layers", "hf_many_layers", TENSORS),
    _bomb("Hugging Face n_positions 1e12", "hf_positions", NEEDS),
    _bomb("Hugging Face n_embd 1e7", "hf_embd", NEEDS),
    _bomb("Hugging Face vocab_size 1e12", "hf_vocab", NEEDS),
    _bomb("Hugging Face unscaled GPT-2 n_layer 1e9", "hf_unscaled_layers", TENSORS),
    _bomb("Hugging Face unscaled GPT-2 vocab 1e12", "hf_unscaled_vocab", NEEDS),
    (
        "bomb",
        "key map pad 1e12",
        lambda t: _evaluate("--checkpoint", str(t / "paper" / "paper.pt"), "--key-map", str(t / "pad_map.json")),
        "key map entry 'w_L': pad to shape [3, 1000000000003] would need about",
    ),
    (
        "bomb",
        "key map place 1e6 x 1e6",
        lambda t: _evaluate("--checkpoint", str(t / "paper" / "paper.pt"), "--key-map", str(t / "place_map.json")),
        "key map entry 'W_KQ': place into shape [1000000, 1000000] would need about",
    ),
    (
        "bomb",
        "theorem1 from a large task",
        lambda t: _evaluate("--checkpoint", f"theorem1:beta=3,from={t / 'bigtask'}"),
        "the Theorem 1 construction (d=400, L=K=200, H=2) would need about",
    ),
    (
        "bomb",
        "n-contexts huge on a TransformerLens model",
        lambda t: _inspect("--checkpoint", _ck(t, "tl"), "--n-contexts", HUGE, "--out", str(t / "out")),
        "--n-contexts must be in [2, 10000000], got 10000000000",
    ),
    (
        "bomb",
        "models.standard --n-layers 1e5",
        lambda t: ("models.standard", ["--n-layers", "100000", "--d-model", "8", "--out", str(t / "out" / "std")]),
        "the GPT-2 of these flags (a 'gpt2' model of 100000 layers",
    ),
    (
        "bomb",
        "models.standard --d-model 1e5",
        lambda t: ("models.standard", ["--d-model", "100000", "--n-heads", "1", "--out", str(t / "out" / "std")]),
        NEEDS,
    ),
    # --- analysis size flags: sized from the flags (and the task) before any work ------------------------
    (
        "bomb",
        "bma_agreement --bma-L 1e5",
        lambda t: _analysis(t, "bma_agreement", "--bma-L", "100000"),
        "--bma-L must be in [1, 65536], got 100000",
    ),
    (
        "bomb",
        "bma_agreement --bma-L 60000",
        lambda t: _analysis(t, "bma_agreement", "--bma-L", "60000", "--n-contexts", "4096"),
        "--bma-L 60000 with --n-contexts 4096 would need about",
    ),
    ("bomb", "cape_properties --nodes 1e6", lambda t: _analysis(t, "cape_properties", "--nodes", "1000000"), NEEDS),
    ("bomb", "cape_properties --dim 1e8", lambda t: _analysis(t, "cape_properties", "--dim", "100000000"), NEEDS),
    (
        "bomb",
        "cape_properties --n-queries 1e9",
        lambda t: _analysis(t, "cape_properties", "--n-queries", "1000000000"),
        NEEDS,
    ),
    (
        "bomb",
        "attention_view --context 1e9",
        lambda t: _analysis(t, "attention_view", "--context", "1000000000"),
        "--context 1000000000 (samples 1000000001 contexts",
    ),
    (
        "bomb",
        "circuit --ig-steps 1e9",
        lambda t: _analysis(t, "circuit", "--checkpoint", "theorem1:beta=5", "--ig-steps", "1000000000"),
        "--ig-steps must be in [1, 1024], got 1000000000",
    ),
    (
        "bomb",
        "circuit --curve-points 1e9",
        lambda t: _analysis(t, "circuit", "--checkpoint", "theorem1:beta=5", "--curve-points", "1000000000"),
        "--curve-points must be in [1, 1000], got 1000000000",
    ),
    (
        "bomb",
        "init_gradient --n-trees 1e9",
        lambda t: _analysis(t, "init_gradient", "--n-trees", "1000000000"),
        "target sequences, more than the bound",
    ),
    (
        "bomb",
        "cape_structure --n-trees 1e9",
        lambda t: _analysis(t, "cape_structure", "--n-trees", "1000000000"),
        NEEDS,
    ),
    # --- wrong numbers with exit 0: a forward pass that yields NaN says so ----------------------------
    ("numbers", "theorem1 beta 1e308", lambda t: _evaluate("--checkpoint", "theorem1:beta=1e308"), "(0, 1e+300]"),
    ("numbers", "theorem1 beta 1e301", lambda t: _evaluate("--checkpoint", "theorem1:beta=1e301"), "bad beta"),
    (
        "numbers",
        "theorem1 beta 1e300 in float32",
        lambda t: _evaluate("--checkpoint", "theorem1:beta=1e300", "--dtype", "float32"),
        "overflow float32",
    ),
    (
        "numbers",
        "TransformerLens attn_scale 1e-300 (evaluate)",
        lambda t: _evaluate("--checkpoint", _ck(t, "tl_attn_scale")),
        NAN,
    ),
    (
        "numbers",
        "TransformerLens attn_scale 1e-300 (analysis)",
        lambda t: _inspect("--checkpoint", _ck(t, "tl_attn_scale"), "--out", str(t / "out")),
        NAN,
    ),
    ("numbers", "TransformerLens W_E 3e38 overflows", lambda t: _evaluate("--checkpoint", _ck(t, "tl_hot")), NAN),
    ("numbers", "nanoGPT wpe 3e38 overflows", lambda t: _evaluate("--checkpoint", _ck(t, "nano_hot")), NAN),
    ("numbers", "Hugging Face wpe 3e38 overflows", lambda t: _evaluate("--checkpoint", _ck(t, "hf_hot")), NAN),
    (
        "numbers",
        "state dict w_H + w_L overflow",
        lambda t: _evaluate("--checkpoint", str(t / "hot.pt"), "--config", str(t / "cfg.json")),
        NAN,
    ),
]


@pytest.mark.parametrize("kind,name,make,expected", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_sizes_and_numbers_are_one_line_exit_2_bounded_and_change_nothing(lab, kind, name, make, expected):
    module, argv = make(lab)
    before, shipped = tree(lab), [tree(p) for p in (checkpoint.DEFAULT_CHECKPOINT, checkpoint.STANDARD_CHECKPOINT)]
    proc = run(module, *argv, cwd=lab)
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (argv, proc.stderr[-2000:])
    assert len(err) == 1, err
    assert expected in err[0], err
    assert "Traceback" not in proc.stderr
    assert tree(lab) == before
    assert [tree(p) for p in (checkpoint.DEFAULT_CHECKPOINT, checkpoint.STANDARD_CHECKPOINT)] == shipped


@pytest.mark.parametrize("name", ["TransformerLens over ulimit -v, under RAM", "nanoGPT vocab_size 1e12"])
def test_a_forked_case_is_what_a_fresh_interpreter_does(lab, name):
    """The catalogue's processes are forked from a server that has imported the suite (tests/helpers/forked.py):
    a case gives the same exit code and stderr as ``python -m`` in a new interpreter under the same limit
    (the first case is refused by what the limit leaves, so the limit holds in both)."""
    (module, argv) = next(make(lab) for _, n, make, _ in CASES if n == name)
    a, b = run(module, *argv, cwd=lab), fresh_interpreter(module, *argv, cwd=lab)

    def shape(text: str) -> str:  # the bound's numbers depend on what the imports mapped
        return re.sub(r"\d+(\.\d+)?", "N", text)

    assert (a.returncode, shape(a.stderr), a.stdout) == (b.returncode, shape(b.stderr), b.stdout)
    assert a.returncode == 2 and "Traceback" not in a.stderr


def test_the_catalogue_has_both_kinds_and_thirty_cases():
    assert {c[0] for c in CASES} == {"bomb", "numbers"}
    assert len(CASES) >= 30


# The estimates against the true allocation ------------------------------------------------------------------
def allocated(module: torch.nn.Module) -> int:
    """Bytes torch holds for ``module``: every distinct storage of its parameters and buffers, once."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*module.parameters(), *module.buffers()]
    }
    return sum(storages.values())


HOOKED = [
    dict(n_layers=2, d_model=8, n_ctx=24, d_head=4, n_heads=2, d_vocab=8, act_fn="gelu"),
    dict(
        n_layers=3, d_model=12, n_ctx=40, d_head=3, n_heads=4, d_vocab=50, d_vocab_out=7, act_fn="relu", dtype="float64"
    ),
    dict(n_layers=1, d_model=6, n_ctx=9, d_head=6, n_heads=1, d_vocab=5, attn_only=True, normalization_type="LNPre"),
    dict(
        n_layers=2,
        d_model=4,
        n_ctx=300,
        d_head=2,
        n_heads=2,
        d_vocab=3,
        d_mlp=64,
        act_fn="gelu_new",
        normalization_type=None,
    ),
]


@pytest.mark.parametrize("fields", HOOKED)
def test_the_hooked_transformer_estimate_is_its_allocation_exactly(fields):
    """From its config alone: the bytes and the count of its parameters and buffers (the masks included)."""
    cfg = HookedTransformerConfig(**fields)
    model = HookedTransformer(cfg)
    assert cfg.n_bytes() == allocated(model)
    assert cfg.n_tensors() == len([*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("sizes", [(3, 2, 4), (5, 6, 3), (7, 10, 2)])
def test_the_theorem1_estimate_is_its_allocation_exactly(sizes):
    d, L, H = sizes
    task = build_task(d_vocab=d, n_examples=L, seq_len=H)
    model = models.theorem1_model(task.pi, L, H, 3.0)
    assert model_bytes(CausalTransformer, model.cfg) == allocated(model)


def test_the_hugging_face_estimate_is_within_one_percent_of_what_the_bridge_holds(tmp_path, monkeypatch):
    """What ``hugging_face.check_size`` hands to ``check_memory`` (a floor from the config's numbers, then
    the meta-device count) against the storages of the booted bridge."""
    from models.loading.sources import hugging_face
    from models.plumbing import io

    folder, _, _ = hf_folder(tmp_path, pipelines.small_task())
    config = json.loads((folder / "config.json").read_text())
    needed = []
    with monkeypatch.context() as m:
        m.setattr(io, "check_memory", lambda n, what, device=None: needed.append(n))
        hugging_face.check_size(config, "config.json", None)
    true = allocated(resolve(folder).model)
    floor, estimate = needed
    assert floor <= true
    assert abs(estimate - true) <= 0.01 * true, (estimate, true)


# The digest reads only what defines the model -----------------------------------------------------------------
def _sha(*files: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def test_a_large_file_beside_the_weights_is_never_read(tmp_path):
    """A 100 GB sparse file beside a Hugging Face folder's weights and beside a weight file: loading takes
    seconds under the 4 GB address-space limit, and the digest is the sha256 of the defining files."""
    folder, _, _ = hf_folder(tmp_path, pipelines.small_task())
    pt = _tl_folder(tmp_path, "tl")
    for where in (folder, pt.parent):
        with open(where / "optimizer.bin", "wb") as f:
            f.truncate(100 * 10**9)
    code = (
        "import sys; from models.loading.sources import resolve; "
        "print(resolve(sys.argv[1]).digest, resolve(sys.argv[2]).digest)"
    )
    proc = forked.run("-c", code, str(folder), str(pt), cwd=tmp_path, limit=LIMIT_BYTES, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    hf_digest, tl_digest = proc.stdout.split()
    assert hf_digest == _sha(folder / "config.json", folder / "task.json", folder / "model.safetensors")
    config = json.loads((pt.parent / "w.json").read_text())
    h = hashlib.sha256()
    for f in (pt, pt.parent / "task.json"):
        h.update(f.name.encode() + f.read_bytes())
    h.update(json.dumps(config).encode())
    assert tl_digest == h.hexdigest()[:16]


def test_a_huge_safetensors_file_is_sized_before_it_is_read(tmp_path):
    """safetensors files are read whole: one that would not fit is refused by its size on disk."""
    pt = _tl_folder(tmp_path, "tl")
    huge = pt.with_suffix(".safetensors")
    with open(huge, "wb") as f:
        f.truncate(10**13)  # sparse: no disk used
    with pytest.raises(ValueError, match=r"reading .*w\.safetensors would need about 10\.0 TB"):
        models.load(huge)


def test_the_digest_of_a_sharded_folder_covers_its_index_and_every_shard(tmp_path):
    folder, _, _ = hf_folder(tmp_path, pipelines.small_task())
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"transformer.wte.weight": "model-00001-of-00001.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    files = Found(folder).defining_files()
    assert [f.name for f in files] == sorted(
        ["config.json", "task.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors"]
    )


# A NaN made anywhere in the forward pass is refused where every analysis reads it -------------------------
def test_a_hook_that_makes_nan_is_one_error_not_a_metric():
    subject = models.load_subject("default")
    tokens, _ = subject.task.sample(4, torch.Generator().manual_seed(0))
    assert torch.isfinite(subject.log_probs(tokens)).all()

    def poison(z, hook):
        z[0] = float("nan")
        return z

    with pytest.raises(ValueError, match=r"NaN or Inf on 1 of 4 contexts") as err:
        subject.log_probs(tokens, [(subject.head_output(1), poison)])
    assert "\n" not in str(err.value)
