"""analyses.attention_view: a well-formed, self-contained HTML page whose circuitsvis views put each
model pattern value under the right query and key labels, and show only what holds data."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
import torch
from conftest import build_task
from test_layout import assemble

import models
from analyses import attention_view

VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "embed", "source", "track", "wbr"}


class TagBalance(HTMLParser):
    """Every non-void tag closed in order; script bodies kept."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.scripts, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        (self.scripts if self.stack and self.stack[-1] == "script" else self.text).append(data)


def views(page: str) -> dict[str, dict]:
    """The props of every ``CircuitsVis.render(div, CircuitsVis.AttentionHeads, props)`` call, by div."""
    calls = re.findall(r'CircuitsVis\.render\("([\w-]+)", CircuitsVis\.AttentionHeads, (\{.*?\})\);\n', page)
    return {div: json.loads(props) for div, props in calls}


def test_the_page_is_well_formed_and_labels_every_query_and_key(tmp_path):
    attention_view.main(["--out", str(tmp_path), "--seed", "0", "--context", "2"])
    page = (tmp_path / "attention_view.html").read_text(encoding="utf-8")
    parser = TagBalance()
    parser.feed(page)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    assert page.startswith("<!DOCTYPE html>") and "https://" not in "".join(parser.text)
    assert "CircuitsVis" in parser.scripts[0] and len(parser.scripts[0]) > 100_000  # the inlined bundle
    record = json.loads((tmp_path / "attention_view.json").read_text())
    assert record["seed"] == 0 and record["results"]["context"] == 2

    # the same context and patterns, computed here from the model
    task = models.load_task(models.DEFAULT_CHECKPOINT)
    model = models.load(models.DEFAULT_CHECKPOINT)
    tokens, _ = task.sample(3, torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[2:])
    L, H, K = task.n_examples, task.seq_len, model.cfg.n_copy_heads
    shown = views(page)
    assert set(shown) == {"attention-layer-0", "attention-layer-1"}
    copy, select = shown["attention-layer-0"], shown["attention-layer-1"]
    # blocks.0 (H target queries over all (L+1)H keys): per head, its queries against the H positions of the
    # sequence holding most of its attention, found here from the cache
    pattern = cache["blocks.0.attn.hook_pattern"][0].double()  # [head, query, key]
    per_sequence = pattern.mean(1).view(K, L + 1, H).sum(-1)  # [head, sequence]
    best = per_sequence.argmax(1)
    names = [f"d{l}" if l < L else "tgt" for l in best.tolist()]
    assert copy["attentionHeadNames"] == [
        f"L0H{k} → {names[k]} ({per_sequence[k, best[k]].item():.2f})" for k in range(K)
    ]
    assert copy["tokens"] == [f"h{h}" for h in range(H)]  # row h: the query predicting x_h; column h: position h
    grid = torch.tensor(copy["attention"], dtype=torch.float64)
    want = torch.stack([pattern[k, :, best[k] * H : (best[k] + 1) * H] for k in range(K)])
    torch.testing.assert_close(grid, want, rtol=0, atol=5e-5)  # shown to 4 decimals
    # the table beside it: every head's mass on every sequence, printed to 2 decimals
    table = re.search(r'<table class="mass">(.*?)</table>', page).group(1)
    rows = re.findall(r"<tr><th>(L0H\d+)</th>(.*?)</tr>", table)
    assert [r[0] for r in rows] == [f"L0H{k}" for k in range(K)]
    for k, (_, cells) in enumerate(rows):
        got = torch.tensor([float(v) for v in re.findall(r">([\d.]+)</td>", cells)], dtype=torch.float64)
        torch.testing.assert_close(got, per_sequence[k], rtol=0, atol=0.006)
    # blocks.1 (square: the target queries over the target's keys): as it is, one label per position
    assert select["attentionHeadNames"] == ["L1H0"]
    assert select["tokens"] == [f"tgt:h{h}" for h in range(H)]  # each row predicts its own position's token
    assert "predicts the token at its own position" in page
    grid = torch.tensor(select["attention"], dtype=torch.float64)
    torch.testing.assert_close(grid, cache["blocks.1.attn.hook_pattern"][0].double(), rtol=0, atol=5e-5)
    # one cell by its labels: head 3's query predicting x_5 on position 5 of the sequence it reads most
    q, k = copy["tokens"].index("h5"), 5
    assert copy["attention"][3][q][k] == pytest.approx(pattern[3, 5, best[3] * H + 5].item(), abs=5e-5)
    # the context itself is printed, one row per sequence
    assert f"<th>d{L - 1}</th>" in page and "<th>tgt</th>" in page


def test_bad_context_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        attention_view.main(["--out", str(tmp_path), "--context", "-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--context must be >= 0" in err
    assert not (tmp_path / "attention_view.html").exists()


def test_a_view_too_big_for_a_browser_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attention_view, "MAX_CELLS", 1000)
    with pytest.raises(SystemExit) as e:
        attention_view.common.run_cli(attention_view.main, ["--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "more than a browser page holds" in err
    assert not (tmp_path / "attention_view.html").exists()


def test_its_errors_name_the_entry_point_the_user_ran(tmp_path, monkeypatch, capsys):
    """Run as ``python -m analyses.attention_view``, its module is ``__main__``: errors began
    ``python -m analyses.__main__: error:``; now they name the entry point (the module's spec, as Python
    sets it for ``-m``)."""
    import importlib.machinery
    import sys
    import types

    as_run = types.ModuleType("__main__")
    as_run.__spec__ = importlib.machinery.ModuleSpec("analyses.attention_view", None)
    monkeypatch.setitem(sys.modules, "__main__", as_run)
    monkeypatch.setattr(attention_view, "MAX_CELLS", 1000)
    with pytest.raises(SystemExit) as e:
        attention_view.common.run_cli(attention_view.main, ["--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m analyses.attention_view: error: the view of") and "__main__" not in err


def test_blocks_that_are_not_square_fall_back_to_the_full_layout():
    keys = ["d0:h0", "d0:h1", "d0:h2", "tgt:h0", "tgt:h1"]
    on_d0 = torch.tensor([[[0.5, 0.3, 0.2, 0.0, 0.0], [0.4, 0.4, 0.1, 0.05, 0.05]]])  # [head, query, key]
    assert attention_view.square_views(on_d0, ["tgt:h0", "tgt:h1"], keys) is None  # d0 has 3 keys, 2 queries
    on_tgt = on_d0[:, :, [2, 3, 4, 0, 1]]  # the first two columns moved onto the target's two keys
    view = attention_view.square_views(on_tgt, ["tgt:h0", "tgt:h1"], keys)
    assert view["names"] == ["tgt (0.80)"] and view["tokens"] == ["h0", "h1"]
    assert torch.equal(view["attention"], on_d0[:, :, :2])


def test_a_49_position_model_labels_every_position_shortly_as_its_layout_lists_them(tmp_path):
    """A GPT-2 with 8 heads reading 49 positions (BOS, 6 demonstrations and the target of 6 tokens, a separator
    after each demonstration): every position of both layers labelled, in a few characters, with the token an
    independent listing (the context assembled id by id, tests/probes/test_layout.py) puts there, and each
    cell the model's own attention (Hugging Face's ``output_attentions``) at the positions its labels name."""
    from transformers import GPT2Config, GPT2LMHeadModel

    L, H, d = 6, 6, 5
    task = build_task(d_vocab=d, n_examples=L, seq_len=H)
    special = {"bos": 0, "sep": 1, "token_offset": 2}
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=d + 2, n_positions=49, n_embd=16, n_layer=2, n_head=8, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    (tmp_path / "gpt2" / "task.json").write_text(json.dumps({**task.to_dict(), "layout": {"order": "example-major", **special}}))
    attention_view.main(["--checkpoint", str(tmp_path / "gpt2"), "--out", str(tmp_path / "out"), "--context", "1"])
    page = (tmp_path / "out" / "attention_view.html").read_text(encoding="utf-8")

    tokens, _ = task.sample(2, torch.Generator().manual_seed(0))
    ids, where, holds = assemble(tokens[1].tolist(), L, H, special["bos"], special["sep"], special["token_offset"])
    assert len(ids) == 49
    listing = ["bos" if p == 0 else "sep" if x is None else f"tgt:h{x[1]}" if x[0] == L else f"d{x[0]}:h{x[1]}"
               for p, x in enumerate(holds)]  # fmt: skip
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2", attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = hf(torch.tensor([ids]), output_attentions=True).attentions  # per layer [1, head, 49, 49]
    shown = views(page)
    assert set(shown) == {"attention-layer-0", "attention-layer-1"}
    for layer in range(2):
        view = shown[f"attention-layer-{layer}"]
        assert view["tokens"] == listing  # one label per position, the token it holds
        assert max(len(t) for t in view["tokens"]) <= 6  # circuitsvis shows "tgt:h5 (48)"
        assert view["attentionHeadNames"] == [f"L{layer}H{k}" for k in range(8)]
        grid = torch.tensor(view["attention"], dtype=torch.float64)
        torch.testing.assert_close(grid, attentions[layer][0].double(), rtol=0, atol=5e-5)
        # one cell by its labels: the query at the token before the target's x_3 (it predicts x_3), on d2's x_1
        q, k = view["tokens"].index("tgt:h2"), view["tokens"].index("d2:h1")
        assert (q, k) == (where[L, 2], where[2, 1])
        # wide enough that Chart.js (which skips tick labels closer than ~17.4 px: 12 px text, 1.2 line
        # height, 3 px padding) keeps every label: at least 17.4 px per row beside the labels' own width
        width = int(re.search(rf"#attention-layer-{layer}>div\{{[^}}]*min-width:(\d+)px", page).group(1))
        assert (width - attention_view.LABEL_PX) / 49 >= 17.4
    assert "the row below it (the next-token shift)" in page
