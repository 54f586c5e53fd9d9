"""An interactive view of every layer's attention on one context, through circuitsvis.

    python -m analyses.attention_view                                   # the shipped checkpoint, context 0
    python -m analyses.attention_view --checkpoint theorem1:beta=50 --context 3

Writes ``attention_view.html`` (self-contained: circuitsvis's JavaScript is inlined, so it opens offline;
hover a head to see it, click to lock it, hover a cell for its query, key and weight) and
``attention_view.json`` (the patterns shown, with their labels). Keys are labelled by the task token they
hold, ``d3:h5`` (demonstration 3, position 5) or ``tgt:h2`` (the target sequence), ``bos``/``sep`` for a
standard model's special ids; queries by the token they predict, ``q:tgt:h2``. The disentangled model's
``blocks.0`` is not square (its H target rows attend over all (L+1)H tokens), and circuitsvis draws one
list of labels along both axes, so each layer's list is its queries, then its keys: a query's row has its
weights in the key columns, and the rest of the square is empty.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import circuitsvis
import torch

from analyses import common
from models import cli
from models.io import atomic_write, write_json

NAME = "attention_view"
MAX_CELLS = 5_000_000  # numbers in the page's views: about 40 MB of HTML
FIGURES = {
    "attention_view.html": (
        "interactive circuitsvis view of one context's attention, every layer and head: queries labelled by the "
        "target token they predict (q:tgt:h2), keys by the token they hold (d3:h5 = demonstration 3, position 5)"
    ),
}


def key_label(l: int, h: int, n_examples: int) -> str:
    """``d3:h5`` for demonstration l, ``tgt:h5`` for the target (l = L); ``''`` for no task token."""
    if l < 0:
        return ""
    return f"tgt:h{h}" if l == n_examples else f"d{l}:h{h}"


def labels(pairs: torch.Tensor, n_examples: int, query: bool) -> list[str]:
    """Labels of a layer's queries (``q:`` + what each predicts) or keys (what each holds), by position."""
    out = []
    for p, (l, h) in enumerate(pairs.tolist()):
        name = key_label(l, h, n_examples) or (f"none@{p}" if query else f"special@{p}")
        out.append(f"q:{name}" if query else name)
    return out


def layer_view(pattern: torch.Tensor, query_labels: list[str], key_labels: list[str]) -> dict:
    """One layer as circuitsvis's square ``attention [head, n, n]`` over the labels queries + keys: row i < Q
    (query i) holds its pattern in the key columns Q.., every other cell is 0."""
    n_heads, Q, K = pattern.shape
    square = pattern.new_zeros(n_heads, Q + K, Q + K)
    square[:, :Q, Q:] = pattern
    return {"tokens": query_labels + key_labels, "attention": square.round(decimals=4).tolist()}


def compute(subject, args) -> dict:
    """The patterns of context ``--context`` of those sampled with ``--seed``, with their labels."""
    task = subject.task
    tokens, parents = common.sample_contexts(task, args.context + 1, args.seed)
    tokens, parents = tokens[args.context :], parents[args.context]
    with torch.no_grad():
        layers = subject.attention(tokens.to(getattr(subject.model.cfg, "device", "cpu")))
    heads = subject.head_labels()
    out, start = [], 0
    for i, layer in enumerate(layers):
        n = layer.pattern.shape[1]
        out.append(
            {
                "layer": i,
                "heads": heads[start : start + n],
                "queries": labels(layer.query_predicts, task.n_examples, query=True),
                "keys": labels(layer.key_token, task.n_examples, query=False),
                "pattern": layer.pattern[0].cpu().double(),
            }
        )
        start += n
    cells = sum(len(l["heads"]) * (len(l["queries"]) + len(l["keys"])) ** 2 for l in out)
    if cells > MAX_CELLS:
        raise ValueError(
            f"the view of {subject.describe()} would hold {cells:,} numbers, more than a browser page holds "
            f"({MAX_CELLS:,}); view a smaller model, or summarise its patterns with analyses.copyers / bma_agreement"
        )
    H = task.seq_len
    sequences = tokens[0].view(task.n_examples + 1, H).tolist()
    return {
        "model": subject.describe(),
        "context": args.context,
        "tokens": {("tgt" if l == task.n_examples else f"d{l}"): seq for l, seq in enumerate(sequences)},
        "parents": parents.tolist(),
        "layers": out,
    }


def _circuitsvis_js() -> str:
    """circuitsvis's browser bundle, as ``circuitsvis.utils.render.render_local`` inlines it."""
    bundle = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not bundle.is_file():
        raise ValueError(
            f"circuitsvis {circuitsvis.__version__} has no {bundle.name} bundle; expected circuitsvis>=1.43"
        )
    return bundle.read_text(encoding="utf-8").replace("</script>", "")


def render_html(result: dict, title: str) -> str:
    """The self-contained page: a heading and caption per layer, then one script rendering every layer."""
    esc = html.escape
    context = "".join(
        f"<tr><th>{esc(name)}</th>{''.join(f'<td>{t}</td>' for t in seq)}</tr>"
        for name, seq in result["tokens"].items()
    )
    sections, calls = [], []
    for layer in result["layers"]:
        div = f"attention-layer-{layer['layer']}"
        q, k = len(layer["queries"]), len(layer["keys"])
        sections.append(
            f"<h2>blocks.{layer['layer']}: {len(layer['heads'])} head(s), {q} queries x {k} keys</h2>\n"
            f"<p>Labels run queries first ({esc(layer['queries'][0])} .. {esc(layer['queries'][-1])}), then keys "
            f"({esc(layer['keys'][0])} .. {esc(layer['keys'][-1])}): each query's weights are in its row, under "
            f'the key columns.</p>\n<div id="{div}"></div>'
        )
        props = {
            "attentionHeadNames": layer["heads"],
            "maxValue": 1,
            "minValue": 0,
            "maskUpperTri": False,
            **layer_view(layer["pattern"], layer["queries"], layer["keys"]),
        }
        props_js = json.dumps(props).replace("</", "<\\/")
        calls.append(f'CircuitsVis.render("{div}", CircuitsVis.AttentionHeads, {props_js});')
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n"
        "<style>body{font-family:sans-serif;margin:16px} table{border-collapse:collapse;font-size:12px}"
        " td,th{border:1px solid #ccc;padding:1px 5px}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n<p>{esc(result['model'])}. Target parents: {result['parents']}.</p>\n"
        f"<table>{context}</table>\n" + "\n".join(sections) + "\n"
        '<script crossorigin type="module">\n' + _circuitsvis_js() + "\n" + "\n".join(calls) + "\n</script>\n"
        "</body>\n</html>\n"
    )


def summary(result: dict) -> str:
    parts = [
        f"blocks.{l['layer']} {len(l['heads'])} heads x {len(l['queries'])} queries x {len(l['keys'])} keys"
        for l in result["layers"]
    ]
    return f"{NAME}: context {result['context']}; " + "; ".join(parts)


def _add_flags(p) -> None:
    p.add_argument(
        "--context", type=int, default=0, help="which of the contexts sampled with --seed to show (default: 0)"
    )


def _check_flags(p, args) -> None:
    if args.context < 0:
        p.error(f"--context must be >= 0, got {args.context}")


REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject
ANALYSIS = common.Analysis(
    NAME,
    __doc__,
    compute,
    lambda result, args: {},
    summary,
    n_contexts=None,
    requires=REQUIRES,
    add_flags=_add_flags,
    check_flags=_check_flags,
)


def main(argv: list[str] | None = None) -> dict:
    """``common.main``'s steps, writing HTML (not a matplotlib figure) and the JSON of its numbers."""
    p = common.parser_for(ANALYSIS)
    args = p.parse_args(argv)
    cli.check_run_flags(p, args, argv)
    common.check_out(p, args.out)
    _check_flags(p, args)
    subject = cli.subject_or_exit(p, args)
    try:
        common.check_requirements(ANALYSIS, subject)
    except ValueError as e:
        p.error(str(e))
    subject.model.eval()
    torch.manual_seed(args.seed)
    result = compute(subject, args)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    page = render_html(result, f"Attention of {subject.name}, context {args.context} (seed {args.seed})")
    atomic_write(out / "attention_view.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
    write_json(out / f"{NAME}.json", common.json_record(args, subject, result))
    print(summary(result))
    return result


if __name__ == "__main__":
    common.run(main)
