"""One GPU's share of the two fabrics (NVLink inside a domain, the node's NICs across domains) and
the ring and hierarchical collectives over them, in seconds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.inputs import _Inputs
from orchestrator.spec.cluster import bytes_per_s


def _ring_time(nbytes, n, bw, latency, factor):
    """Ring collective over n ranks: ``factor * (n-1)/n * bytes / bw`` plus one latency per ring
    step (factor = 2 for an all-reduce: reduce-scatter then all-gather, n-1 steps each)."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, factor * (n - 1) / n * nbytes / bw + factor * (n - 1) * latency, 0.0)


def _hierarchical_time(nbytes, d, k, bw_intra, lat_intra, bw_inter, lat_inter, factor):
    """A collective over d ranks, k of them per node: ring over NVLink inside the node, then a ring
    across the d/k nodes where each member carries 1/k of the bytes over its own NIC share
    (NCCL's multi-channel rings and 2D all-reduce give this bus bandwidth)."""
    d = np.asarray(d, dtype=np.float64)
    k = np.minimum(np.asarray(k, dtype=np.float64), d)
    nodes = np.maximum(1.0, np.ceil(d / k))
    inside = _ring_time(nbytes, k, bw_intra, lat_intra, factor)
    across = _ring_time(nbytes / k, nodes, bw_inter, lat_inter, factor)
    return inside + across


@dataclass(frozen=True, kw_only=True, slots=True)
class _Links:
    """One GPU's share of the two fabrics: bytes/s in one direction, and seconds of latency."""

    nvlink: np.ndarray
    nvlink_latency: float
    ib: np.ndarray  # its share of the node's NICs
    ib_latency: float


def _links(x: _Inputs) -> _Links:
    profile, eff = x.profile, x.eff
    return _Links(
        nvlink=bytes_per_s(profile.nvlink_gbs) * eff.intra_node_comm,  # one direction
        nvlink_latency=profile.intra_node.latency_us * 1e-6,
        ib=bytes_per_s(profile.nic_share_gbs) * eff.inter_node_comm,
        ib_latency=profile.inter_node.latency_us * 1e-6,
    )
