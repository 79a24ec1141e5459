"""The search (orchestrator/plan/solver.py): it finds the layouts the rules allow and the cost model
ranks first, with every pin kept."""

from __future__ import annotations

import numpy as np

from orchestrator.costmodel.memory import GIB
from orchestrator.plan.layout import Pins
from orchestrator.plan.solver import search
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import TrainingSpec

from .test_moe_costmodel import DSV3


def test_mtp_and_dense_leading_layers_split_the_pipeline():
    # 61 layers + 1 MTP module + embedding + loss = 64 slots, 8 per stage at pp 8.
    res = search(DSV3, TrainingSpec(seq_length=4096, global_batch_size=4096, steps=100,
                                    optimizer=dict(warmup_steps=10)),
                 load_profile("dgx16").profile.resized(nodes=32), "megatron",
                 Pins(tp=1, pp=8, vpp=4, ep=32, micro_batch_size=1, recompute="none", zero_stage=1, cp=1),
                 memory_margin_gib=-1e6, keep=1)
    assert res.best is not None and res.best.layout.short().startswith("tp1 ep32 pp8 vpp4")
    assert np.isfinite(res.best.step_time_s) and res.best.memory_gib["total"] * GIB > 0
