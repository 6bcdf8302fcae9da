"""The pipeline wing: a model cut into one stage per device, micro-batches piped through.

``stage_plan`` finds a model's blocks, ``partition`` and ``balance`` cut them into
stages (by parameters or measured time, a cut kept per run), ``stages`` and
``stage_build`` make each rank's stage (its blocks only, initial weights as single's),
``shared`` keeps a weight two stages use in step; ``gpipe`` runs torch's GPipe and 1F1B
schedules with the ``action_log`` timing them, ``xpipe`` (with ``prediction``) runs
asynchronous XPipe; ``probe`` refuses, per task and before profiling, the pipelines
that cannot train it. The schedules they run are data in ``dione.schedules``.
"""

from dione.techniques.pipeline.gpipe import GPipe, OneFOneB, PipelineTechnique
from dione.techniques.pipeline.probe import pipeline_refusals, with_refusals
from dione.techniques.pipeline.xpipe import XPipe

__all__ = ["GPipe", "OneFOneB", "PipelineTechnique", "XPipe", "pipeline_refusals",
           "with_refusals"]
