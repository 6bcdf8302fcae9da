"""A small GPT-style character model, written as a sequence of blocks for pipelining."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

__all__ = ["Block", "CharGPT", "Embedding", "Head", "sequence_cross_entropy"]


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, context: int, width: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        embedded: torch.Tensor = self.tokens(ids) + self.positions(positions)
        return embedded


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        # No bias: a key bias shifts every logit of a query alike, so softmax ignores it; its
        # gradient is rounding noise, which Adam would turn into lr-sized random steps.
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.proj(attended.transpose(1, 2).reshape(batch, length, width)))
        out: torch.Tensor = x + self.dropout(self.mlp(self.norm2(x)))
        return out


class Head(nn.Module):
    """Final norm and projection to next-character logits."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(self.norm(x))
        return logits


class CharGPT(nn.Sequential):
    """Embedding, ``layers`` blocks, head: ``CharGPT()(ids)`` gives (batch, length, vocab)."""

    def __init__(self, vocab: int = 128, context: int = 64, width: int = 64, layers: int = 2,
                 heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__(
            Embedding(vocab, context, width),
            *(Block(width, heads, dropout) for _ in range(layers)),
            Head(width, vocab),
        )


def sequence_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of every sequence in the batch."""
    return functional.cross_entropy(logits.flatten(0, 1), target.flatten())
