"""Tiny Hugging Face models built from configs in code, and tokenizer-style dict data.

No download anywhere: the models are ``transformers`` classes built from small
configs, and the text is Python's own standard-library source (``dione.zoo.text``),
one byte per token. Items are dicts, as a tokenizer and a collator produce them:
``input_ids``, ``attention_mask`` and ``labels``. ``transformers`` is imported inside
the factories, so a workload module that names them imports quickly.
"""

from __future__ import annotations

import functools
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from dione.zoo.text import VOCAB_SIZE, stdlib_text

__all__ = [
    "CLASSIFIED_MODULES",
    "DictDataset",
    "RaggedWindows",
    "bert_tiny",
    "classification_accuracy",
    "gpt2_tiny",
    "llama_tiny",
    "lm_data",
    "lm_validation_loss",
    "logits_cross_entropy",
    "module_data",
    "pad_to_longest",
    "padded_lm_data",
]

# The standard-library modules whose windows the classifier tells apart.
CLASSIFIED_MODULES = ("argparse.py", "difflib.py", "calendar.py", "fractions.py")
_VALIDATION_FRACTION = 0.1


class DictDataset(Dataset[dict[str, torch.Tensor]]):
    """Items ``{field: tensor[i]}`` of equal-length tensors (a tokenized data set)."""

    def __init__(self, fields: Mapping[str, torch.Tensor]) -> None:
        sizes = {len(t) for t in fields.values()}
        if len(sizes) != 1:
            raise ValueError(f"fields of different lengths: {sorted(sizes)}")
        self.fields = dict(fields)

    def __len__(self) -> int:
        return len(next(iter(self.fields.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: tensor[index] for name, tensor in self.fields.items()}


def _tokens(text: bytes) -> torch.Tensor:
    ids = torch.tensor(list(text), dtype=torch.long)
    ids[ids >= VOCAB_SIZE] = 0
    return ids


def _windows(ids: torch.Tensor, context: int) -> torch.Tensor:
    starts = torch.arange(0, len(ids) - context, max(1, context // 2))
    return ids[starts[:, None] + torch.arange(context)]


@functools.cache
def lm_data(context: int = 32, validation: bool = False) -> DictDataset:
    """Language-model windows: ``labels`` are the inputs (the model shifts them)."""
    ids = _tokens(stdlib_text())
    cut = int(len(ids) * (1 - _VALIDATION_FRACTION))
    windows = _windows(ids[cut:] if validation else ids[:cut], context)
    return DictDataset({"input_ids": windows, "attention_mask": torch.ones_like(windows),
                        "labels": windows.clone()})


def _random_windows(count: int, context: int, shortest: int, seed: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` windows of the text, and a random length for each in [shortest, context]."""
    ids = _tokens(stdlib_text())
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - context, (count,), generator=generator)
    lengths = torch.randint(shortest, context + 1, (count,), generator=generator)
    return ids[starts[:, None] + torch.arange(context)], lengths


@functools.cache
def padded_lm_data(context: int = 32, count: int = 512, shortest: int = 8) -> DictDataset:
    """Language-model windows cut to random lengths, right-padded to ``context`` as a
    tokenizer with ``padding="max_length"`` pads them: pad id 0, ``attention_mask`` 0 and
    ``labels`` -100 on the padding, so a token-averaged loss counts different numbers of
    tokens in different samples."""
    windows, lengths = _random_windows(count, context, shortest, seed=11)
    mask = (torch.arange(context)[None] < lengths[:, None]).long()
    ids = windows * mask
    return DictDataset({"input_ids": ids, "attention_mask": mask,
                        "labels": ids.masked_fill(mask == 0, -100)})


class RaggedWindows(Dataset[dict[str, torch.Tensor]]):
    """Language-model windows of random lengths, unpadded (a tokenizer's output before
    its collator): batch them with a collator such as ``pad_to_longest``."""

    def __init__(self, context: int = 32, count: int = 512, shortest: int = 8) -> None:
        self.windows, self.lengths = _random_windows(count, context, shortest, seed=13)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.windows[index, : int(self.lengths[index])]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def pad_to_longest(items: list[dict[str, torch.Tensor]], length: int | None = None
                   ) -> dict[str, torch.Tensor]:
    """Dynamic padding, as ``DataCollatorWithPadding`` does it: each batch right-padded to
    its longest item (pad id 0, ``attention_mask`` 0, ``labels`` -100); with ``length``,
    every batch to that length (``padding="max_length"``)."""
    longest = length or max(len(item["input_ids"]) for item in items)
    fill = {"input_ids": 0, "attention_mask": 0, "labels": -100}
    return {name: torch.stack([nn.functional.pad(item[name], (0, longest - len(item[name])),
                                                 value=value) for item in items])
            for name, value in fill.items()}


@functools.cache
def module_data(context: int = 32, validation: bool = False) -> DictDataset:
    """Which standard-library module a window comes from (``labels``: its index in
    ``CLASSIFIED_MODULES``); the last tenth of each module is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    inputs, labels = [], []
    for label, name in enumerate(CLASSIFIED_MODULES):
        ids = _tokens((root / name).read_bytes()[:60_000])
        cut = int(len(ids) * (1 - _VALIDATION_FRACTION))
        windows = _windows(ids[cut:] if validation else ids[:cut], context)
        inputs.append(windows)
        labels.append(torch.full((len(windows),), label, dtype=torch.long))
    windows = torch.cat(inputs)
    return DictDataset({"input_ids": windows, "attention_mask": torch.ones_like(windows),
                        "labels": torch.cat(labels)})


def gpt2_tiny(context: int = 32, layers: int = 2, width: int = 64, tied: bool = True,
              dropout: float = 0.0) -> nn.Module:
    """A GPT-2 language model over bytes (input and output embeddings tied by default)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=context, n_embd=width,
                        n_layer=layers, n_head=2, resid_pdrop=dropout, embd_pdrop=dropout,
                        attn_pdrop=dropout, bos_token_id=0, eos_token_id=0,
                        tie_word_embeddings=tied)
    return GPT2LMHeadModel(config)


def llama_tiny(context: int = 32, layers: int = 2, width: int = 32) -> nn.Module:
    """A Llama-style causal language model over bytes (RMSNorm, rotary positions, SwiGLU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=layers, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=context)
    return LlamaForCausalLM(config)


def bert_tiny(classes: int = len(CLASSIFIED_MODULES), context: int = 32, layers: int = 2,
              width: int = 64, dropout: float = 0.0) -> nn.Module:
    """A BERT sequence classifier over bytes."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=width, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * width,
                        max_position_embeddings=context, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout, pad_token_id=0)
    config.num_labels = classes  # a PretrainedConfig property, not a BertConfig argument
    return BertForSequenceClassification(config)


def logits_cross_entropy(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """A classifier's mean cross-entropy from its output's ``logits`` (a ModelOutput)."""
    return nn.functional.cross_entropy(output.logits, labels)


def _batches(data: DictDataset, limit: int, size: int = 64) -> list[dict[str, torch.Tensor]]:
    count = min(limit, len(data))
    return [{k: t[i : min(count, i + size)] for k, t in data.fields.items()}
            for i in range(0, count, size)]


@torch.no_grad()  # called by hand on a loaded model too: no graph, no warning
def lm_validation_loss(model: Any, context: int = 32, limit: int = 256) -> dict[str, float]:
    """Mean next-byte cross-entropy (nats) on up to ``limit`` held-out windows."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for batch in _batches(lm_data(context, validation=True), limit):
        rows = len(batch["input_ids"])
        total += float(model(**{k: v.to(device) for k, v in batch.items()}).loss) * rows
        count += rows
    return {"val_loss": total / count}


@torch.no_grad()  # called by hand on a loaded model too: no graph, no warning
def classification_accuracy(model: Any, context: int = 32,
                            limit: int = 512) -> dict[str, float]:
    """Accuracy on up to ``limit`` held-out windows (every module's last tenth)."""
    device = next(model.parameters()).device
    data = module_data(context, validation=True)
    # Every module's windows, not the first module's only: a stride through them all.
    picked = torch.arange(0, len(data), max(1, len(data) // limit))[:limit]
    fields = {k: t[picked] for k, t in data.fields.items()}
    right = 0
    for batch in _batches(DictDataset(fields), limit):
        logits = model(input_ids=batch["input_ids"].to(device),
                       attention_mask=batch["attention_mask"].to(device)).logits
        right += int((logits.argmax(-1).cpu() == batch["labels"]).sum())
    return {"accuracy": right / len(picked)}
