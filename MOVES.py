"""Rewrite imports from the flat models/ layout to the subpackages (idempotent). Usage:
python rewrite_imports.py FILE...   (edits in place)"""

import re
import sys

MOVES = {  # old module under models -> new module under models
    "causal_transformer": "nets.causal_transformer",
    "continuous": "nets.continuous",
    "hooked_transformer": "nets.hooked_transformer",
    "theorem1": "nets.theorem1",
    "loading": "loading.loading",
    "sources": "loading.sources",
    "converters": "loading.converters",
    "checkpoint": "loading.checkpoint",
    "dtypes": "loading.dtypes",
    "subject": "interp.subject",
    "interventions": "interp.interventions",
    "patching": "interp.patching",
    "circuit": "interp.circuit",
    "train": "training.train",
    "standard": "training.standard",
    "optim": "training.optim",
    "distributed": "training.distributed",
    "evaluate": "training.evaluate",
    "sweep": "training.sweep",
    "cli": "plumbing.cli",
    "io": "plumbing.io",
    "fast_help": "plumbing.fast_help",
}
LAUNCHED = {"train", "standard", "evaluate"}  # `python -m models.X` stays as written
NEW_TOP = {"nets", "loading", "interp", "training", "plumbing"}
NAMES = "|".join(sorted(MOVES, key=len, reverse=True))


def from_models_import(m):
    """`from models import a, b as c` -> one line per new package (names of models/__init__ stay)."""
    indent, body = m.group(1), m.group(2)
    if body.strip().startswith("("):
        return m.group(0)
    names = [n.strip() for n in body.split(",") if n.strip()]
    groups = {}
    for n in names:
        base = n.split(" as ")[0].strip()
        pkg = MOVES[base].rpartition(".")[0] if base in MOVES and base != "loading" else ""
        groups.setdefault(pkg, []).append(n)
    lines = [f"{indent}from models{'.' + p if p else ''} import {', '.join(v)}" for p, v in groups.items()]
    return "\n".join(lines)


def dotted(m):
    name, after = m.group(1), m.group(2)
    if name == "loading" and after == ".":
        return m.group(0)  # models.loading.X is already new
    return f"models.{MOVES[name]}{after}"


def rewrite(text):
    text = re.sub(r"^([ \t]*)from models import ([^\n#]+?)[ \t]*$", from_models_import, text, flags=re.M)
    # `python -m models.train` (and cli_help keys) stay; only imports and attribute paths move
    out = []
    for line in text.split("\n"):

        def sub(m):
            name, after = m.group(1), m.group(2)
            if (
                name == "loading"
                and not after
                and re.match(r"\s+import\s+(sources|converters|checkpoint|dtypes|loading)\b", line[m.end() :])
            ):
                return m.group(0)  # from models.loading import checkpoint: already new
            if name in LAUNCHED and not (after == "." or re.search(r"\b(from|import)\s+$", line[: m.start()])):
                return m.group(0)
            return dotted(m)

        out.append(re.sub(rf"(?<![\w./-])models\.({NAMES})(?![\w])(\.?)", sub, line))
    text = "\n".join(out)
    # file paths in docstrings and docs
    text = re.sub(
        rf"(?<![\w./-])models/({NAMES})(\.py|/)",
        lambda m: (
            f"models/{MOVES[m.group(1)].replace('.', '/')}{m.group(2)}"
            if not (m.group(1) == "loading" and m.group(2) == "/")
            else m.group(0)
        ),
        text,
    )
    return text


if __name__ == "__main__":
    for f in sys.argv[1:]:
        s = open(f).read()
        t = rewrite(s)
        if t != s:
            open(f, "w").write(t)
            print("rewrote", f)
