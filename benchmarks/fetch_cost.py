"""What fetching a batch costs: 64 Hugging Face text items a batch, 200 batches.

    python benchmarks/fetch_cost.py     # against a commit before, with its src on PYTHONPATH
"""

import time

from dione.techniques.batches import BatchSource
from dione.zoo.hf import lm_data

source = BatchSource(lm_data(), 64, 1)
source.batch(0)
began = time.perf_counter()
for step in range(200):
    source.batch(step)
print(f"{(time.perf_counter() - began) / 200 * 1000:.2f} ms per batch of 64")
