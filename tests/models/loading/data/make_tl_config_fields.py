"""Regenerate tl_config_fields.json: what each TransformerLens 2.x/3.x release's ``HookedTransformerConfig``
has and what its ``cfg.to_dict()`` writes, read by running each release's own config module.

Not run by the tests (it needs the releases' sources). Sources: the git tags v2.0.0 .. v3.5.1 of
github.com/TransformerLensOrg/TransformerLens (a local clone), and the PyPI wheels 3.6.0 .. 3.9.0
(``pip download --no-deps transformer-lens==X``). Each release's config module (and its
``utilities/activation_functions.py``) is imported in a fresh interpreter under a stub ``transformer_lens``
package that provides only ``get_device`` (-> "cpu") and ``warn_if_mps``; every variant below is built
with ``HookedTransformerConfig(**kwargs)`` and dumped as ``json.dumps(cfg.to_dict(), default=str)``, the
README's recipe.

    python tests/models/loading/data/make_tl_config_fields.py CLONE WHEEL_DIR > tests/models/loading/data/tl_config_fields.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

BASE = dict(n_layers=2, d_model=8, n_ctx=70, d_head=4, d_vocab=8, device="cpu")
VARIANTS = {
    "gelu LN": dict(act_fn="gelu"),
    "attn-only LN": dict(attn_only=True, n_layers=3),
    "gelu_new LNPre float64": dict(act_fn="gelu_new", normalization_type="LNPre", dtype="torch.float64"),
    "relu no norm": dict(act_fn="relu", normalization_type=None),
    "gelu_new attn result": dict(act_fn="gelu_new", use_attn_result=True),
    "gelu no attn scale": dict(act_fn="gelu", use_attn_scale=False),
    "gelu attn_scale 3": dict(act_fn="gelu", attn_scale=3.0),
}
STUB_UTILS = """
def get_device():
    return "cpu"
def warn_if_mps(device):
    pass
gelu_new = gelu_fast = solu = None
"""
RUN = r"""
import dataclasses, json, sys, importlib, torch
mod = importlib.import_module(sys.argv[1])
cls = mod.HookedTransformerConfig
base, variants = json.loads(sys.argv[2]), json.loads(sys.argv[3])
def default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "<required>"
fields = {f.name: default(f) for f in dataclasses.fields(cls)}
out = {"fields": fields, "to_dict": {}}
for name, kw in variants.items():
    kw = {**base, **kw}
    if set(kw) - set(fields):  # a field this release does not have
        continue
    if "dtype" in kw:
        kw["dtype"] = getattr(torch, kw["dtype"].removeprefix("torch."))
    written = cls(**kw).to_dict()
    assert set(written) == set(fields), (name, set(written) ^ set(fields))
    out["to_dict"][name] = {k: v for k, v in written.items() if json.dumps(v, default=str) != json.dumps(fields[k], default=str)}
print(json.dumps(out, default=str))
"""


def tag_files(clone: Path, tag: str) -> dict[str, str]:
    names = subprocess.run(
        ["git", "-C", clone, "ls-tree", "-r", "--name-only", tag], capture_output=True, text=True, check=True
    ).stdout.split()
    want = [n for n in names if n.startswith("transformer_lens/config/") or n in (
        "transformer_lens/HookedTransformerConfig.py", "transformer_lens/utilities/activation_functions.py")]  # fmt: skip
    show = lambda n: subprocess.run(["git", "-C", clone, "show", f"{tag}:{n}"], capture_output=True, text=True).stdout  # noqa: E731
    return {n: show(n) for n in want if n.endswith(".py")}


def wheel_files(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        return {
            n: z.read(n).decode()
            for n in z.namelist()
            if n.endswith(".py")
            and (n.startswith("transformer_lens/config/") or n == "transformer_lens/utilities/activation_functions.py")
        }


def read_release(files: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "transformer_lens"
        (root / "utilities").mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "utils.py").write_text(STUB_UTILS)
        (root / "utilities" / "__init__.py").write_text(STUB_UTILS)
        (root / "utilities" / "devices.py").write_text(STUB_UTILS)
        for name, text in files.items():
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("" if name.endswith("config/__init__.py") else text)
        module = next(
            n.removesuffix(".py").replace("/", ".")
            for n in ("transformer_lens/config/hooked_transformer_config.py",
                      "transformer_lens/config/HookedTransformerConfig.py", "transformer_lens/HookedTransformerConfig.py")
            if n in files
        )  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", RUN, module, json.dumps(BASE), json.dumps(VARIANTS)],
            capture_output=True, text=True, cwd=tmp, env={"PYTHONPATH": tmp},
        )  # fmt: skip
        if out.returncode:
            raise RuntimeError(f"{module}: {out.stderr.strip().splitlines()[-1]}")
        return json.loads(out.stdout)


def main(clone: str, wheels: str) -> None:
    tags = subprocess.run(["git", "-C", clone, "tag"], capture_output=True, text=True, check=True).stdout.split()
    releases = {}
    for tag in tags:
        v = tag.removeprefix("v")
        parts = v.split(".")
        if len(parts) == 3 and all(p.isdigit() for p in parts) and parts[0] in ("2", "3"):
            releases[v] = read_release(tag_files(Path(clone), tag))
    for wheel in sorted(Path(wheels).glob("transformer_lens-*.whl")):
        releases[wheel.name.split("-")[1]] = read_release(wheel_files(wheel))
    order = sorted(releases, key=lambda v: tuple(int(p) for p in v.split(".")))
    # Releases whose fields, defaults and to_dict() are identical share one entry.
    groups: list[dict] = []
    for v in order:
        for g in groups:
            if g["fields"] == releases[v]["fields"] and g["to_dict"] == releases[v]["to_dict"]:
                g["releases"].append(v)
                break
        else:
            groups.append({"releases": [v], **releases[v]})
    print(json.dumps({
        "source": (
            "each TransformerLens release's own HookedTransformerConfig, run on the variant kwargs: git tags "
            "v2.0.0..v3.5.1 of github.com/TransformerLensOrg/TransformerLens, PyPI wheels 3.6.0..3.9.0; "
            "see tests/models/loading/data/make_tl_config_fields.py"
        ),
        "format": "per group of releases: fields = every HookedTransformerConfig field with its default "
                  "('<required>': none); to_dict[variant] = the fields whose written value differs from "
                  "the default (the rest are written at their default)",
        "base_kwargs": BASE, "variant_kwargs": VARIANTS, "groups": groups,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
