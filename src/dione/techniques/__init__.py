"""How one task trains on g devices: the built-in techniques and the registry."""

from dione.techniques.base import SliceOutcome, SliceSpec, Technique, TechniqueError
from dione.techniques.context import SliceContext
from dione.techniques.data_parallel import DataParallelTechnique
from dione.techniques.ddp import DDP
from dione.techniques.fsdp import FSDP
from dione.techniques.pipeline import (
    GPipe,
    OneFOneB,
    PipelineTechnique,
    XPipe,
    pipeline_refusals,
    with_refusals,
)
from dione.techniques.registry import get_technique, register, technique_names, techniques
from dione.techniques.single import Single

register(Single())
register(DDP())
register(FSDP())
register(GPipe())
register(OneFOneB())
register(XPipe())

__all__ = [
    "DDP",
    "FSDP",
    "DataParallelTechnique",
    "GPipe",
    "OneFOneB",
    "PipelineTechnique",
    "Single",
    "SliceContext",
    "SliceOutcome",
    "SliceSpec",
    "Technique",
    "TechniqueError",
    "XPipe",
    "get_technique",
    "pipeline_refusals",
    "register",
    "technique_names",
    "techniques",
    "with_refusals",
]
