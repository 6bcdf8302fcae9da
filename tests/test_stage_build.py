"""Pipeline stages built from the model's structure on meta: each rank materialises only
its stage's tensors, a fresh start takes single's initial weights, a resume builds nothing
outside meta, and a model meta cannot build falls back, saying why."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from dione.spec.task import Task
from dione.techniques.pipeline.partition import partition_model, stage_plan
from dione.techniques.pipeline.stage_build import (
    build_structure,
    device_bytes,
    host_model,
    materialise,
    on_device_for_forward,
)
from dione.techniques.pipeline.stages import cut_stage, stage_modules
from dione.zoo import digits_mlp
from dione.zoo.hf import bert_tiny, gpt2_tiny, lm_data, logits_cross_entropy, module_data
from helpers import (
    LOSS_TOLERANCE,
    PARAMETER_TOLERANCE,
    assert_same_training,
    digits_task,
    final_parameters,
    train,
)

transformers = pytest.importorskip("transformers")
cloudpickle.register_pickle_by_value(sys.modules[__name__])



def llama_tiny() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from dione.zoo.text import VOCAB_SIZE

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=0, pad_token_id=0))


class Masked(nn.Linear):
    """A linear layer with some weights masked off by a bool buffer (carried as bytes)."""

    def __init__(self, width: int) -> None:
        super().__init__(width, width)
        self.register_buffer("keep", torch.arange(width * width).reshape(width, width) % 3 > 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight * self.keep, self.bias)


def tied_sequential() -> nn.Module:
    """A hand-written Sequential whose first and last layers share the embedding."""
    embed, head = nn.Embedding(128, 16), nn.Linear(16, 128, bias=False)
    head.weight = embed.weight
    return nn.Sequential(embed, nn.Linear(16, 16), nn.Tanh(), Masked(16), head)


MODELS = {
    "gpt2": functools.partial(gpt2_tiny, context=32, width=32, layers=3),
    "llama": llama_tiny,
    "bert": functools.partial(bert_tiny, width=32, layers=3),
    "sequential": tied_sequential,
}


def structure_task(name: str) -> Task:
    return Task(name=name, model=MODELS[name], data=lm_data, optimizer=torch.optim.Adam,
                batch_size=8, steps=1, seed=11)


def _tensors(tensors: list[torch.Tensor]) -> int:
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def stage_share(model: nn.Module, stages: int, stage: int) -> int:
    """Bytes of what ``stage`` runs, counted on the whole model: the parameters and
    buffers of its modules (a tied weight once), and the tensors of modules no stage
    owns, which run everywhere (a rotary table)."""
    plan, partition = stage_plan(model, "m"), partition_model(model, stages, "m")
    owned = [m for k in range(stages) for m in stage_modules(model, plan, partition, k)]
    owned_ids = {id(t) for m in owned for t in [*m.parameters(), *m.buffers()]}
    mine = [t for m in stage_modules(model, plan, partition, stage)
            for t in [*m.parameters(), *m.buffers()]]
    everywhere = [t for t in [*model.parameters(), *model.buffers()] if id(t) not in owned_ids]
    return _tensors(mine + everywhere)


def whole_bytes(model: nn.Module) -> int:
    return _tensors([*model.parameters(), *model.buffers()])


# --- one rank's build, in this process ----------------------------------------------------


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_stage_materialises_its_share_only(name: str, stages: int) -> None:
    task = structure_task(name)
    whole = host_model(task)
    for stage in range(stages):
        built = build_structure(task)
        assert built.on_meta and built.reason is None
        assert all(p.is_meta for p in built.model.parameters())
        plan, partition = stage_plan(built.model, name), partition_model(built.model, stages,
                                                                         name)
        model = cut_stage(built.model, plan, partition, stage)
        materialise(model, torch.device("cpu"))
        assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
        share = stage_share(whole, stages, stage)
        assert device_bytes(model) == share
        assert share < whole_bytes(whole)
        # Buffers, non-persistent ones too (rotary tables, position ids), are the model's
        # own values, not uninitialised storage.
        reference = dict(whole.named_buffers())
        for buffer_name, buffer in model.named_buffers():
            assert torch.equal(buffer, reference[buffer_name]), buffer_name


def test_a_tied_weight_stays_one_tensor_once_materialised() -> None:
    for name, first, last in (("sequential", "0.weight", "4.weight"),
                              ("gpt2", "transformer.wte.weight", "lm_head.weight")):
        built = build_structure(structure_task(name))
        plan, partition = stage_plan(built.model, name), partition_model(built.model, 2, name)
        model = cut_stage(built.model, plan, partition, 1)
        materialise(model, torch.device("cpu"))
        assert model.get_parameter(first) is model.get_parameter(last)


class ReadsItsWeights(nn.Sequential):
    """A factory meta cannot run: it scales its head by a value read from a weight."""

    def __init__(self) -> None:
        super().__init__(*digits_mlp(hidden=32, depth=2))
        scale = float(self[0][0].weight.detach().abs().max())
        with torch.no_grad():
            self[-1].weight.mul_(1 / scale)


class BufferFromWeights(nn.Sequential):
    """A non-persistent buffer computed from a parameter: no checkpoint holds it, and meta
    gives it no value."""

    def __init__(self) -> None:
        super().__init__(*digits_mlp(hidden=32, depth=2))
        self[-1].register_buffer("norm", self[-1].weight.detach().norm(dim=1),
                                 persistent=False)


def test_a_model_meta_cannot_build_is_built_on_the_host_saying_why() -> None:
    reads = build_structure(replace(digits_task(), model=ReadsItsWeights))
    assert not reads.on_meta
    assert reads.reason is not None and reads.reason.startswith(
        "its model factory cannot run with parameters on the meta device (")
    assert not any(p.is_meta for p in reads.model.parameters())
    buffer = build_structure(replace(digits_task(), model=BufferFromWeights))
    assert not buffer.on_meta
    assert buffer.reason == ("its non-persistent buffer 2.norm is computed from a parameter, "
                             "so it has no value without the parameters' values")


# --- real gangs -----------------------------------------------------------------------------


@pytest.mark.parametrize("technique", ["gpipe", "1f1b"])
def test_each_stage_holds_its_share_and_trains_as_single(technique: str,
                                                         tmp_path: Path) -> None:
    """Three stages of an MLP: each rank's device holds its stage's bytes, and the fresh
    start's weights are single's (rank 0 built them and sent each stage its part)."""
    task = digits_task(name="mlp3", steps=4, batch_size=12,
                       model=functools.partial(digits_mlp, hidden=32, depth=3))
    reference = train(task, "single", tmp_path / "single", 1)
    result = train(task, technique, tmp_path / "pipe", 3, micro_batches=3)
    assert result.extra["stage_build"] == "meta"
    whole = host_model(task)
    assert result.extra["stage_bytes"] == [stage_share(whole, 3, k) for k in range(3)]
    assert_same_training(result, final_parameters(task, result.checkpoint), reference,
                         final_parameters(task, reference.checkpoint))


@pytest.mark.parametrize("name", ["gpt2", "sequential"])
def test_a_fresh_start_is_singles_initial_weights_bit_for_bit(name: str,
                                                              tmp_path: Path) -> None:
    """With a learning rate of 0 the checkpoint after one step holds the weights the stages
    started from: exactly the host build's (single's), the tied one on both its stages."""
    task = Task(name=f"{name}-lr0", model=MODELS[name],
                data=lm_data if name == "gpt2" else token_pairs,
                loss=None if name == "gpt2" else token_loss,
                optimizer=functools.partial(torch.optim.SGD, lr=0.0), batch_size=6, steps=1,
                seed=13)
    result = train(task, "gpipe", tmp_path, 3, micro_batches=3)
    assert result.extra["stage_build"] == "meta"
    initial = host_model(task).state_dict()
    saved = final_parameters(task, result.checkpoint)
    assert saved.keys() == initial.keys()
    for key, value in initial.items():
        assert torch.equal(saved[key], value), key


def token_pairs() -> torch.utils.data.TensorDataset:
    """(bytes, the bytes after them) pairs, for the hand-written Sequential."""
    ids = lm_data().fields["input_ids"][:64]
    return torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:])


def token_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())


def recording_model(log: str) -> nn.Module:
    """GPT-2 whose factory, inside a gang, records whether its parameters have storage."""
    model = gpt2_tiny(context=32, width=32, layers=3)
    if dist.is_initialized():
        with open(log, "a") as file:
            file.write(json.dumps({"rank": dist.get_rank(),
                                   "meta": all(p.is_meta for p in model.parameters())}) + "\n")
    return model


def test_a_resume_builds_nothing_outside_meta(tmp_path: Path) -> None:
    """A fresh slice builds the whole model with storage once, on rank 0 (single's initial
    weights); the resumed slice only on meta, its values from the checkpoint. Both
    together train as single does."""
    log = tmp_path / "builds.jsonl"
    task = Task(name="gpt2-resume", model=functools.partial(recording_model, str(log)),
                data=lm_data, optimizer=functools.partial(torch.optim.AdamW, lr=3e-3),
                batch_size=8, steps=4, seed=5)
    reference = train(task, "single", tmp_path / "single", 1)
    log.unlink(missing_ok=True)
    first = train(task, "gpipe", tmp_path / "pipe", 2, steps=2, micro_batches=2)
    fresh = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((b["rank"], b["meta"]) for b in fresh) == [(0, False), (0, True), (1, True)]
    log.unlink()
    second = train(task, "1f1b", tmp_path / "pipe", 2, micro_batches=2)
    resumed = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((b["rank"], b["meta"]) for b in resumed) == [(0, True), (1, True)]
    assert second.extra["stage_build"] == "meta"
    torch.testing.assert_close(torch.tensor(first.losses + second.losses),
                               torch.tensor(reference.losses), **LOSS_TOLERANCE)
    params = final_parameters(task, second.checkpoint)
    for name, value in final_parameters(task, reference.checkpoint).items():
        torch.testing.assert_close(params[name], value, **PARAMETER_TOLERANCE)


def test_a_model_meta_cannot_build_falls_back_and_says_why(tmp_path: Path) -> None:
    task = digits_task(name="reads", steps=3, model=ReadsItsWeights)
    reference = train(task, "single", tmp_path / "single", 1)
    result = train(task, "gpipe", tmp_path / "pipe", 2, micro_batches=2, balance="time")
    assert result.extra["stage_build"].startswith(
        "whole model on the host: its model factory cannot run with parameters on the meta "
        "device (RuntimeError: ")
    assert "balance_note" not in result.extra
    assert_same_training(result, final_parameters(task, result.checkpoint), reference,
                         final_parameters(task, reference.checkpoint))


def test_xpipe_builds_on_meta_and_trains(tmp_path: Path) -> None:
    task = Task(name="bert-x", model=MODELS["bert"], data=module_data,
                loss=logits_cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=3e-3), batch_size=8, steps=6,
                seed=7)
    result = train(task, "xpipe", tmp_path, 2, micro_batches=2)
    assert result.extra["stage_build"] == "meta"
    whole = host_model(task)
    assert result.extra["stage_bytes"] == [stage_share(whole, 2, k) for k in range(2)]
    assert result.losses[-1] < result.losses[0]



def test_timing_holds_one_block_on_the_device_at_a_time() -> None:
    """balance=time runs the model's own forward with each module on the device during
    its own forward only: while a block runs, the model holds that block's tensors and the
    tensors outside every block (the rotary table), nothing more."""
    from dione.techniques.pipeline.balance import block_times

    task = structure_task("llama")
    model = build_structure(task).model
    plan = stage_plan(model, "llama")
    streamed = [*plan.first, *plan.blocks, *plan.last]
    owned = {id(t) for p in streamed
             for t in [*model.get_submodule(p).parameters(), *model.get_submodule(p).buffers()]}
    rest = _tensors([t for t in [*model.parameters(), *model.buffers()] if id(t) not in owned])
    held: dict[str, int] = {}

    def count(path: str):
        def hook(*_: object) -> None:
            held[path] = device_bytes(model)
        return hook

    with on_device_for_forward(model, streamed, torch.device("cpu")):
        for path in plan.blocks:  # after the streaming hooks: sees the block in place
            model.get_submodule(path).register_forward_pre_hook(count(path))
        batch = {k: v[:2] for k, v in lm_data().fields.items()}
        times = block_times(model, plan, task, batch, torch.device("cpu"), repeats=1)
    assert len(times) == len(plan.blocks)
    block = device_bytes(materialised(model.get_submodule(plan.blocks[0])))
    assert held == {path: block + rest for path in plan.blocks}
    assert all(p.is_meta for p in model.parameters())  # the originals are back


def materialised(module: nn.Module) -> nn.Module:
    import copy

    twin = copy.deepcopy(module)
    materialise(twin, torch.device("cpu"))
    return twin
