"""Option tables for a real cluster from published figures: a Llama 2 fine-tuning sweep
on nodes of 8 H100-80GB GPUs, each option's seconds with its source in the file; and the
same sweep on a cluster of H100 and A100-80GB nodes, each option given per node kind.

    python benchmarks/published_tables.py    # rewrites benchmarks/cluster_tables/

What is published, and where (keys of ``SOURCES``, written into the problem file):

* the throughput of each model's fine-tune at one width: NVIDIA's NeMo performance
  summary gives tokens per second per GPU for Llama 2 7B, 13B (full fine-tuning, "SFT")
  and 7B, 13B, 70B (LoRA) on 8 H100s (FP8, packed sequences of 4,096 tokens, global
  batch 32, micro-batch 1), each at one tensor/pipeline split (``nemo``);
* the models' shapes (``llama2``), the GPU's memory and NVLink bandwidth (``h100``);
* the rules the other widths are derived with: bytes of model state per parameter and
  FSDP's communication volume (``zero``), activation bytes per layer (``korthikanti``),
  the pipeline bubble and what each schedule holds (``gpipe``, ``1f1b``), the cost of
  recomputing activations (``recompute``), DDP's overlap of all-reduce with the
  backward pass (``ddp``), tensor parallelism's efficiency on 2 GPUs (``megatron-v1``).

Every option other than the anchor is **derived**: the anchor's rate is divided by its
modelled efficiency (bubble, exposed communication) to get a per-GPU compute rate, and
each option's seconds are that rate times its own modelled efficiency. The figures this
file assumes (``assumed``) are named there: usable memory, the all-reduce bandwidth, how
much communication overlaps. The option's ``"source"`` says which figures it rests on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "cluster_tables"

SOURCES = {
    "nemo": "NVIDIA NeMo Framework User Guide 24.12, Performance Summary, Fine-tuning "
            "table (H100, FP8, packed sequence length 4096, GBS 32, MBS 1): tokens/s/GPU "
            "Llama-2 7B SFT 16,891 (8 GPUs, TP1 PP1), 13B SFT 10,176 (8 GPUs, TP1 PP4), 7B "
            "LoRA 24,824 (8 GPUs, TP1 PP1), 13B LoRA 14,629 (8 GPUs, TP1 PP1), 70B LoRA "
            "2,621 (8 GPUs, TP2 PP4). https://docs.nvidia.com/nemo-framework/user-guide/"
            "24.12/nemotoolkit/performance/performance_summary.html. FP8 rates: every "
            "option's seconds are as fast as FP8 trains, optimistic for a bf16 run, while "
            "the memory rules count bf16 weights and activations",
    "llama2": "Touvron et al. 2023, Llama 2 (arXiv 2307.09288): 7B has 32 layers of width "
              "4096, 13B 40 of 5120, 70B 80 of 8192; context 4096",
    "h100": "NVIDIA H100 Tensor Core GPU datasheet (SXM): 80 GB of HBM3, NVLink 900 GB/s "
            "per GPU (both directions together)",
    "zero": "Rajbhandari et al. SC20, ZeRO (arXiv 1910.02054): mixed-precision Adam holds "
            "16 bytes per parameter (2 weights, 2 gradients, 12 fp32 weights, momentum, "
            "variance); sharding the parameters too moves 1.5x the data of plain data "
            "parallelism",
    "korthikanti": "Korthikanti et al. 2022 (arXiv 2205.05198): activations of one layer "
                   "take s*b*h*(34 + 5*a*s/h) bytes in 16-bit training; 34*s*b*h with the "
                   "attention recomputed (flash attention keeps no s^2 term); with full "
                   "recomputation only the layer's input, 2*s*b*h",
    "gpipe": "Huang et al. NeurIPS 2019, GPipe (arXiv 1811.06965): K stages and M "
             "micro-batches idle a share (K-1)/(M+K-1) of the time; all M micro-batches' "
             "activations are held until the backward pass (dione's gpipe does not "
             "re-materialise)",
    "1f1b": "Narayanan et al. SC21 (arXiv 2104.04473), section 2.2: the 1F1B schedule "
            "(PipeDream-Flush) has GPipe's bubble and holds at most K micro-batches' "
            "activations",
    "recompute": "Kaplan et al. 2020 (arXiv 2001.08361): a step costs 6N FLOPs a token, "
                 "2N of them the forward pass; recomputing the forward (Chen et al. 2016, "
                 "arXiv 1604.06174) adds 2N: x4/3 for full fine-tuning, and x6/4 for LoRA, "
                 "whose step skips the frozen weights' gradients (4N)",
    "ddp": "Li et al. VLDB 2020, PyTorch Distributed (arXiv 2006.15704): DDP overlaps "
           "the gradient all-reduce with the backward pass",
    "megatron-v1": "NVIDIA ADLR, MegatronLM's Supercharged V1.0 (https://nv-adlr.github.io/"
                   "MegatronLMV1), Table 1: 2-way model parallelism at 90.7% of linear "
                   "scaling (V100; taken for H100 here: an assumption)",
    "a100": "NVIDIA A100 Tensor Core GPU datasheet (SXM, 80 GB): 312 TFLOPS of dense "
            "BF16, 80 GB of HBM2e, NVLink 600 GB/s per GPU; against the H100 SXM "
            "datasheet's 989 TFLOPS of dense BF16 (1,979 is with sparsity)",
    "assumed-a100": "this file's assumption for A100 nodes, not published: the same "
                    "model FLOPs utilisation as the H100's, so the per-GPU compute rate "
                    "is the H100's times 312/989 (the datasheets' dense BF16; the NeMo "
                    "anchors are FP8, so A100 options are if anything slower still); "
                    "all-reduce bus bandwidth 240 GB/s (0.8 of NVLink's 300 GB/s one "
                    "way); memory and its rules as on the H100 (80 GB, 72 usable)",
    "assumed": "this file's assumptions, not published: 72 GB of the 80 usable (CUDA "
               "context, NCCL buffers, fragmentation); all-reduce bus bandwidth 360 GB/s "
               "(0.8 of NVLink's 450 GB/s one way); DDP hides communication behind the "
               "backward pass (2/3 of the compute), FSDP behind both passes (all of it); "
               "LoRA of rank 16 on the attention's four projections; pipeline point-to-"
               "point transfers (s*h*2 bytes a micro-batch) neglected",
}

GiB = 1e9
MEMORY = 72 * GiB
BUS = 360e9
SEQ = 4096
NODE = 8
# An A100's compute rate as a share of the H100's, and its all-reduce bus ("a100").
A100_SHARE = 312 / 989
A100_BUS = 240e9


@dataclass(frozen=True)
class Model:
    """A Llama 2 size: parameters, layers, width; its published anchors by fine-tune."""

    name: str
    params: float
    layers: int
    width: int
    anchors: dict[str, tuple[float, int, int]]  # kind -> (tokens/s/GPU, TP, PP) on 8

    def trainable(self, kind: str) -> float:
        # LoRA of rank 16 on q, k, v, o: two width x 16 matrices each (assumed).
        return self.params if kind == "sft" else self.layers * 4 * 2 * self.width * 16

    def state_bytes(self, kind: str) -> float:
        # Full fine-tuning: 16 bytes a parameter (zero); LoRA: 2-byte frozen weights plus
        # 16 bytes for each trainable one.
        if kind == "sft":
            return 16 * self.params
        return 2 * self.params + 16 * self.trainable(kind)

    def activation_bytes(self, checkpointed: bool) -> float:
        """One sequence's activations through every layer (korthikanti)."""
        per_layer = (2 if checkpointed else 34) * SEQ * self.width
        return per_layer * self.layers


MODELS = [
    Model("llama2-7b", 6.74e9, 32, 4096, {"sft": (16891, 1, 1), "lora": (24824, 1, 1)}),
    Model("llama2-13b", 13.0e9, 40, 5120, {"sft": (10176, 1, 4), "lora": (14629, 1, 1)}),
    Model("llama2-70b", 69.0e9, 80, 8192, {"lora": (2621, 2, 4)}),
]


def recompute_factor(kind: str) -> float:
    return 4 / 3 if kind == "sft" else 6 / 4


def step_time(model: Model, kind: str, rate: float, batch: int, technique: str,
              devices: int, checkpointed: bool = False, data_parallel: int = 0,
              bus: float = BUS) -> float:
    """Seconds of one step of ``batch`` sequences at a per-GPU compute rate (tokens/s),
    collectives at ``bus`` bytes/s."""
    compute = batch * SEQ / (devices * rate)
    if checkpointed:
        compute *= recompute_factor(kind)
    if technique in ("gpipe", "1f1b", "anchor-pp"):
        # The anchor's pipelines also run data parallel over the rest of the node.
        dp = data_parallel or 1
        stages = devices // dp
        micro = batch // dp
        piped = compute * (micro + stages - 1) / micro
        if dp == 1:
            return piped
        volume = 2 * (dp - 1) / dp * 2 * model.trainable(kind) / stages
        return piped + max(0.0, volume / bus - 2 / 3 * piped)
    if devices == 1:
        return compute
    share = 2 * (devices - 1) / devices
    if technique == "fsdp":
        # Gathers of every weight in both passes, reduce-scatter of the trainable ones.
        volume = share / 2 * 2 * model.params * 2 + share / 2 * 2 * model.trainable(kind)
        return compute + max(0.0, volume / bus - compute)
    # ddp (and the anchors' data parallelism, whose distributed optimizer moves as much)
    return compute + max(0.0, share * 2 * model.trainable(kind) / bus - 2 / 3 * compute)


def compute_rate(model: Model, kind: str) -> float:
    """The per-GPU compute rate behind the published anchor, its bubble and exposed
    communication taken out (a fixed point: the exposed part depends on the rate)."""
    published, tp, pp = model.anchors[kind]
    rate = published
    for _ in range(50):
        # A tensor-parallel pair counts as one device of twice the rate at megatron-v1's
        # 90.7%; the anchors' pipelines run data parallel over the rest of the node.
        devices = NODE // tp
        pair = rate * tp * (0.907 if tp > 1 else 1.0)
        step = step_time(model, kind, pair, 32, "anchor-pp" if pp > 1 else "ddp", devices,
                         data_parallel=devices // pp)
        rate *= published / (32 * SEQ / (NODE * step))
    return rate


def memory(model: Model, kind: str, technique: str, devices: int, checkpointed: bool,
           micro: int) -> float:
    act = model.activation_bytes(checkpointed)
    if technique in ("single", "ddp"):
        return model.state_bytes(kind) + act
    if technique == "fsdp":
        gathered = 2 * 2 * model.params / model.layers  # a layer gathered, the next prefetched
        return model.state_bytes(kind) / devices + gathered + act
    held = micro if technique == "gpipe" else min(devices, micro)
    return model.state_bytes(kind) / devices + held * act / devices


def options(model: Model, kind: str, batch: int, tokens: float,
            gpu: str | None = None) -> list[dict[str, Any]]:
    """The task's options on H100 nodes, or on nodes of ``gpu`` ("A100": derived from
    the H100's by "assumed-a100"), each then of that node kind."""
    rate = compute_rate(model, kind)
    bus = BUS
    published, tp, pp = model.anchors[kind]
    anchor = (f"nemo ({published:,} tokens/s/GPU at TP{tp} PP{pp}) -> compute rate "
              f"{rate:,.0f} tokens/s/GPU")
    if gpu == "A100":
        rate, bus = rate * A100_SHARE, A100_BUS
        anchor += f" on H100 -> {rate:,.0f} on A100 (a100, assumed-a100)"
    steps = tokens / (batch * SEQ)
    found = []
    for technique in ("single", "ddp", "fsdp", "gpipe", "1f1b"):
        for devices in (1, 2, 4, NODE):
            if (technique == "single") != (devices == 1) and technique != "fsdp":
                continue
            for checkpointed in ((False, True) if technique == "fsdp" else (False,)):
                if technique == "fsdp" and devices == 1 and not checkpointed:
                    continue  # the same as single
                if memory(model, kind, technique, devices, checkpointed, batch) > MEMORY:
                    continue
                seconds = steps * step_time(model, kind, rate, batch, technique, devices,
                                            checkpointed, bus=bus)
                rules = {"single": "", "ddp": "; ddp, zero, assumed",
                         "fsdp": "; zero, assumed", "gpipe": "; gpipe",
                         "1f1b": "; 1f1b"}[technique]
                if checkpointed:
                    rules += "; recompute"
                # Memory counts one sequence's activations a pass (NeMo's micro-batch of
                # 1): a replica takes its share of the batch one sequence at a time, which
                # the accumulation knob says (without it, 128 sequences at once: TiBs).
                share = {"accumulation": batch // devices}
                knobs: dict[str, Any] = (
                    {"activation_checkpointing": checkpointed, **share} if technique == "fsdp"
                    else {"micro_batches": batch} if technique in ("gpipe", "1f1b")
                    else share)
                found.append({"technique": technique, "knobs": knobs, "devices": devices,
                              "seconds": round(seconds, 1),
                              **({"kind": gpu} if gpu else {}),
                              "source": f"derived from {anchor}{rules}; memory: "
                                        f"llama2, zero, korthikanti, h100"})
    return found


def sweep(gpus: tuple[str | None, ...] = (None,)) -> dict[str, Any]:
    """The sweep: every size's fine-tunes over learning rates and global batches, one
    epoch of a 200M-token dataset each (the sweep's shape is this file's choice); each
    task's options on nodes of each of ``gpus`` (None: H100, of no kind)."""
    tasks = []
    grids = {("llama2-7b", "sft"): (["1e-5", "2e-5", "5e-5"], [32, 128]),
             ("llama2-13b", "sft"): (["1e-5", "2e-5", "5e-5"], [32, 128]),
             ("llama2-7b", "lora"): (["1e-4", "3e-4", "1e-3"], [32, 128]),
             ("llama2-13b", "lora"): (["1e-4", "3e-4", "1e-3"], [32, 128]),
             ("llama2-70b", "lora"): (["1e-4", "3e-4"], [32])}
    by_name = {m.name: m for m in MODELS}
    for (name, kind), (rates, batches) in grids.items():
        for batch in batches:
            table = [o for gpu in gpus for o in options(by_name[name], kind, batch, 200e6,
                                                        gpu)]
            for lr in rates:
                tasks.append({"name": f"{name}-{kind}-lr{lr}-b{batch}", "options": table})
    return {"sources": SOURCES, "tasks": tasks}


def main() -> None:
    import argparse

    # No options: parsed so that --help says what the script writes, not writes it.
    argparse.ArgumentParser(description="Writes option tables of a Llama 2 sweep from "
                            f"published figures: {OUT}/llama2-sweep.json and "
                            "llama2-mixed.json.").parse_args()
    OUT.mkdir(exist_ok=True)
    workload = sweep()
    # Two nodes here; benchmarks/cluster_sim.py runs it on 1, 2 and 4 (--nodes).
    problem = {"cluster": {"nodes": [{"name": f"n{i}", "devices": NODE, "kind": "H100"}
                                     for i in range(2)]}, **workload}
    (OUT / "llama2-sweep.json").write_text(json.dumps(problem, indent=1) + "\n")
    # Two H100 nodes and two A100 nodes, each option given per kind.
    mixed = {"cluster": {"nodes": [{"name": f"{gpu.lower()}-{i}", "devices": NODE,
                                    "kind": gpu}
                                   for gpu in ("H100", "A100") for i in range(2)]},
             **sweep(("H100", "A100"))}
    (OUT / "llama2-mixed.json").write_text(json.dumps(mixed, indent=1) + "\n")
    ratios = [a["seconds"] / h["seconds"] for t in mixed["tasks"]
              for h in t["options"] if h["kind"] == "H100"
              for a in t["options"] if a["kind"] == "A100"
              and (a["technique"], a["devices"], a["knobs"]) == (h["technique"],
                                                                 h["devices"], h["knobs"])]
    print(f"llama2-mixed: A100 over H100 seconds, per option: {min(ratios):.3f}-"
          f"{max(ratios):.3f}")
    for task in workload["tasks"][::3]:
        fastest = min(task["options"], key=lambda o: o["seconds"])
        least = min(task["options"], key=lambda o: o["seconds"] * o["devices"])
        print(f"{task['name']}: {len(task['options'])} options; fastest "
              f"{fastest['technique']} x{fastest['devices']} {fastest['seconds']:.0f} s; "
              f"fewest device-seconds {least['technique']} x{least['devices']} "
              f"{least['seconds'] * least['devices']:.0f}; "
              f"x8 over x1 rate {_scaling(task['options']):.2f}")


def _scaling(table: list[dict[str, Any]]) -> float:
    one = min((o["seconds"] for o in table if o["devices"] == 1), default=math.nan)
    eight = min(o["seconds"] for o in table if o["devices"] == NODE)
    return one / eight


if __name__ == "__main__":
    main()
