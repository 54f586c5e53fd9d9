"""inspect names the roles researchers name first, each against its chance (issue 54): a GPT-2-shaped model
(``models.nets.role_heads``: TransformerLens's parameter names, attention only, no LayerNorm) whose heads are set
through their weights to be, by construction, a sink head, a previous-token head, a self head, a fixed-offset
head (3 back) and an induction head; every other head has zero queries and keys, so it attends uniformly. inspect must name each
role on its head and name none on a uniform head, nor anywhere in a model whose every head is uniform. The
chances are checked against a closed form: uniform causal attention puts 1 / (q + 1) on any one key of
query q."""

from __future__ import annotations

import pytest
import torch
from conftest import build_task

from models.interp.inspection import inspect_subject
from models.interp.subject import subject_of
from models.nets.role_heads import OFFSET, role_heads_model
from probes.roles import position_scores, uniform_causal


@pytest.fixture(scope="module")
def task():
    return build_task(d_vocab=5, n_examples=3, seq_len=5)


@pytest.fixture(scope="module")
def found(task):
    return {roles: inspect_subject(subject_of(role_heads_model(task, roles), task, None, "roles", "0"), n_contexts=64)
            for roles in (True, False)}  # fmt: skip


def test_each_constructed_role_is_named_on_its_head_and_nowhere_else(found):
    r = found[True]
    roles = r["roles"]
    assert roles["L0H0"].startswith("sink head")
    assert roles["L0H2"].startswith("self head")
    assert roles["L0H3"].startswith(f"fixed-offset head ({OFFSET} positions back)")
    assert roles["L0H1"].startswith("previous-token head") and r["sequence_heads"]["previous_token"] == ["L0H1"]
    assert roles["L1H0"].startswith("induction head") and r["sequence_heads"]["induction"] == ["L1H0"]
    for head in ("L1H1", "L1H2", "L1H3"):  # zero queries and keys: uniform causal attention
        assert roles[head].startswith("no role"), roles[head]
    assert all(head not in labels for labels in r["sequence_heads"].values() for head in ("L1H1", "L1H2", "L1H3"))


def test_a_model_of_uniform_heads_has_no_role_anywhere(found):
    r = found[False]
    assert all(role.startswith("no role") for role in r["roles"].values()), r["roles"]
    assert not any(r["sequence_heads"].values()), r["sequence_heads"]
    for h in r["heads"]:  # uniform attention puts exactly its chance everywhere: ratio 1
        pos = h["position"]
        for name in ("sink", "self", "sequence_start"):
            assert pos[name] == pytest.approx(pos[f"{name}_chance"], abs=1e-9)


def test_the_chance_of_one_key_is_the_mean_of_one_over_the_keys_a_query_sees():
    """Closed form: a causal LM's query q sees q + 1 keys; uniform attention puts 1 / (q + 1) on each. The sink
    (key 0, queries q >= 1), self (every q) and offset k (queries q >= k) chances are the means of that."""
    T = 9
    keys = torch.stack([torch.zeros(T, dtype=torch.long), torch.arange(T)], 1)  # one sequence of T tokens
    predicts = torch.stack([torch.zeros(T, dtype=torch.long), torch.arange(1, T + 1)], 1)
    pattern = torch.rand(3, 2, T, T, generator=torch.Generator().manual_seed(0)).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    expected = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1).unsqueeze(1)
    assert torch.allclose(uniform_causal(pattern), expected.double())
    s = position_scores(pattern, predicts, keys)
    one_over = 1 / torch.arange(1, T + 1, dtype=torch.float64)
    assert s["self_chance"][0].item() == pytest.approx(one_over.mean().item())
    assert s["sink_chance"][0].item() == pytest.approx(one_over[1:].mean().item())
    for k in (1, 4):
        assert s["offsets_chance"][0, k - 1].item() == pytest.approx(one_over[k:].mean().item())
        brute = torch.stack([pattern[:, :, q, q - k] for q in range(k, T)], -1).mean((0, 2))
        assert torch.allclose(s["offsets"][:, k - 1], brute.double())


def test_the_explanation_page_quotes_what_its_script_prints(tmp_path, capsys):
    """docs/explanation/roles.md's block is ``python docs/scripts/roles_figure.py``'s output, line for line, and the
    script draws its figure."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "docs" / "scripts"))
    try:
        import roles_figure
    finally:
        sys.path.pop(0)
    roles_figure.main(["--out", str(tmp_path)])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("L0", "L1"))]
    page = (root / "docs" / "explanation" / "roles.md").read_text()
    assert len(printed) == len(roles_figure.HEADS) and all(line in page.splitlines() for line in printed), printed
    assert (tmp_path / "roles.png").stat().st_size > 10_000
