"""Hugging Face models as dione tasks: tiny GPT-2 and BERT built from configs, dict batches.

The data are tokenizer-style dicts (``input_ids``, ``attention_mask``, ``labels``) over
Python's own standard-library source, one byte per token; nothing is downloaded. The
GPT-2 tasks leave ``loss`` out: the model computes its own from ``labels``. The BERT
tasks give a loss on the logits instead, clip gradients and train in bf16 autocast.

    dione run examples/hf.py --out runs/hf
    dione export runs/hf gpt2-lr0.003 -o exported/gpt2     # then GPT2LMHeadModel.from_pretrained
"""

import functools

import torch

from dione import Task, Workload, grid
from dione.zoo.hf import (
    bert_tiny,
    classification_accuracy,
    gpt2_tiny,
    lm_data,
    lm_validation_loss,
    logits_cross_entropy,
    module_data,
)


def gpt2_task(lr: float) -> Task:
    return Task(
        name="gpt2",
        model=gpt2_tiny,
        data=lm_data,
        optimizer=functools.partial(torch.optim.AdamW, lr=lr, weight_decay=0.01),
        batch_size=16,
        steps=60,
        evaluate=lm_validation_loss,
    )


def bert_task(lr: float) -> Task:
    return Task(
        name="bert",
        model=bert_tiny,
        data=module_data,
        loss=logits_cross_entropy,
        optimizer=functools.partial(torch.optim.AdamW, lr=lr),
        batch_size=16,
        steps=60,
        precision="bf16",
        clip_grad_norm=1.0,
        evaluate=classification_accuracy,
    )


workload = Workload(grid("gpt2", gpt2_task, lr=[1e-3, 3e-3])
                    + grid("bert", bert_task, lr=[1e-3, 3e-3]))
