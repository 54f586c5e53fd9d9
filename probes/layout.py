"""Where a model's input ids hold the task's tokens.

The task's own layout is example-major (``probes.tasks``): token (l, h) of a context at flat index
``l * H + h``, l = L the target. A model trained by another pipeline may read the same context with a
BOS id first, a separator id between consecutive sequences, and the task's tokens shifted past a few
special ids (token s is id ``s + token_offset``). ``Layout`` maps one to the other; every analysis
reads positions through it, so the same code probes every model family.

With the ordinary next-token shift (a standard language model), the logits at position p predict the
id at p + 1, so target token x_h is predicted at ``token_positions()[L, h] - 1``.

task.json's ``layout`` field (``Layout.from_json``): the legacy string ``"example-major..."`` or
``{"order": "example-major", "bos": 0, "sep": 1, "token_offset": 2}`` (each key optional).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from jaxtyping import Int
from torch import Tensor

ORDER = "example-major"
LAYOUT_KEYS = ("order", "bos", "sep", "token_offset")


@dataclass(frozen=True)
class Layout:
    """Where a model's input ids hold the task's tokens (module docstring).

    Attributes:
        n_examples: L, the number of demonstrations (0: the target alone).
        seq_len: H, the tokens in a sequence.
        d_vocab: d, the task's vocabulary.
        bos: the id at position 0, before every sequence (None: no BOS).
        sep: the id between consecutive sequences, after each demonstration (None: none).
        token_offset: task token s is input id ``s + token_offset``.
    """

    n_examples: int  # L (0: the target alone)
    seq_len: int  # H
    d_vocab: int  # d, the task's vocabulary
    bos: int | None = None  # id at position 0, before every sequence
    sep: int | None = None  # id between consecutive sequences (L of them: after each demonstration)
    token_offset: int = 0  # task token s is input id s + token_offset

    def __post_init__(self):
        for name in ("n_examples", "seq_len", "d_vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (name != "n_examples"):
                raise ValueError(
                    f"layout {name} must be a {'non-negative' if name == 'n_examples' else 'positive'} integer, got {v!r}"
                )
        if not isinstance(self.token_offset, int) or isinstance(self.token_offset, bool) or self.token_offset < 0:
            raise ValueError(f"layout token_offset must be an integer >= 0, got {self.token_offset!r}")
        task_ids = range(self.token_offset, self.token_offset + self.d_vocab)
        for name in ("bos", "sep"):
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"layout {name} must be a token id >= 0 or null, got {v!r}")
            if v in task_ids:
                raise ValueError(
                    f"layout {name}={v} collides with the task's token ids {task_ids.start}..{task_ids.stop - 1}; "
                    f"set token_offset past the special ids"
                )

    @property
    def is_plain(self) -> bool:
        """True for the task's own layout (no BOS, no separator, no offset)."""
        return self.bos is None and self.sep is None and self.token_offset == 0

    @property
    def n_positions(self) -> int:
        """Length of the model's input: (L+1) H task tokens, plus BOS and L separators if present."""
        L, H = self.n_examples, self.seq_len
        return (L + 1) * H + (self.bos is not None) + L * (self.sep is not None)

    @property
    def min_vocab(self) -> int:
        """The smallest vocabulary that holds every id this layout uses."""
        specials = [v + 1 for v in (self.bos, self.sep) if v is not None]
        return max([self.token_offset + self.d_vocab, *specials])

    def token_positions(self) -> Int[Tensor, "L_plus_1 H"]:
        """Input position of task token (l, h)."""
        L, H = self.n_examples, self.seq_len
        stride = H + (self.sep is not None)
        return (self.bos is not None) + torch.arange(L + 1).view(-1, 1) * stride + torch.arange(H)

    def prediction_positions(self) -> Int[Tensor, " H"]:
        """Position whose next-token logits predict target token x_h (the ordinary shift)."""
        return self.token_positions()[self.n_examples] - 1

    def key_tokens(self) -> Int[Tensor, "T 2"]:
        """(l, h) of the task token at each input position; (-1, -1) for BOS and separators."""
        out = torch.full((self.n_positions, 2), -1, dtype=torch.long)
        pos = self.token_positions()
        L, H = pos.shape
        out[pos.flatten(), 0] = torch.arange(L).repeat_interleave(H)
        out[pos.flatten(), 1] = torch.arange(H).repeat(L)
        return out

    def encode(self, tokens: Int[Tensor, "batch n_tokens"]) -> Int[Tensor, "batch T"]:
        """Task tokens in the task's flat layout -> the model's input ids.

        Args:
            tokens: task tokens ``[batch, (L+1)*H]``, example-major (``MarkovTreeTask.sample``).

        Returns:
            The model's input ids ``[batch, n_positions]``: BOS, separators and shifted task tokens.
        """
        if self.is_plain:
            return tokens
        ids = torch.full((tokens.shape[0], self.n_positions), -1, dtype=tokens.dtype, device=tokens.device)
        ids[:, self.token_positions().flatten().to(tokens.device)] = tokens + self.token_offset
        if self.bos is not None:
            ids[:, 0] = self.bos
        if self.sep is not None:
            ids[:, self.token_positions()[:-1, -1].to(tokens.device) + 1] = self.sep
        return ids

    def to_json(self) -> dict:
        """task.json's ``layout`` field."""
        return {"order": ORDER, "bos": self.bos, "sep": self.sep, "token_offset": self.token_offset}

    @classmethod
    def from_json(cls, raw, n_examples: int, seq_len: int, d_vocab: int) -> Layout:
        """Parse task.json's ``layout`` (absent, the legacy string, or a dict of ``LAYOUT_KEYS``)."""
        if raw is None or (isinstance(raw, str) and raw.startswith(ORDER)):
            return cls(n_examples, seq_len, d_vocab)
        if not isinstance(raw, dict):
            raise ValueError(f"layout must be {ORDER!r} or an object with keys {list(LAYOUT_KEYS)}, got {raw!r}")
        unknown = sorted(set(raw) - set(LAYOUT_KEYS))
        if unknown:
            raise ValueError(f"unknown layout keys {unknown}; expected a subset of {list(LAYOUT_KEYS)}")
        if raw.get("order", ORDER) != ORDER:
            raise ValueError(f"layout order {raw['order']!r} is not supported; expected {ORDER!r}")
        return cls(
            n_examples,
            seq_len,
            d_vocab,
            bos=raw.get("bos"),
            sep=raw.get("sep"),
            token_offset=raw.get("token_offset", 0),
        )

    def to_dict(self) -> dict:
        return asdict(self)
