"""The cost model: memory per GPU and step time of parallel layouts. Pure and vectorized."""

from orchestrator.costmodel.evaluate import RECOMPUTE_CODES, Candidates, Evaluation, evaluate

__all__ = ["RECOMPUTE_CODES", "Candidates", "Evaluation", "evaluate"]
