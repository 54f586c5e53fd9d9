"""Constructed models whose circuit is known exactly, shared by tests/analyses/test_inspect.py and tests/models/interp/test_circuit.py.

``TransposedCircuit``: a standard-layout LM with a real residual stream (a sum of writes, one subspace per
writer) and every hook TransformerLens names and ``models.interp.circuit.build_graph`` reads (``hook_embed``,
``hook_pos_embed``, ``blocks.i.hook_resid_pre``, each head's ``hook_q`` / ``hook_k`` / ``hook_v`` computed
position by position from that residual, ``hook_pattern``, ``hook_z`` and ``W_O``, ``hook_resid_mid``,
MLP0's ``hook_mlp_out``, the final ``hook_resid_post``), computing BMA exactly by a route that is not
the paper's (the transpose of it), so that every edge is known to be used or not.

``one_copyer_nanogpt_state``: nanoGPT weights whose attention looks like the paper's circuit with one copyer
for several demonstrations, and whose copyer and selector alone are known not to suffice."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from models.interp.subject import StandardSubject
from probes import Layout

BLOCKED = -1e9  # an attention score that softmax turns into exactly zero (float64)


class TransposedCircuit(HookedRootModule):
    """The transposed circuit, in a residual stream of subspaces E (token one-hot, d), P (absolute position
    one-hot, T), A (L0H0's write, d * H), B (L0H1's write, d * H), S (MLP0's write, H), Z (L1H0's write, H).

    - L0H0 and L0H1, within-sequence prefix heads: from (l, j) they attend evenly to (l, j'), j' < j
      (themselves at j = 0), queries and keys from P, value onehot(x_j') (x) e_j' from E and P.
      L0H0 writes A, read by MLP0; L0H1 writes B, read by the read-out only (so L0H1 matters only where
      the read-out's predictions count: the target's own prefix).
    - MLP0 at (l, j), from E, P and A: s[j'] = log pi(x_j | x_j') for j' < j (0 elsewhere), into S.
    - L1H0, a cross-demonstration same-position reader: from (l, j), the query predicting (l, j + 1), it
      attends evenly to (l', j + 1) of every earlier sequence l' < l (itself if none), queries and keys
      from P (content-free), value S, into Z. The evidence is pooled through its values at fixed positions.
    - L1H1 attends to itself, value S, and writes nothing (W_O = 0).
    - The read-out at (l, j), from P, E, B and Z: posterior softmax(l * z) over h' <= j, the candidate
      tokens the prefix in B and its own token, predictive sum posterior pi(. | x_h'). At the target
      (l = L) this is BMA exactly. The last position of a sequence predicts the root distribution."""

    def __init__(self, task):
        super().__init__()
        self.task, self.L, self.H, self.d = task, task.n_examples, task.seq_len, task.d_vocab
        L, H, d = self.L, self.H, self.d
        T = (L + 1) * H
        self.cfg = SimpleNamespace(n_heads=2, n_layers=2, device="cpu")
        self.layout = Layout(L, H, d)
        sizes = {"E": d, "P": T, "A": d * H, "B": d * H, "S": H, "Z": H}
        self.sub, start = {}, 0
        for name, n in sizes.items():
            self.sub[name] = slice(start, start + n)
            start += n
        self.d_model = start
        self.hook_embed, self.hook_pos_embed = HookPoint(), HookPoint()
        self.blocks = torch.nn.ModuleList()
        for i in range(2):
            block = torch.nn.Module()
            block.hook_resid_pre, block.hook_resid_mid, block.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
            block.attn = torch.nn.Module()
            for name in ("q", "k", "v", "pattern", "z"):
                setattr(block.attn, f"hook_{name}", HookPoint())
            if i == 0:
                block.hook_mlp_out = HookPoint()
            self.blocks.append(block)
        seq, pos = torch.arange(T) // H, torch.arange(T) % H
        same_seq, earlier = seq.view(-1, 1) == seq.view(1, -1), pos.view(1, -1) < pos.view(-1, 1)
        prefix = same_seq & earlier
        reader = (seq.view(1, -1) < seq.view(-1, 1)) & (pos.view(1, -1) == pos.view(-1, 1) + 1)
        eye = torch.eye(T, dtype=torch.bool)
        allowed = lambda m: m | (eye & ~m.any(-1, keepdim=True))  # noqa: E731  (a row with no key: itself)
        # Query of a head = its score row over absolute key positions; key = the key's position one-hot.
        self.score_rows = [
            torch.stack([allowed(prefix), allowed(prefix)]),
            torch.stack([allowed(reader), eye]),
        ]
        self.score_rows = [torch.where(m, 0.0, BLOCKED).double() for m in self.score_rows]  # [head, q pos, k pos]
        self.seq, self.pos = seq, pos
        D, dH = self.d_model, d * H
        W_O0 = torch.zeros(2, dH, D, dtype=torch.float64)
        W_O0[0, :, self.sub["A"]], W_O0[1, :, self.sub["B"]] = torch.eye(dH), torch.eye(dH)
        W_O1 = torch.zeros(2, H, D, dtype=torch.float64)
        W_O1[0, :, self.sub["Z"]] = torch.eye(H)
        self.blocks[0].attn.W_O, self.blocks[1].attn.W_O = W_O0, W_O1
        self.setup()

    def _attention(self, i: int, resid, value):
        """Layer ``i``: queries and keys from P, the given per-head values ``[b, T, head, d_head]``."""
        attn, P = self.blocks[i].attn, resid[..., self.sub["P"]]
        q = attn.hook_q(torch.einsum("btp,npk->btnk", P, self.score_rows[i]))
        k = attn.hook_k(P.unsqueeze(2).expand(-1, -1, 2, -1))
        v = attn.hook_v(value)
        pattern = attn.hook_pattern(torch.einsum("bqnk,bpnk->bnqp", q, k).softmax(-1))
        z = attn.hook_z(torch.einsum("bnqp,bpnv->bqnv", pattern, v))
        return torch.einsum("btnv,nvD->btD", z, attn.W_O)

    def _prefix_tokens(self, write, P):
        """onehot(x_j') of the sequence's prefix, ``[b, T, j', d]``, from a prefix head's write."""
        b, T = write.shape[:2]
        count = (P @ self.pos.double()).clamp_min(1).view(b, T, 1, 1)
        return write.view(b, T, self.d, self.H).transpose(2, 3) * count

    def forward(self, ids):
        b, T = ids.shape
        H, d, pi, sub, D = self.H, self.d, self.task.pi.double(), self.sub, self.d_model
        embed = torch.zeros(b, T, D, dtype=torch.float64)
        embed[..., sub["E"]] = torch.nn.functional.one_hot(ids, d).double()
        pos_embed = torch.zeros(1, T, D, dtype=torch.float64)
        pos_embed[0, :, sub["P"]] = torch.eye(T, dtype=torch.float64)
        resid = self.blocks[0].hook_resid_pre(self.hook_embed(embed) + self.hook_pos_embed(pos_embed))
        own, P = resid[..., sub["E"]], resid[..., sub["P"]]
        at = P @ torch.nn.functional.one_hot(self.pos, H).double()  # [b, T, H]: position within the sequence
        value0 = torch.einsum("btd,btj->btdj", own, at).flatten(2).unsqueeze(2).expand(-1, -1, 2, -1)
        resid = self.blocks[0].hook_resid_mid(resid + self._attention(0, resid, value0))
        own, P, j = resid[..., sub["E"]], resid[..., sub["P"]], resid[..., sub["P"]] @ self.pos.double()
        pair = self._prefix_tokens(resid[..., sub["A"]], P) @ pi  # [b, T, j', s] = pi(s | x_j')
        s = torch.einsum("btjs,bts->btj", pair, own).clamp_min(1e-30).log()
        s = torch.where(torch.arange(H).view(1, 1, -1) < j.unsqueeze(-1), s, 0.0)  # j' < j only
        mlp = torch.zeros(b, T, D, dtype=torch.float64)
        mlp[..., sub["S"]] = s
        resid = self.blocks[1].hook_resid_pre(self.blocks[0].hook_mlp_out(mlp) + resid)
        value1 = resid[..., sub["S"]].unsqueeze(2).expand(-1, -1, 2, -1)
        resid = self.blocks[1].hook_resid_mid(resid + self._attention(1, resid, value1))
        resid = self.blocks[1].hook_resid_post(resid)
        return self._read_out(resid)

    def _read_out(self, resid):
        """Position by position: the predictive over the next token (log), ``[b, T, d]``."""
        H, pi, sub = self.H, self.task.pi.double(), self.sub
        own, P = resid[..., sub["E"]], resid[..., sub["P"]]
        j, n_demos = P @ self.pos.double(), P @ self.seq.double()
        candidates = self._prefix_tokens(resid[..., sub["B"]], P)  # [b, T, h', d]
        here = torch.nn.functional.one_hot(self.pos, H).double()  # [T, h']: h' = j is the own token
        candidates = candidates * (1 - here).view(1, -1, H, 1) + own.unsqueeze(2) * here.view(1, -1, H, 1)
        later = torch.arange(H).view(1, 1, -1) > j.unsqueeze(-1)
        scores = (n_demos.unsqueeze(-1) * resid[..., sub["Z"]]).masked_fill(later, -torch.inf)
        predictive = torch.einsum("btj,btjs->bts", scores.softmax(-1), candidates @ pi)
        root = (self.pos == H - 1).view(1, -1, 1)  # the last token of a sequence predicts the next root
        predictive = torch.where(root, self.task.root.double().view(1, 1, -1), predictive)
        return predictive.clamp_min(1e-30).log()


def transposed_subject(task) -> StandardSubject:
    model = TransposedCircuit(task)
    return StandardSubject(model, task, model.layout, "transposed", "0")


def transposed_truth(graph, corruption: str) -> set:
    """The edges of ``TransposedCircuit``'s computation (read from its construction, above) that a
    corruption can see: the edge is read on the way to a target prediction (``USED``) and the corruption
    changes its sender's value at the edge's positions (``CHANGED``)."""
    return {e for e in graph.edges
            if e.sender in CHANGED[corruption].get(e.group, ()) and (e.sender, e.receiver, e.input) in USED[e.group]}  # fmt: skip


# At the demonstration positions what counts is what L1H0 reads there (MLP0 and its inputs; the read-out's
# predictions there are not scored); at the target, what the read-out reads (L1H0, L0H1, the token) and
# L0H1's input.
USED = {
    "demonstrations": {("embed", "L0H0", "v"), ("embed", "MLP0", "in"), ("L0H0", "MLP0", "in"), ("MLP0", "L1H0", "v")},
    "target": {("embed", "L0H1", "v"), ("embed", "output", "out"), ("L0H1", "output", "out"),
               ("L1H0", "output", "out")},  # fmt: skip
}
# The position embedding never changes. The demonstrations corruption changes every sender at the
# demonstration positions and, at the target, only what reads the demonstrations (L1H0). The target
# corruption changes every sender at the target positions but L1H0, whose write at a scored target position
# reads the demonstrations only (at the last position it reads itself, but that position predicts the root).
CHANGED = {
    "demonstrations": {"demonstrations": {"embed", "L0H0", "L0H1", "MLP0", "L1H0", "L1H1"}, "target": {"L1H0"}},
    "target": {"target": {"embed", "L0H0", "L0H1", "MLP0", "L1H1"}},
}


def one_copyer_nanogpt_state(task, demo: int = 0, beta: float = 30.0) -> tuple[dict, dict]:
    """nanoGPT weights (model.py's names, ``bias=False``, plain layout: demonstration l's x_j at l H + j, the
    target's at L H + j) for a paper-like circuit with ONE copyer for its L demonstrations; returns
    (state, model_args). Four heads per layer; residual blocks, each a +/- pair of one-hots so that every
    LayerNorm before the last is one known scale: T (own token), P (position), Q (L0H0's write), K (L0H1's
    write), O (L1H0's write, the only block the final LayerNorm passes to the tied unembedding).

    - L0H0, the copyer of demonstration ``demo``: the query predicting the target's x_h (at L H + h - 1)
      attends to x_h of that demonstration (``beta`` on one key); elsewhere to itself. Writes its token to Q.
    - L0H1, not a copyer: from the target's x_j it attends to x_j of the same demonstration (position h - 1
      from the query predicting x_h); elsewhere to itself. Writes its token to K.
    - L1H0, a parent selector: from the query predicting x_h over the target's x_h', h' < h (the other keys
      blocked), scores log pi(x_h'^(demo), x_h^(demo)) (query from Q, key from K), the one-demonstration
      posterior; its value is the target's own x_h', written to O as log pi(x_h', .).
    - L0H2, L0H3, L1H1-L1H3: zero queries, keys and output; both MLPs zero.
    So the copyer and the selector alone (L0H1 mean-ablated) keep little of the progress: the attention looks
    like the paper's circuit, and it is not sufficient."""
    L, H, V = task.n_examples, task.seq_len, task.d_vocab
    n, nh = (L + 1) * H, 4
    hs = n + 1
    C = nh * hs
    sizes = {"T": 2 * V, "P": 2 * n, "Q": 2 * V, "K": 2 * V, "O": 2 * V}  # each block [start, end) in order
    ends = torch.tensor(list(sizes.values())).cumsum(0).tolist()
    T, P, Q, K, O = ((end - size, end) for size, end in zip(sizes.values(), ends))
    assert O[1] <= C
    a, b, kappa = 1.0, 1e-4, 0.01
    dt = torch.float64

    def pm(block, i):  # the + and - coordinates of one-hot i in a block
        return block[0] + i, block[0] + (block[1] - block[0]) // 2 + i

    wte, wpe = torch.zeros(V, C, dtype=dt), torch.zeros(n, C, dtype=dt)
    for v in range(V):
        (p_, m_), (po, mo) = pm(T, v), pm(O, v)
        wte[v, p_], wte[v, m_], wte[v, po], wte[v, mo] = a, -a, b, -b
    for p in range(n):
        p_, m_ = pm(P, p)
        wpe[p, p_], wpe[p, m_] = a, -a
    # every LayerNorm before the last sees T, P (and after layer 0, Q and K) at +-a, O at +-b: one scale each
    s0 = (C / (2 * 2 * a**2 + 2 * b**2)) ** 0.5
    s1 = (C / (4 * 2 * a**2 + 2 * b**2)) ** 0.5

    def read(block, i, s):  # a row reading one-hot i of a block, after a LayerNorm of scale s: 1 where set
        row = torch.zeros(C, dtype=dt)
        p_, m_ = pm(block, i)
        row[p_], row[m_] = 1 / (2 * s * a), -1 / (2 * s * a)
        return row

    target = lambda j: L * H + j  # noqa: E731
    copy_to = {target(h) - 1: demo * H + h for h in range(H)}
    same_to = {target(j): demo * H + j for j in range(H)}
    Wq, Wk, Wv, Wo = (torch.zeros(2, C, C, dtype=dt) for _ in range(4))  # [layer, out, in]; head j: rows j hs..
    for j, to in ((0, copy_to), (1, same_to)):  # positional heads of layer 0
        for p in range(n):
            Wq[0, j * hs + to.get(p, p)] += beta * hs**0.5 * read(P, p, s0)
            Wk[0, j * hs + p] += read(P, p, s0)
        for v in range(V):
            Wv[0, j * hs + v] = read(T, v, s0)
            block = Q if j == 0 else K
            Wo[0, pm(block, v)[0], j * hs + v], Wo[0, pm(block, v)[1], j * hs + v] = a, -a
    logpi = task.pi.double().clamp_min(1e-6).log()
    for v in range(V):  # the selector: query onehot(x_h^(demo)), key log pi(x_h'^(demo), .), value onehot(x_h')
        Wq[1, v] = hs**0.5 * read(Q, v, s1)
        Wk[1] += torch.outer(torch.cat([logpi[v], torch.zeros(C - V, dtype=dt)]), read(K, v, s1))
        Wv[1, v] = read(T, v, s1)
        Wo[1, O[0] : O[0] + V, v] = kappa * logpi[v]
        Wo[1, O[0] + V : O[1], v] = -kappa * logpi[v]
    blocked = hs - 1  # one query coordinate, 1 at every position; keys outside the target there at -1e4
    for p in range(n):
        Wq[1, blocked] += hs**0.5 * read(P, p, s1)
        if p < L * H:
            Wk[1, blocked] -= 1e4 * read(P, p, s1)
    ln_f = torch.zeros(C, dtype=dt)
    s_f = s1  # the final residual is layer 1's input plus O's small write
    ln_f[O[0] : O[1]] = 1 / (2 * s_f * b * kappa)
    state = {"transformer.wte.weight": wte, "transformer.wpe.weight": wpe, "transformer.ln_f.weight": ln_f}
    for i in range(2):
        p = f"transformer.h.{i}."
        state[p + "ln_1.weight"] = torch.ones(C, dtype=dt)
        state[p + "attn.c_attn.weight"] = torch.cat([Wq[i], Wk[i], Wv[i]])
        state[p + "attn.c_proj.weight"] = Wo[i]
        state[p + "ln_2.weight"] = torch.ones(C, dtype=dt)
        state[p + "mlp.c_fc.weight"] = torch.zeros(4 * C, C, dtype=dt)
        state[p + "mlp.c_proj.weight"] = torch.zeros(C, 4 * C, dtype=dt)
    state = {k: v.float() for k, v in state.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]  # tied, as GPT.__init__ ties them
    args = dict(n_layer=2, n_head=nh, n_embd=C, block_size=n, bias=False, vocab_size=V, dropout=0.0)
    return state, args
