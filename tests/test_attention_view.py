"""analyses.attention_view: a well-formed, self-contained HTML page whose circuitsvis views put each
model pattern value under the right query and key labels."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
import torch

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
    assert copy["attentionHeadNames"] == [f"L0H{k}" for k in range(K)] and select["attentionHeadNames"] == ["L1H0"]
    queries = [f"q:tgt:h{h}" for h in range(H)]
    keys = [f"d{l}:h{h}" for l in range(L) for h in range(H)] + [f"tgt:h{h}" for h in range(H)]
    assert copy["tokens"] == queries + keys and select["tokens"] == queries + keys[-H:]
    for view, hook in ((copy, "blocks.0.attn.hook_pattern"), (select, "blocks.1.attn.hook_pattern")):
        grid = torch.tensor(view["attention"], dtype=torch.float64)
        n = len(view["tokens"])
        assert grid.shape == (len(view["attentionHeadNames"]), n, n)
        want = cache[hook][0].double()  # [head, query, key]
        torch.testing.assert_close(grid[:, :H, H:], want, rtol=0, atol=5e-5)  # shown to 4 decimals
        assert grid[:, H:].abs().sum() == 0 and grid[:, :, :H].abs().sum() == 0
    # one cell by its labels: head 3's query predicting x_5 on demonstration 4's position 5
    q, k = copy["tokens"].index("q:tgt:h5"), copy["tokens"].index("d4:h5")
    assert copy["attention"][3][q][k] == pytest.approx(
        cache["blocks.0.attn.hook_pattern"][0, 3, 5, 4 * H + 5].item(), abs=5e-5
    )
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
        attention_view.common.run(attention_view.main, ["--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "more than a browser page holds" in err
    assert not (tmp_path / "attention_view.html").exists()
