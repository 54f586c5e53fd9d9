"""An interactive view of every layer's attention on one context, through circuitsvis.

    python -m analyses.attention_view                                   # the shipped checkpoint, context 0
    python -m analyses.attention_view --checkpoint theorem1:beta=50 --context 3

Writes ``attention_view.html`` (self-contained: circuitsvis's JavaScript is inlined, so it opens offline;
hover a head to see it, click to lock it, hover a cell for its query, key and weight) and
``attention_view.json`` (the patterns shown, with their labels: the token each key holds, the one each
query predicts). Tokens are named short, ``d3:h5`` (demonstration 3, position 5), ``tgt:h2`` (the target
sequence), ``bos``/``sep`` for a standard model's special ids. circuitsvis draws one list of labels along
both axes (appending each position's index), so the page shows what holds data as squares
(``square_views``), one label per position: a square layer (a causal LM's, the disentangled model's
``blocks.1``) as it is, each position named by the token it holds (its query predicts the next row's token,
or its own, said above the view); a layer with fewer queries than keys (the disentangled model's
``blocks.0``: H target rows over all (L+1)H tokens) as a table of each head's attention on each sequence,
and per head its queries against the positions of the sequence it attends to most (``L0H3 -> d5 (0.94)``),
labelled ``h2``. Where those blocks are not square, the layer falls back to queries then keys along both
axes (a query's weights in its row under the key columns, the rest empty). Each view is wide enough for
every label (a 49-position model's too): a narrow window scrolls rather than dropping labels.
"""

from __future__ import annotations

from analyses import common

NAME = "attention_view"
REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    context: int = common.option(0, "which of the contexts sampled with --seed to show", minimum=0)  # memory: compute


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import html
import json
from pathlib import Path

import circuitsvis
import torch

from models.plumbing.io import UsageError, check_memory

MAX_CELLS = 5_000_000  # numbers in the page's views: about 40 MB of HTML
# Chart.js (circuitsvis's plots) skips tick labels closer than ~17 px: each view is made at least this many
# pixels per row wide (plus room for the labels), so that every row and column keeps its label at any
# window width (a narrow window scrolls).
ROW_PX, LABEL_PX = 20, 150
FIGURES = {
    "attention_view.html": (
        "interactive circuitsvis view of one context's attention, every layer and head, only what holds data: "
        "blocks.0 (12 target queries over all 132 tokens) as a table of each head's attention per sequence and, per "
        "head, its queries against the positions of the demonstration it copies (L0H3 → d5 (0.94)); blocks.1 as "
        "its 12 x 12 square. Every position labelled with the token it holds (tgt:h2, d5:h3)"
    ),
}


def position_names(pairs: torch.Tensor, n_examples: int, bos: bool = False, none: str | None = None) -> list[str]:
    """Names of task tokens, ``[n, 2]`` pairs (l, h) -> ``d3:h5`` (demonstration 3, position 5), ``tgt:h5``
    (l = L, the target). No task token (-1, -1): ``none`` if given (a query that predicts none), else ``bos``
    at position 0 of a layout with a BOS and ``sep`` elsewhere (a key). Short: circuitsvis shows them with
    `` (index)`` appended."""
    out = []
    for p, (l, h) in enumerate(pairs.tolist()):
        if l < 0:
            out.append(none if none is not None else "bos" if bos and p == 0 else "sep")
        else:
            out.append(f"tgt:h{h}" if l == n_examples else f"d{l}:h{h}")
    return out


def prediction_offset(query_predicts: torch.Tensor, key_token: torch.Tensor) -> int | None:
    """k when query i predicts the token key i + k holds, for every i with such a key (0: the disentangled
    model's target layer, each query at the slot of the token it predicts; 1: a causal LM's next-token
    shift), else None."""
    Q, K = len(query_predicts), len(key_token)
    for k in (0, 1):
        n = min(Q, K - k)
        if n > 0 and torch.equal(query_predicts[:n], key_token[k : k + n]):
            return k
    return None


def layer_view(pattern: torch.Tensor, query_labels: list[str], key_labels: list[str]) -> dict:
    """One layer as circuitsvis's square ``attention [head, n, n]`` over the labels queries + keys: row i < Q
    (query i) holds its pattern in the key columns Q.., every other cell is 0."""
    n_heads, Q, K = pattern.shape
    square = pattern.new_zeros(n_heads, Q + K, Q + K)
    square[:, :Q, Q:] = pattern
    return {"tokens": query_labels + key_labels, "attention": square.round(decimals=4).tolist()}


def compute(subject, config: Config) -> dict:
    """The patterns of context ``--context`` of those sampled with ``--seed``, with their labels."""
    task = subject.task
    n = config.context + 1  # the contexts and their sampling buffers (int64), as models.interp.memory.forward_bytes counts them
    check_memory(3 * n * task.n_tokens * 8, f"--context {config.context} (samples {n} contexts of {task.n_tokens} tokens)")
    tokens, parents = common.sample_contexts(task, n, config.seed)
    tokens, parents = tokens[config.context :], parents[config.context]
    with torch.no_grad():
        layers = subject.attention(tokens.to(subject.device))
    heads = subject.head_labels()
    out, start = [], 0
    for i, layer in enumerate(layers):
        n = layer.pattern.shape[1]
        out.append(
            {
                "layer": i,
                "heads": heads[start : start + n],
                "queries": position_names(layer.query_predicts, task.n_examples, none="none"),
                "keys": position_names(layer.key_token, task.n_examples, bos=subject.layout.bos is not None),
                "offset": prediction_offset(layer.query_predicts, layer.key_token),
                "pattern": layer.pattern[0].cpu().double(),
            }
        )
        start += n
    cells = sum(len(l["heads"]) * (len(l["queries"]) + len(l["keys"])) ** 2 for l in out)
    if cells > MAX_CELLS:
        raise UsageError(
            f"the view of {subject.describe()} would hold {cells:,} numbers, more than a browser page holds "
            f"({MAX_CELLS:,}); view a smaller model, or summarise its patterns with analyses.copyers / bma_agreement"
        )
    H = task.seq_len
    sequences = tokens[0].view(task.n_examples + 1, H).tolist()
    return {
        "model": subject.describe(),
        "context": config.context,
        "tokens": {("tgt" if l == task.n_examples else f"d{l}"): seq for l, seq in enumerate(sequences)},
        "parents": parents.tolist(),
        "layers": out,
    }


def _circuitsvis_js() -> str:
    """circuitsvis's browser bundle, as ``circuitsvis.utils.render.render_local`` inlines it."""
    bundle = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not bundle.is_file():
        raise UsageError(
            f"circuitsvis {circuitsvis.__version__} has no {bundle.name} bundle; expected circuitsvis>=1.43"
        )
    return bundle.read_text(encoding="utf-8").replace("</script>", "")


def sequence_of(key: str) -> str:
    """The sequence a key label belongs to: ``d3`` for ``d3:h5``, ``tgt`` for ``tgt:h2``, ``special`` else."""
    return key.split(":")[0] if ":" in key else "special"


def sequence_mass(pattern: torch.Tensor, key_labels: list[str]) -> tuple[list[str], torch.Tensor]:
    """The sequences in key order and each head's attention on each, averaged over queries: ``[head, seq]``."""
    seqs = list(dict.fromkeys(sequence_of(k) for k in key_labels))
    index = torch.tensor([seqs.index(sequence_of(k)) for k in key_labels])
    mass = pattern.new_zeros(pattern.shape[0], len(seqs)).index_add_(1, index, pattern.mean(1))
    return seqs, mass


def square_views(
    pattern: torch.Tensor, query_labels: list[str], key_labels: list[str], offset: int | None = None
) -> dict | None:
    """What holds data, as circuitsvis's square ``attention [head, n, n]`` with one short label per position,
    shared by both axes (``tokens``; ``legend`` says how to read them).

    A square layer (queries at the key positions): as it is, each position labelled with the token it holds
    when every query predicts the token ``offset`` positions on (``prediction_offset``), else ``key>query``.
    A layer with fewer queries than keys: per head, its queries against the keys of the one sequence it
    attends to most (the head named ``L0H3 -> d5 (0.98)``, that sequence and the share of the head's
    attention on it), each labelled with the position ``h5`` when query i predicts the target's token at
    column i's position, else ``query>position``; None when those blocks are not square (then
    ``layer_view``)."""
    n_heads, Q, K = pattern.shape
    if Q == K:
        if offset is None:
            legend = "each label is <i>the token the position holds&gt;the token its query predicts</i>"
            return {"tokens": [f"{k}>{q}" for q, k in zip(query_labels, key_labels)], "attention": pattern,
                    "names": None, "legend": legend}  # fmt: skip
        special = " (<i>bos</i>, <i>sep</i>: the special ids)" if {"bos", "sep"} & set(key_labels) else ""
        legend = f"each label is the token the position holds{special}; " + (
            "each row's query predicts the token of the row below it (the next-token shift)"
            if offset == 1
            else "each row's query predicts the token at its own position"
        )
        return {"tokens": list(key_labels), "attention": pattern, "names": None, "legend": legend}
    seqs, mass = sequence_mass(pattern, key_labels)
    best = mass.argmax(1)
    blocks, names, positions = [], [], None
    for head in range(n_heads):
        cols = [j for j, k in enumerate(key_labels) if sequence_of(k) == seqs[best[head]]]
        if len(cols) != Q:
            return None
        pos = [key_labels[j].split(":", 1)[-1] for j in cols]
        if positions not in (None, pos):
            return None
        positions = pos
        blocks.append(pattern[head][:, cols])
        names.append(f"{seqs[best[head]]} ({mass[head, best[head]].item():.2f})")
    if [f"tgt:{p}" for p in positions] == query_labels:
        tokens, legend = positions, "row <i>h</i>: the query predicting the target's token at <i>h</i>; column <i>h</i>: position <i>h</i>"
    else:
        tokens, legend = [f"{q}>{p}" for q, p in zip(query_labels, positions)], "each label is <i>what the query predicts&gt;the key's position</i>"
    return {"tokens": tokens, "attention": torch.stack(blocks), "names": names, "legend": legend}


def mass_table(layer: dict) -> str:
    """An HTML table: each head's attention (averaged over queries) on each sequence, shaded."""
    seqs, mass = sequence_mass(layer["pattern"], layer["keys"])
    head = "".join(f"<th>{html.escape(s)}</th>" for s in seqs)
    rows = []
    for name, row in zip(layer["heads"], mass.tolist()):
        cells = "".join(
            f'<td style="background:rgba(30,90,200,{v:.2f});color:{"#fff" if v > 0.5 else "#000"}">{v:.2f}</td>'
            for v in row
        )
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    return f'<table class="mass"><tr><th>head</th>{head}</tr>{"".join(rows)}</table>'


def render_html(result: dict, title: str) -> str:
    """The self-contained page: a heading and caption per layer, then one script rendering every layer."""
    esc = html.escape
    context = "".join(
        f"<tr><th>{esc(name)}</th>{''.join(f'<td>{t}</td>' for t in seq)}</tr>"
        for name, seq in result["tokens"].items()
    )
    sections, calls, widths = [], [], []
    for layer in result["layers"]:
        div = f"attention-layer-{layer['layer']}"
        q, k = len(layer["queries"]), len(layer["keys"])
        view = square_views(layer["pattern"], layer["queries"], layer["keys"], layer.get("offset"))
        heading = f"<h2>blocks.{layer['layer']}: {len(layer['heads'])} head(s), {q} queries x {k} keys</h2>\n"
        if view is None:  # fall back: queries then keys along both axes, the rest of the square empty
            view = {**layer_view(layer["pattern"], [f"q:{x}" for x in layer["queries"]], layer["keys"]), "names": None}
            caption = (
                f"<p>Labels run queries first (q:{esc(layer['queries'][0])} .. q:{esc(layer['queries'][-1])}, named by the "
                f"token each predicts), then keys "
                f"({esc(layer['keys'][0])} .. {esc(layer['keys'][-1])}): each query's weights are in its row, under "
                f"the key columns.</p>\n"
            )
        elif view["names"] is None:
            caption = f"<p>Rows: queries, columns: keys; {view['legend']}.</p>\n"
        else:
            caption = (
                f"<p>Each head's attention on each sequence (averaged over its {q} queries; every key counted):</p>\n"
                f"{mass_table(layer)}\n<p>Below, per head, its {q} queries (rows) against the positions of the "
                "sequence it attends to most (columns), named with the head with its share of the head's "
                f"attention; {view['legend']}. The rest of the head's attention (the table) is not drawn.</p>\n"
            )
        sections.append(f'{heading}{caption}<div id="{div}"></div>')
        widths.append(f"#{div}>div{{min-width:{ROW_PX * len(view['tokens']) + LABEL_PX}px}}")
        names = (
            layer["heads"] if view["names"] is None else [f"{h} → {n}" for h, n in zip(layer["heads"], view["names"])]
        )
        attention = view["attention"]
        props = {
            "attentionHeadNames": names,
            "maxValue": 1,
            "minValue": 0,
            "maskUpperTri": False,
            "tokens": view["tokens"],
            "attention": attention.round(decimals=4).tolist() if isinstance(attention, torch.Tensor) else attention,
        }
        props_js = json.dumps(props).replace("</", "<\\/")
        calls.append(f'CircuitsVis.render("{div}", CircuitsVis.AttentionHeads, {props_js});')
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n"
        "<style>body{font-family:sans-serif;margin:16px} table{border-collapse:collapse;font-size:12px}"
        " td,th{border:1px solid #ccc;padding:1px 5px} " + " ".join(widths) + "</style>\n</head>\n<body>\n"
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


def pages(result: common.Result) -> dict[str, str]:
    """``{"attention_view.html": the page}``: what this analysis writes instead of figures."""
    c = result.config
    return {f"{NAME}.html": render_html(result.data, f"Attention of {result.subject}, context {c.context} (seed {c.seed})")}


ANALYSIS = common.register(globals())
