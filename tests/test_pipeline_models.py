"""Pipelines of models that are not an nn.Sequential: Hugging Face GPT-2 (tied embeddings),
a Llama-style decoder and BERT, cut between their blocks, names kept; shared weights;
bf16 and clipping; tuple-output layers; and what pipelines refuse, with the reason.

Tolerances are ``test_equivalence``'s (reduction order only); bf16 is ``test_hf``'s.
"""

from __future__ import annotations

import functools
import itertools
import sys
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import cloudpickle
import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from dione.launch import local_placement, run_slice
from dione.profile import Catalog, TrialOptions
from dione.profile.simulated import cross_check, simulated_step_seconds
from dione.profile.trial import TrialSpec, run_trial
from dione.schedules import xpipe
from dione.spec.task import Task
from dione.techniques import get_technique
from dione.techniques.pipeline.balance import layer_times
from dione.techniques.pipeline.partition import partition_model, stage_plan
from dione.techniques.pipeline.stages import shared_weights
from dione.zoo.hf import bert_tiny, gpt2_tiny, lm_data, logits_cross_entropy, module_data
from helpers import (
    LOSS_TOLERANCE,
    TEST_NODE,
    assert_same_training,
    check_real_timeline,
    final_parameters,
    train,
)

transformers = pytest.importorskip("transformers")
# The workers cannot import this test module: its model and data factories travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 4


def gpt2_task(**extra: object) -> Task:
    """Tied input and output embeddings (GPT-2's default), the model's own loss, AdamW."""
    task = Task(name="gpt2", model=functools.partial(gpt2_tiny, context=32, width=32,
                                                     layers=3),
                data=lm_data, optimizer=functools.partial(torch.optim.AdamW, lr=3e-3),
                batch_size=8, steps=STEPS, seed=5)
    return replace(task, **extra)


def llama_tiny() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from dione.zoo.text import VOCAB_SIZE

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def llama_task(**extra: object) -> Task:
    task = Task(name="llama", model=llama_tiny, data=lm_data,
                optimizer=functools.partial(torch.optim.AdamW, lr=3e-3),
                batch_size=8, steps=STEPS, seed=6)
    return replace(task, **extra)


def bert_task(**extra: object) -> Task:
    """The task's loss on the output's logits: the model never sees ``labels``."""
    task = Task(name="bert", model=functools.partial(bert_tiny, width=32), data=module_data,
                loss=logits_cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=3e-3),
                batch_size=8, steps=STEPS, seed=7)
    return replace(task, **extra)


def single(task: Task, run_dir: Path):
    result = train(task, "single", run_dir)
    return result, final_parameters(task, result.checkpoint)


# --- the plan: where each model is cut, and what its stages share -------------------------


def test_plans_cut_between_blocks_with_the_models_own_names() -> None:
    gpt2 = gpt2_tiny(layers=3)
    plan = stage_plan(gpt2, "gpt2")
    assert plan.blocks == ("transformer.h.0", "transformer.h.1", "transformer.h.2")
    assert plan.first == ("transformer.wte", "transformer.wpe")
    assert set(plan.last) == {"transformer.ln_f", "lm_head"}
    partition = partition_model(gpt2, 3, "gpt2")
    assert partition.describe(0) == "layers transformer.h.0"
    # The tied embedding: used by the first stage (input) and the last (output head).
    assert shared_weights(gpt2, plan, partition, "gpt2")[0].name == "transformer.wte.weight"
    assert [w.stages for w in shared_weights(gpt2, plan, partition, "gpt2")] == [(0, 2)]
    untied = gpt2_tiny(layers=3, tied=False)
    assert shared_weights(untied, stage_plan(untied, "g"), partition, "g") == []
    assert set(stage_plan(llama_tiny(), "l").last) == {"model.norm", "lm_head"}
    bert = stage_plan(bert_tiny(width=32), "b")
    assert (bert.container, bert.first, bert.last) == (
        "bert.encoder.layer", ("bert.embeddings",), ("classifier", "bert.pooler"))

    class SequentialBlocks(nn.Module):  # a timm ViT's shape: the blocks in a Sequential
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Linear(8, 16)
            self.blocks = nn.Sequential(*(nn.Linear(16, 16) for _ in range(3)))
            self.head = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4))  # no rival

    plan = stage_plan(SequentialBlocks(), "s")
    assert (plan.blocks, plan.first, plan.last) == (
        ("blocks.0", "blocks.1", "blocks.2"), ("stem",), ("head",))


def test_a_tied_sequential_keeps_the_weight_on_both_stages_under_its_first_name() -> None:
    """The adapter a user would write around GPT-2: an nn.Sequential whose first and last
    layers share the embedding. The last stage keeps it as "0.weight", not "2.weight"."""
    from dione.techniques.pipeline.stages import cut_stage

    embed, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.Sequential(embed, nn.Linear(4, 4), head)
    plan, partition = stage_plan(model, "s"), partition_model(model, 2, "s")
    assert [(w.name, w.stages) for w in shared_weights(model, plan, partition, "s")] == [
        ("0.weight", (0, 1))]
    last = cut_stage(model, plan, partition, 1)
    names = [n for n, _ in last.named_parameters()]
    assert names[0] == "0.weight" and "2.weight" not in names
    assert last[2].weight is last[0].weight


class Declared(nn.Module):
    """A hand-written model whose blocks sit in an nn.Sequential: it declares its stages."""

    dione_stages: ClassVar = {"blocks": "body", "first": ["embed"], "last": ["head"]}

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(x)))


def test_a_model_can_declare_its_stages() -> None:
    plan = stage_plan(Declared(), "d")
    assert plan.blocks == ("body.0", "body.1", "body.2")
    assert (plan.first, plan.last) == (("embed",), ("head",))


# --- tied weights: GPT-2 under gpipe and 1f1b equals single --------------------------------


@pytest.fixture(scope="module")
def gpt2_single(tmp_path_factory: pytest.TempPathFactory):
    task = gpt2_task()
    return task, *single(task, tmp_path_factory.mktemp("gpt2-single"))


def checkpoint_tensors(checkpoint: str, names: list[str],
                       like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint read one by one (not into a model that would tie them)."""
    state = {"model": {n: torch.empty_like(like[n]) for n in names}}
    dcp_load(state, checkpoint_id=checkpoint, no_dist=True)
    return state["model"]


def as_batch_encoding(items: list[dict[str, torch.Tensor]]):
    """Items collated into a tokenizer's ``BatchEncoding`` (what Hugging Face's collators
    return), not a dict."""
    from torch.utils.data._utils.collate import default_collate
    from transformers import BatchEncoding

    return BatchEncoding(default_collate(items))


def test_a_batch_encoding_is_split_into_micro_batches_not_handed_whole_to_each(
        gpt2_single, tmp_path: Path) -> None:
    """torch's pytree takes a BatchEncoding for one leaf: the schedule gave every
    micro-batch the whole batch, each stage ran it micro_batches times and the recorded
    loss was micro_batches times single's (review: 4x for a BERT with
    DataCollatorWithPadding)."""
    task, reference, reference_params = gpt2_single
    encoded = replace(task, collate_fn=as_batch_encoding)
    result = train(encoded, "gpipe", tmp_path, 2, micro_batches=4)
    assert_same_training(result, final_parameters(encoded, result.checkpoint), reference,
                         reference_params)


@pytest.mark.parametrize("stages", [2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("technique", ["gpipe", "1f1b"])
def test_tied_gpt2_matches_single(gpt2_single, technique: str, stages: int,
                                  tmp_path: Path) -> None:
    from transformers import GPT2LMHeadModel

    task, reference, reference_params = gpt2_single
    # 1f1b needs at least one micro-batch per stage.
    result = train(task, technique, tmp_path, stages, micro_batches=2 if stages == 2 else 4)
    assert result.extra["shared_weights"] == [f"transformer.wte.weight: stages [0, {stages - 1}]"]
    assert result.extra["shared_stages"] == [[0, stages - 1]]
    assert "exactness" not in result.extra  # dropout 0
    assert result.extra["stage_build"] == "meta"  # each rank materialised its stage only
    params = final_parameters(task, result.checkpoint)
    assert_same_training(result, params, reference, reference_params)
    # The checkpoint's two names for the tied weight hold one value, and a plain
    # GPT2LMHeadModel loads it with the weights tied and identical.
    saved = checkpoint_tensors(result.checkpoint, ["transformer.wte.weight", "lm_head.weight"],
                               params)
    assert torch.equal(saved["transformer.wte.weight"], saved["lm_head.weight"])
    plain = gpt2_tiny(context=32, width=32, layers=3)
    assert isinstance(plain, GPT2LMHeadModel)
    from dione.state import load_model_weights

    load_model_weights(result.checkpoint, plain)
    assert plain.lm_head.weight is plain.transformer.wte.weight
    for name, value in plain.state_dict().items():
        assert torch.equal(value, params[name]), name


def test_tied_gpt2_cut_by_time_and_recomputed_matches_single(gpt2_single,
                                                             tmp_path: Path) -> None:
    """balance=time times each block inside the model's own forward; activation
    checkpointing recomputes each block of the stage in backward."""
    task, reference, reference_params = gpt2_single
    result = train(task, "gpipe", tmp_path, 2, micro_batches=4, balance="time",
                   activation_checkpointing=True)
    assert "balance_note" not in result.extra
    assert all(s.startswith("layers transformer.h.") for s in result.extra["stages"])
    assert_same_training(result, final_parameters(task, result.checkpoint), reference,
                         reference_params)


def test_tied_gpt2_with_clipping_matches_single(tmp_path: Path) -> None:
    """The shared weight counts once in the global norm over both stages."""
    task = gpt2_task(name="gpt2-clip", clip_grad_norm=0.5)
    reference, reference_params = single(task, tmp_path / "single")
    result = train(task, "1f1b", tmp_path / "pipe", 2, micro_batches=2)
    assert_same_training(result, final_parameters(task, result.checkpoint), reference,
                         reference_params)


def frozen_embedding_gpt2() -> nn.Module:
    """GPT-2 fine-tuned with its tied input and output embedding frozen."""
    model = gpt2_tiny(context=32, width=32, layers=3)
    model.transformer.wte.weight.requires_grad_(False)
    return model


@pytest.mark.parametrize("technique", ["gpipe", "xpipe"])
def test_a_frozen_tied_weight_stays_frozen_in_pipelines(technique: str,
                                                        tmp_path: Path) -> None:
    """Weight decay must not move it: single leaves a parameter without a gradient
    alone, and so must the stages that share it."""
    task = gpt2_task(name="gpt2-frozen", model=frozen_embedding_gpt2, steps=2,
                     optimizer=functools.partial(torch.optim.AdamW, lr=1e-2,
                                                 weight_decay=0.5))
    torch.manual_seed(task.seed)  # as the slice builds it
    initial = {n: p.detach().clone() for n, p in frozen_embedding_gpt2().named_parameters()}
    result = train(task, technique, tmp_path, 2, micro_batches=2)
    assert "shared_weights" not in result.extra
    params = final_parameters(task, result.checkpoint)
    assert torch.equal(params["transformer.wte.weight"], initial["transformer.wte.weight"])
    name = "transformer.h.0.attn.c_attn.weight"  # a trainable one did train
    assert not torch.equal(params[name], initial[name])


@pytest.mark.parametrize("stages", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_tied_gpt2_under_xpipe_keeps_one_value_and_its_accounting(stages: int,
                                                                  tmp_path: Path) -> None:
    """The tied weight's gradients are summed at each update on both stages, which step it
    alike: the two stages' copies (saved under its two names) stay identical."""
    task = gpt2_task(name="gpt2-xpipe", steps=5)
    result = train(task, "xpipe", tmp_path, stages, micro_batches=2)
    assert result.extra["shared_weights"] == [
        f"transformer.wte.weight: stages [0, {stages - 1}]"]
    assert result.extra["shared_stages"] == [[0, stages - 1]]
    # Each holder's logged update starts once both holders reached it (the all_reduce
    # that sums the tied gradient): the wait is idle, which the simulator adds itself.
    timeline = get_technique("xpipe").real_timeline(result.extra, 5)
    check_real_timeline(timeline)
    reached: dict[tuple[int, int], float] = {}
    for k in (0, stages - 1):
        for before, span in itertools.pairwise(timeline.spans[k]):
            if span.action.kind == "U":
                reached[(k, span.action.minibatch)] = before.end
    for k in (0, stages - 1):
        for span in timeline.spans[k]:
            if span.action.kind == "U":
                i = span.action.minibatch
                assert span.start >= max(reached[(0, i)], reached[(stages - 1, i)]) - 1e-9
    params = final_parameters(task, result.checkpoint)
    saved = checkpoint_tensors(result.checkpoint, ["transformer.wte.weight", "lm_head.weight"],
                               params)
    assert torch.equal(saved["transformer.wte.weight"], saved["lm_head.weight"])
    staleness = xpipe(stages, 2, 5).staleness()
    for stage, logged in enumerate(result.extra["versions"]):
        assert [i for i, _, _ in logged] == list(range(5))
        assert all(i - version == s == staleness[(i, stage)] for i, version, s in logged)
    assert result.losses[-1] < result.losses[0]


def test_a_tied_xpipe_trial_is_simulated_with_its_stages_waiting(tmp_path: Path) -> None:
    """A profiling trial keeps which stages hold the tied weight, and the cross-check
    simulates its steps with their updates waiting for each other."""
    task = gpt2_task(name="gpt2-trial", steps=5, allow_inexact=True)
    spec = TrialSpec(task, "xpipe", {"micro_batches": 2}, 2, "gpt2-xpipe-trial", "cpu")
    record, _ = run_trial(spec, TEST_NODE, [0, 1], tmp_path,
                          TrialOptions(warmup_steps=1, measure_steps=4, timeout=300))
    assert record.status == "ok", record.reason
    assert record.extra["shared_stages"] == [[0, 1]]
    times = record.extra["stage_times"]
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        cross_check({"x": record}, {"x": "gpt2"}, catalog)
    assert record.simulated_step_seconds == simulated_step_seconds("xpipe", times, 2,
                                                                   shared=[[0, 1]])
    assert record.simulated_step_seconds >= simulated_step_seconds("xpipe", times, 2)


# --- other architectures: Llama-style decoder, BERT with the task's loss --------------------


@pytest.mark.parametrize(
    ("make", "technique"),
    [(llama_task, "gpipe"), pytest.param(llama_task, "1f1b", marks=pytest.mark.slow),
     (bert_task, "gpipe"),
     pytest.param(bert_task, "1f1b", marks=pytest.mark.slow)],
    ids=["llama-gpipe", "llama-1f1b", "bert-gpipe", "bert-1f1b"],
)
def test_hf_models_match_single(make, technique: str, tmp_path: Path) -> None:
    task = make()
    reference, reference_params = single(task, tmp_path / "single")
    result = train(task, technique, tmp_path / "pipe", 2, micro_batches=2)
    assert result.extra["stage_build"] == "meta"
    assert_same_training(result, final_parameters(task, result.checkpoint), reference,
                         reference_params)


@pytest.mark.parametrize("make", [llama_task, pytest.param(bert_task, marks=pytest.mark.slow)],
                         ids=["llama", "bert"])
def test_hf_models_train_under_xpipe(make, tmp_path: Path) -> None:
    task = make(steps=6)
    result = train(task, "xpipe", tmp_path, 2, micro_batches=2)
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0]


def test_a_gpipe_checkpoint_resumes_under_fsdp_and_back(gpt2_single, tmp_path: Path) -> None:
    """gpipe twice (the second slice restores the tied weight's optimizer state on both
    stages and saves it again), fsdp, gpipe: single's losses and parameters."""
    task, reference, reference_params = gpt2_single
    losses = []
    for technique, steps in (("gpipe", 1), ("gpipe", 1), ("fsdp", 1), ("gpipe", None)):
        part = run_slice(task, technique, tmp_path, local_placement(TEST_NODE, [0, 1]),
                         steps=steps, knobs={"micro_batches": 2} if technique == "gpipe" else {})
        losses += part.losses
    assert len(losses) == STEPS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference.losses),
                               **LOSS_TOLERANCE)
    params = final_parameters(task, part.checkpoint)
    for name, value in params.items():
        torch.testing.assert_close(value, reference_params[name], rtol=1e-4, atol=1e-5)


# --- precision and clipping ----------------------------------------------------------------

# Measured over these 4 steps (gpipe, 2 micro-batches): the first step's loss is single
# bf16's to 1e-7 relative (same weights; micro-batches round other partial sums to bf16),
# 1.7e-5 from single fp32's; later steps drift from single bf16's by up to 2.8e-5 (bf16
# rounding of the updates' gradients), about as far as single bf16 is from fp32 (3.5e-5).
# So the first step shows autocast is on, and the trajectory is held to ten times 2.8e-5.
BF16_FIRST_STEP = {"rtol": 1e-6, "atol": 0.0}
BF16_LOSS_TOLERANCE = {"rtol": 3e-4, "atol": 1e-6}


def test_bf16_pipeline_follows_single_bf16(tmp_path: Path) -> None:
    task = gpt2_task(name="gpt2-bf16", precision="bf16")
    reference, _ = single(task, tmp_path / "single")
    fp32, _ = single(gpt2_task(), tmp_path / "fp32")
    result = train(task, "gpipe", tmp_path / "pipe", 2, micro_batches=2)
    first = torch.tensor(result.losses[:1])
    torch.testing.assert_close(first, torch.tensor(reference.losses[:1]), **BF16_FIRST_STEP)
    assert not torch.allclose(first, torch.tensor(fp32.losses[:1]), **BF16_FIRST_STEP)
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(reference.losses),
                               **BF16_LOSS_TOLERANCE)
    # xpipe: the first mini-batch sees the initial weights, as single's does.
    xp = train(replace(task, name="gpt2-bf16-x"), "xpipe", tmp_path / "x", 2, micro_batches=2)
    torch.testing.assert_close(torch.tensor(xp.losses[:1]), torch.tensor(reference.losses[:1]),
                               **BF16_FIRST_STEP)
    assert xp.losses[-1] < xp.losses[0]


def test_what_pipelines_refuse_and_why() -> None:
    gpipe, xp = get_technique("gpipe"), get_technique("xpipe")
    fp16 = gpt2_task(precision="fp16")
    assert any("does not train in fp16" in r for r in gpipe.check(fp16, 2, {}, "cpu"))
    clipped = gpt2_task(clip_grad_norm=1.0)
    assert gpipe.check(clipped, 2, {}, "cpu") == []
    assert any("update at different times" in r for r in xp.check(clipped, 2, {}, "cpu"))
    assert gpipe.check(gpt2_task(), 3, {}, "cpu") == []  # the model's own loss: fine now
    assert any("at least as many micro-batches (2) as stages (3)" in r
               for r in get_technique("1f1b").check(gpt2_task(), 3, {"micro_batches": 2}, "cpu"))

    def batch_norm_net() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, 10))

    norm = Task(name="bn", model=batch_norm_net, data=module_data,
                loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=8, steps=2)
    for technique in (gpipe, xp):
        reasons = technique.check(norm, 2, {}, "cpu")
        assert any("normalises by batch statistics (module '1')" in r for r in reasons), reasons


def test_dropout_is_said_to_be_statistically_equivalent(tmp_path: Path) -> None:
    task = gpt2_task(name="gpt2-dropout", steps=2,
                     model=functools.partial(gpt2_tiny, context=32, width=32, layers=3,
                                             dropout=0.1))
    result = train(task, "1f1b", tmp_path / "1f1b", 2, micro_batches=2)
    assert result.extra["exactness"].startswith("statistical, not bitwise: dropout in ")
    # DDP's shares draw masks from each rank's own stream: said just the same; one
    # device, one part: nothing to say.
    shared = train(task, "ddp", tmp_path / "ddp", 2)
    assert shared.extra["exactness"].startswith("statistical, not bitwise: dropout in ")
    assert "exactness" not in train(task, "ddp", tmp_path / "one", 1).extra
    # Kept with the slice and shown with the task (it was said nowhere: "exact").
    from dione.state.store import RunStore
    from dione.state.summaries import summaries

    said = {}
    for folder in ("ddp", "one"):
        with RunStore(tmp_path / folder) as store:
            [said[folder]] = summaries(store)
    assert [(s.exactness, s.inexact) for s in said.values()] == [("statistical", []),
                                                                  ("exact", [])]
    [note] = said["ddp"].statistical
    assert note.startswith("steps 0-2, statistical, not bitwise: dropout in ")


# --- layers that return tuples -------------------------------------------------------------


class LastStep(nn.Module):
    """An LSTM's output sequence, ``(output, (h, c))``, to its last step's features."""

    def forward(self, x: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        return x[0][:, -1]


def lstm_net() -> nn.Module:
    return nn.Sequential(nn.LSTM(8, 16, batch_first=True), LastStep(), nn.Linear(16, 16),
                         nn.Tanh(), nn.Linear(16, 10))


def digit_rows() -> torch.utils.data.Dataset:
    """The digits as sequences of 8 rows of 8 pixels."""
    from dione.zoo import digits_train

    x, y = digits_train().tensors
    return torch.utils.data.TensorDataset(x.reshape(-1, 8, 8), y)


def lstm_task() -> Task:
    return Task(name="lstm", model=lstm_net, data=digit_rows, loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=STEPS, seed=2)


def test_layer_times_runs_layers_that_return_tuples() -> None:
    layers = list(lstm_net().children())
    times = layer_times(layers, torch.randn(4, 8, 8), torch.device("cpu"), repeats=1)
    assert len(times) == len(layers) and all(t > 0 for t in times)


@pytest.mark.parametrize("technique", ["gpipe", "1f1b"])
def test_an_lstm_pipeline_balanced_by_time_matches_single(technique: str,
                                                          tmp_path: Path) -> None:
    task = lstm_task()
    reference, reference_params = single(task, tmp_path / "single")
    result = train(task, technique, tmp_path / "pipe", 2, micro_batches=2, balance="time")
    assert "balance_note" not in result.extra
    # Never cut after the LSTM: its output is a tuple, and stages send tensors.
    assert result.extra["stages"][1] != "layers 1-4"
    assert_same_training(result, final_parameters(task, result.checkpoint), reference,
                         reference_params)


# --- models whose stages would train wrong: refused, or stopped with the reason -----------


class Leaky(nn.Module):
    """Declares its stages, but feeds the embedding to every block beside the hidden state:
    a later stage has no embedding to give them."""

    dione_stages: ClassVar = {"blocks": "blocks", "first": ["embed"], "last": ["head"]}

    def __init__(self, declare_head: bool = True) -> None:
        super().__init__()
        self.embed = nn.Linear(64, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 10)
        if not declare_head:
            self.dione_stages = {"blocks": "blocks", "first": ["embed"]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x)
        h = e
        for block in self.blocks:
            h = torch.tanh(block(h)) + e
        return self.head(h)


def leaky_task(**extra: object) -> Task:
    from dione.zoo import digits_train

    task = Task(name="leaky", model=Leaky, data=digits_train, loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16, steps=2)
    return replace(task, **extra)


def test_a_parameter_no_stage_runs_is_refused() -> None:
    task = leaky_task(model=functools.partial(Leaky, declare_head=False))
    reasons = get_technique("gpipe").check(task, 2, {}, "cpu")
    assert any("parameter head.weight is in no block and in no module the stage plan places"
               in r for r in reasons), reasons


def test_a_stubbed_module_feeding_the_blocks_stops_the_first_step(tmp_path: Path) -> None:
    """Wrong training without an error is the worst outcome: the later stage's stubbed
    embedding is NaN, which reaches its output, and the first step says why."""
    from dione.launch.slice import SliceError

    with pytest.raises(SliceError, match="feeds it by some path other than the hidden"):
        train(leaky_task(), "gpipe", tmp_path, 2, micro_batches=2)


def test_the_profiler_finds_pipeline_options_for_an_lstm(tmp_path: Path) -> None:
    """Its trials cut by time (the profiler's setting), which used to crash on the tuple."""
    from dione.profile import Catalog, TrialOptions, profile_workload
    from dione.spec.cluster import Cluster

    task = replace(lstm_task(), techniques=("gpipe",))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload([task], Cluster([TEST_NODE]), catalog,
                                   options=TrialOptions(warmup_steps=1, measure_steps=2,
                                                        timeout=120), scratch=tmp_path / "s")
    (found,) = profile.tasks
    assert [(o.technique, o.devices) for o in found.options] == [("gpipe", 2)]
    assert all(t.status == "ok" for t in found.trials), [(t.knobs, t.status) for t in found.trials]


def test_a_probe_batch_with_no_counted_token_does_not_refuse_the_pipelines() -> None:
    """A masked LM's two-sample probe batch with no masked token has a NaN mean over none
    on the whole model and on the stages: the stages' finiteness check named a skip
    connection across the cut, and refused gpipe and 1f1b for a model they cut fine."""
    from dione.techniques.pipeline.probe import _stage_problem

    task = gpt2_task()
    model = task.model()
    items = [lm_data()[i] for i in range(2)]
    batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
    assert _stage_problem(task, model, batch) is None
    batch["labels"] = torch.full_like(batch["labels"], -100)
    assert _stage_problem(task, model, batch) is None


class _Experts(nn.Module):
    """A mixture of four experts run side by side on every token, weighted by a router."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.GELU(),
                                                   nn.Linear(16, 8)) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.router(x).softmax(-1)
        return x + sum(weights[:, e:e + 1] * expert(x) for e, expert in enumerate(self.experts))


class _MixtureNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.moe, self.head = nn.Linear(8, 8), _Experts(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.moe(self.inp(x)))


def test_a_mixtures_experts_taken_for_blocks_are_named_with_the_way_out() -> None:
    """A model whose only list of modules is a mixture's experts was refused by the
    pipelines with a tensor-size error alone (a review): the refusal names the list taken
    for the blocks and the attribute that says which are."""
    from dione.techniques.pipeline.probe import _stage_problem

    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 8, generator=generator),
                                          torch.randint(0, 4, (8,), generator=generator))
    task = Task(name="mixture", model=_MixtureNet, data=lambda: data,
                loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=4, steps=2)
    said = _stage_problem(task, _MixtureNet(), (data.tensors[0][:4], data.tensors[1][:4]))
    assert said is not None and "it took moe.experts for the blocks its forward runs one " \
        "after another" in said and "dione_stages attribute" in said, said
