"""``benchmarks/gpu_check.py`` proves itself on the CPU before a GPU's time is spent on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_the_dry_run_compares_every_technique_it_can_run_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("transformers")  # the padded-LM rows build a tiny Llama
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run-on-cpu", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [record] = tmp_path.glob("gpu_check-*.json")
    checks = {c["name"]: c for c in json.loads(record.read_text())["checks"]}
    assert {c["status"] for c in checks.values()} == {"ok", "skipped"}
    # Every exact technique was compared with single, the point-to-point path first.
    assert list(checks)[1] == "xpipe x2 (NCCL point-to-point)"
    for name in ("ddp x2 (NCCL all-reduce)", "fsdp x2", "gpipe x4", "1f1b x4",
                 "padded LM ddp x2 (token count all-reduced)", "gpipe x2 bf16 clip"):
        assert checks[name]["status"] == "ok" and checks[name]["worst"] is not None, name
    assert all(c["detail"] == "CUDA only (dry run on CPU)"
               for c in checks.values() if c["status"] == "skipped")


def test_without_a_gpu_it_says_so_and_exits_apart(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 4 and "nothing was checked" in done.stdout
