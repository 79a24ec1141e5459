"""The cost model's activation memory per layer against what the bundled entrypoint's layer really
saves for backward.

``activation_bytes_per_layer`` (costmodel/memory.py) is Korthikanti et al. 2022's count for
Megatron-LM's layer, generalized to GQA, SwiGLU and FlashAttention. ``train/loop/census.py
saved_activations`` runs one forward of the entrypoint's ``DecoderLayer`` (through ``DenseModel``,
the pp = 1 model, and through ``Pipeline`` for full recompute with pp > 1) and counts the storages
autograd keeps for backward. The entrypoint is plain PyTorch, so it keeps more than Megatron-LM
with its fused kernels does; the cost model counts each difference for the deepspeed runtime
(``entrypoint_extra_bytes_per_layer``, where each term names the op that saves it and what
Megatron-LM / Transformer Engine keeps instead), and ``extras_by_hand`` writes the same terms out.
The test holds, to the byte: measured == formula + the model's extras, for recompute none /
selective / full at tp = 1 and at tp = 2 with and without sequence parallelism (two CPU ranks
over gloo). A mixture-of-experts layer (train/model/moe.py) keeps formula(f = 0) + the extras +
``moe_activation_bytes_per_layer`` (router scores, routing indices, the permuted token copies,
the experts' GEMM outputs, the combine, the shared experts), checked the same way for several
routers at tp = 1, at tp = 2 with and without SP, and at ep = 2 (each rank with the token copies
it sent and received).

Run with ``pytest -s`` to see each case's storages. About 25 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from deepspeed.pipe import LayerSpec

from orchestrator.costmodel.memory import (
    activation_bytes_per_layer,
    entrypoint_extra_bytes_per_layer,
    moe_activation_bytes_per_layer,
)
from orchestrator.plan.layout import Layout
from orchestrator.spec.model import ModelSpec, MoESpec
from orchestrator.train.loop.census import saved_activations
from orchestrator.train.model.decoder import DecoderLayer, DenseModel, Pipeline, recompute
from orchestrator.train.model.tensor_parallel import TPContext

ROOT = Path(__file__).resolve().parents[2]

# A small Llama-shaped layer: RMSNorm, RoPE, SwiGLU, GQA (8 heads, 4 kv heads), no bias, no dropout
# (the entrypoint has none), bf16 weights and activations.
S, B, H, F, A, KV = 64, 2, 256, 704, 8, 4
D = H // A
SEED = 1234
MODEL = ModelSpec(num_layers=2, hidden_size=H, ffn_hidden_size=F, num_attention_heads=A, num_kv_heads=KV,
                  vocab_size=512)
RECOMPUTE = {"none": 0, "selective": 1, "full": 2}  # the cost model's codes
T = 2  # the tp degree of the two-rank cases


def formula(rc: str, t: int = 1, sp: bool = False) -> float:
    # The entrypoint's attention is SDPA, which takes the flash path on CPU (saves the log-sum-exp,
    # no s^2 scores); SwiGLU; no dropout anywhere.
    return float(activation_bytes_per_layer(S, B, H, F, A, KV, t, sp, RECOMPUTE[rc], swiglu=True, flash=True,
                                            hidden_dropout=False, attention_dropout=False, act_bytes=2))


def extras(rc: str, t: int = 1, sp: bool = False) -> float:
    """What the cost model adds for the entrypoint's plain-PyTorch layer (the terms, with the op that
    saves each and what Megatron-LM keeps instead, are in memory.entrypoint_extra_bytes_per_layer)."""
    return float(entrypoint_extra_bytes_per_layer(S, B, D, t, sp, RECOMPUTE[rc], rmsnorm=True, rope=True,
                                                  act_bytes=2))


def extras_by_hand(rc: str, t: int = 1, sp: bool = False) -> dict[str, float]:
    """The same terms written out for this layer, each from the op that saves it (what the census
    table printed by ``pytest -s`` shows), so that the model's function is checked term by term."""
    if rc == "full":
        return {}  # the checkpoint keeps the layer input and nothing else, as the formula says
    # RoPE's bf16 cos/sin tables, cast from the fp32 buffers each forward and saved by the two
    # rotations (DeepSpeed casts parameters, not buffers); each norm's fp32 1/rms per token. No term
    # for the norms' inputs (_RMSNorm keeps the 16-bit input the formula counts), the fused QKV
    # output (v is copied out of it), the gated MLP (its gate/up output only) nor the
    # column-parallel GEMMs under SP (their sequence shard, gathered again in backward).
    s_norm = S / t if sp else S
    terms = {"RoPE cos/sin cast to bf16": 2 * S * D * 2, "1/rms in fp32 (2 norms)": 2 * 4 * s_norm * B}
    return terms


def _layout(rc: str, t: int = 1, sp: bool = False) -> Layout:
    return Layout(tp=t, pp=1, dp=1, vpp=1, zero_stage=0, micro_batch_size=B, grad_accum_steps=1, recompute=rc,
                  sequence_parallel=sp)


def _bf16_weights(module: torch.nn.Module) -> torch.nn.Module:
    # What DeepSpeed's bf16 engine does to the model: parameters to bf16, buffers left in fp32.
    for p in module.parameters():
        p.data = p.data.to(torch.bfloat16)
    return module


def _no_loss(x, labels):
    return x


def _layer_input(t: int, sp: bool, rank: int) -> torch.Tensor:
    """The layer's input as the previous layer hands it over: [s(/t), b, h] bf16, requiring grad."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(S, B, H, generator=g).to(torch.bfloat16)
    if sp:
        x = x.chunk(t, dim=0)[rank]
    return x.clone().requires_grad_()


def _measure(module: torch.nn.Module, x: torch.Tensor, *args):
    out, saved = saved_activations(module, x, *args)
    out.float().sum().backward()  # the graph is whole: backward (and any recomputation) runs
    return saved


def measure_dense(rc: str, tp: TPContext, t: int, sp: bool, rank: int = 0, model_spec: ModelSpec = MODEL, ep=None):
    """One decoder layer as the pp = 1 model runs it (DenseModel: full recompute wraps each layer)."""
    spec = LayerSpec(DecoderLayer, model_spec, S, _layout(rc, t, sp), tp, SEED, 0, ep)
    model = _bf16_weights(DenseModel([spec], _no_loss, full_recompute=rc == "full"))
    saved = _measure(model, _layer_input(t, sp, rank), None)
    moe = model.layers[0].moe
    return saved if moe is None else (saved, moe.sent_tokens, moe.routed_tokens)


# --------------------------------------------------------------------------- mixture of experts

# MoE layers (layer 0 of these models is MoE): the spec's router, shared-expert and balancing variants.
MOE = {
    "softmax-shared": MoESpec(num_experts=4, top_k=2, ffn_hidden_size=128, shared_experts=1),
    "softmax-no-shared": MoESpec(num_experts=4, top_k=2, ffn_hidden_size=128),
    "sigmoid-grouped-gated-seq": MoESpec(num_experts=8, top_k=2, ffn_hidden_size=64, shared_experts=2,
                                         shared_expert_gate=True, router="sigmoid", groups=4, group_top_k=2,
                                         scale=2.5, load_balancing="seq_aux_loss"),
    "top1-no-aux-gelu": MoESpec(num_experts=4, top_k=1, ffn_hidden_size=128, aux_loss_coeff=0.0),
    "capacity": MoESpec(num_experts=4, top_k=2, ffn_hidden_size=128, capacity_factor=0.5),
}


def moe_model(name: str) -> ModelSpec:
    activation = "gelu" if "gelu" in name else "swiglu"
    return MODEL.model_copy(update={"moe": MOE[name], "activation": activation})


def moe_formula(name: str, rc: str, sent: int, received: int, t: int = 1, sp: bool = False) -> float:
    """formula(f = 0) + the entrypoint's extras + what the MoE feed-forward keeps."""
    m, model = MOE[name], moe_model(name)
    swiglu = model.activation != "gelu"
    dense = activation_bytes_per_layer(S, B, H, 0, A, KV, t, sp, RECOMPUTE[rc], swiglu=swiglu, flash=True,
                                       hidden_dropout=False, attention_dropout=False, act_bytes=2)
    moe = moe_activation_bytes_per_layer(
        S, B, H, t, sp, RECOMPUTE[rc], num_experts=m.num_experts, top_k=m.top_k, expert_ffn=m.ffn_hidden_size,
        shared_ffn=m.shared_ffn, shared_gate=m.shared_expert_gate, swiglu=swiglu, router=m.router,
        norm_top_k=m.norm_top_k, load_balancing="none" if m.aux_loss_coeff == 0 else m.load_balancing,
        sent=sent, received=received, act_bytes=2)
    return float(dense + extras(rc, t, sp) + moe)


@pytest.mark.parametrize("name", list(MOE))
@pytest.mark.parametrize("rc", list(RECOMPUTE))
def test_a_moe_layer_keeps_the_formula_plus_the_moe_terms(name, rc):
    """tp = 1, ep = 1: every token copy stays here (sent = received: top_k per token, fewer with
    the capacity, as counted by the layer)."""
    saved, sent, routed = measure_dense(rc, TPContext(None, False), 1, False, model_spec=moe_model(name))
    explain = f"\n{name}, recompute {rc}: {routed} token copies\n{saved.table()}"
    print(explain)
    assert sent == routed
    if MOE[name].capacity_factor is None:
        assert routed == S * B * MOE[name].top_k
    else:  # ceil(T k / E x 0.5) per expert at most
        assert routed <= MOE[name].num_experts * -(-S * B * MOE[name].top_k * 0.5 // MOE[name].num_experts)
    assert saved.nbytes == moe_formula(name, rc, routed, routed), explain


def test_the_moe_terms_grow_with_the_token_copies():
    """Each token copy costs its hidden vector twice (the experts' input and output), the experts'
    GEMM outputs and two indices; nothing else depends on the copies."""
    one = moe_formula("softmax-no-shared", "none", 100, 100)
    assert moe_formula("softmax-no-shared", "none", 101, 101) - one == 2 * (2 * H + 3 * 128 + 1) + 8
    assert moe_formula("softmax-no-shared", "full", 101, 101) == 2 * S * B * H


def _explain(table: str, rc: str, t: int, sp: bool) -> str:
    """The formula, the extras and the measured storages of one case (printed with pytest -s)."""
    terms = "\n".join(f"{v:>12,.0f}  {k}" for k, v in extras_by_hand(rc, t, sp).items())
    return (f"\nrecompute {rc}, tp {t}, sp {sp}: formula {formula(rc, t, sp):,.0f}\n{terms}\n"
            f"measured (rank 0):\n{table}")


# --------------------------------------------------------------------------- the census itself


def test_census_counts_each_storage_once_and_leaves_out_weights():
    lin = torch.nn.Linear(8, 8, bias=False)
    lin.register_buffer("table", torch.ones(4, 8))
    x = torch.randn(4, 8, requires_grad=True)

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            y = self.lin(x)            # saves x (and the weight, left out)
            z = y[:2] * y[2:]          # saves two views of y: y's storage once
            # z * z saves z twice (counted once); the product with the buffer saves the buffer's
            # view only (the buffer needs no gradient), and that is left out.
            return (z * z * self.lin.table[:2]).sum()

    out, saved = saved_activations(Probe(), x)
    assert saved.nbytes == x.numel() * 4 + 4 * 8 * 4 + 2 * 8 * 4, saved.table()
    assert [s.producer for s in saved.storages] == ["leaf", "MmBackward0", "MulBackward0"]
    assert saved.storages[1].base_shape == (4, 8) and saved.storages[1].shape == (2, 8)
    out.backward()


# --------------------------------------------------------------------------- tp = 1


@pytest.mark.parametrize("rc", list(RECOMPUTE))
def test_one_layer_keeps_the_formula_plus_the_named_extras(rc):
    saved = measure_dense(rc, TPContext(None, False), 1, False)
    explain = _explain(saved.table(), rc, 1, False)
    print(explain)
    assert saved.nbytes == formula(rc) + extras(rc), explain
    assert extras(rc) == sum(extras_by_hand(rc).values())


def test_recompute_orders_as_the_paper_says():
    tp = TPContext(None, False)
    got = {rc: measure_dense(rc, tp, 1, False).nbytes for rc in RECOMPUTE}
    assert got["full"] < got["selective"] < got["none"]
    # With FlashAttention selective recompute saves only the log-sum-exp (4asb), measured and
    # modelled; the paper's large gap is for the s^2 score matrices, which only the non-flash count has.
    assert formula("full") < formula("selective") < formula("none")
    assert formula("none") - formula("selective") == 4 * A * S * B
    no_flash = [float(activation_bytes_per_layer(S, B, H, F, A, KV, 1, False, RECOMPUTE[rc], flash=False))
                for rc in ("full", "selective", "none")]
    assert no_flash[0] < no_flash[1] < no_flash[2]
    # Full recompute keeps the layer input, 2sbh (Korthikanti et al. 2022, Table 2), measured and modelled.
    assert got["full"] == formula("full") == 2 * S * B * H
    # Selective recompute drops the core attention's saved tensors: with SDPA's flash path only its
    # output and log-sum-exp (the output stays alive as the out-projection's input), 4asb.
    assert got["none"] - got["selective"] == 4 * A * S * B


def test_rms_norm_gradients_are_autograds():
    """The memory-lean RMSNorm (it keeps only its input) differentiates as autograd through the
    fp32 statistics does."""
    from orchestrator.train.model.decoder import NORM_EPS, _RMSNorm

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(5, 3, 16, generator=g, dtype=torch.float64)
    (_RMSNorm.apply(x, w, NORM_EPS) * up).sum().backward()
    ours = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w
    (ref * up).sum().backward()
    assert torch.allclose(ours[0], x.grad, rtol=1e-12, atol=1e-12)
    assert torch.allclose(ours[1], w.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: _RMSNorm.apply(a, b, NORM_EPS),
                                    (x.detach().requires_grad_(), w.detach().requires_grad_()))


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_gated_activation_gradients_are_autograds(kind):
    """The memory-lean gated activation (it keeps only the gate/up output) differentiates exactly as
    autograd through act(g) * u does."""
    import torch.nn.functional as Fn

    from orchestrator.train.model.decoder import gated_activation

    g = torch.Generator().manual_seed(7)
    gu = torch.randn(5, 3, 2 * 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, 6, generator=g, dtype=torch.float64)
    (gated_activation(gu, kind) * w).sum().backward()
    ours = gu.grad.clone()
    gu.grad = None
    a, u = gu.chunk(2, dim=-1)
    act = Fn.silu(a) if kind == "swiglu" else Fn.gelu(a, approximate="tanh")
    (act * u * w).sum().backward()
    assert torch.allclose(ours, gu.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: gated_activation(x, kind), (gu.detach().requires_grad_(),))


# --------------------------------------------------------------------------- tp = 2 over gloo


def _rank_main(out_dir: Path) -> None:
    """One rank of the two-rank run (``python -m torch.distributed.run ... -m tests.system.test_activation_census``):
    every case on this rank, written to out_dir/rankN.json."""
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

    from orchestrator.train.loop import launch

    denv = launch.read_env()
    launch.init(denv, "gloo")
    ok = False
    try:
        # As train/loop/entry.py: the tp group is the grid's slice group.
        topo = PipeModelDataParallelTopology(num_pp=1, num_mp=denv.world_size, num_dp=1)
        group = PipelineParallelGrid(topology=topo).get_slice_parallel_group()
        doc = {}
        for sp in (False, True):
            tp = TPContext(group, sp)
            for rc in RECOMPUTE:
                saved = measure_dense(rc, tp, tp.size, sp, tp.rank)
                doc[f"{rc}/sp={sp}"] = {"nbytes": saved.nbytes, "table": saved.table()}
        for name in ("softmax-shared", "softmax-no-shared", "sigmoid-grouped-gated-seq"):
            for sp in (False, True):
                saved, sent, routed = measure_dense("none", TPContext(group, sp), denv.world_size, sp, denv.rank,
                                                    model_spec=moe_model(name))
                doc[f"moe-{name}/sp={sp}"] = {"nbytes": saved.nbytes, "table": saved.table(), "sent": sent,
                                              "routed": routed}
        # ep = 2 over the two ranks as data-parallel ranks (tp = 1): DeepSpeed's expert groups.
        from orchestrator.train.model.moe import expert_groups

        dp_topo = PipeModelDataParallelTopology(num_pp=1, num_mp=1, num_dp=denv.world_size)
        ep = expert_groups(denv.world_size, PipelineParallelGrid(topology=dp_topo))
        for name in ("softmax-shared", "capacity"):
            saved, sent, routed = measure_dense("none", TPContext(None, False), 1, False, denv.rank,
                                                model_spec=moe_model(name), ep=ep)
            doc[f"moe-ep2-{name}"] = {"nbytes": saved.nbytes, "table": saved.table(), "sent": sent, "routed": routed}
        # pp > 1: DeepSpeed's PipelineModule checkpoints every DecoderLayer itself
        # (activation_checkpoint_interval 1, checkpoint function model.recompute), as entry.py builds it.
        tp = TPContext(group, True)
        spec = LayerSpec(DecoderLayer, MODEL, S, _layout("full", tp.size, True), tp, SEED, 0)
        pipe = _bf16_weights(Pipeline([spec], (1,), topology=topo, loss_fn=None, partition_method="uniform",
                                      activation_checkpoint_interval=1, activation_checkpoint_func=recompute,
                                      checkpointable_layers=["DecoderLayer"]))
        # The pipeline engine does this at start (pipe/engine.py: with an interval > 0); without it
        # PipelineModule.forward zips the layers against an empty list and runs none of them.
        pipe._precompute_checkpointable_values()
        saved = _measure(pipe, _layer_input(tp.size, True, tp.rank))
        assert saved.nbytes > 0 and pipe.is_checkpointable_results == [True]
        doc["pipeline-full/sp=True"] = {"nbytes": saved.nbytes, "table": saved.table()}
        (out_dir / f"rank{denv.rank}.json").write_text(json.dumps(doc))
        ok = True
    finally:
        launch.teardown(ok)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("activation-census")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                        "SLURM_NTASKS")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(T),
                        "-m", "tests.system.test_activation_census", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(T)]


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
@pytest.mark.parametrize("rc", list(RECOMPUTE))
def test_tp2_layer_keeps_the_formula_plus_the_named_extras(two_ranks, rc, sp):
    ranks = [r[f"{rc}/sp={sp}"] for r in two_ranks]
    explain = _explain(ranks[0]["table"], rc, T, sp)
    print(explain)
    assert ranks[0]["nbytes"] == ranks[1]["nbytes"], explain  # the ranks hold equal shards
    assert ranks[0]["nbytes"] == formula(rc, T, sp) + extras(rc, T, sp), explain
    assert extras(rc, T, sp) == pytest.approx(sum(extras_by_hand(rc, T, sp).values()), abs=1e-6)


def test_full_recompute_with_sp_keeps_the_input_shard(two_ranks):
    # The layer input, sequence-sharded under SP: 2sbh/t (Table 2's 2sbh; memory.py shards it with
    # SP). DenseModel's checkpoint and the pipeline engine's activation checkpointing alike.
    for r in two_ranks:
        assert r["full/sp=True"]["nbytes"] == r["pipeline-full/sp=True"]["nbytes"] == formula("full", T, True) \
            == 2 * S * B * H / T, r["pipeline-full/sp=True"]["table"]


def test_sp_divides_the_replicated_terms_by_t(two_ranks):
    sbh = S * B * H
    # The formula: the replicated terms (norm inputs 4sbh, QKV and MLP inputs 2sbh each) shrink by t.
    assert formula("none", T, False) - formula("none", T, True) == 8 * sbh * (1 - 1 / T)
    # The entrypoint: the same (its norms keep their input, its QKV and gate/up GEMMs the shard), and
    # the norms' 1/rms per token with them.
    for r in two_ranks:
        for rc in ("none", "selective"):
            assert r[f"{rc}/sp=False"]["nbytes"] - r[f"{rc}/sp=True"]["nbytes"] == \
                (8 * sbh + 2 * 4 * S * B) * (1 - 1 / T)


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
@pytest.mark.parametrize("name", ["softmax-shared", "softmax-no-shared", "sigmoid-grouped-gated-seq"])
def test_tp2_moe_layer_keeps_the_formula_plus_the_moe_terms(two_ranks, name, sp):
    """Every tp rank routes the whole micro-batch (gathered under SP) and runs its slice of every
    expert: all T top_k copies, f / t of each expert's GEMM outputs."""
    for r in two_ranks:
        got = r[f"moe-{name}/sp={sp}"]
        assert got["sent"] == got["routed"] == S * B * MOE[name].top_k
        assert got["nbytes"] == moe_formula(name, "none", got["routed"], got["routed"], T, sp), got["table"]


@pytest.mark.parametrize("name", ["softmax-shared", "capacity"])
def test_ep2_moe_layer_keeps_the_formula_with_what_each_rank_sent_and_received(two_ranks, name):
    """ep = 2: each rank sends its micro-batch's copies (T top_k, or the capacity's) and runs what
    the two ranks routed to its two experts; the copies received add up to the copies sent."""
    got = [r[f"moe-ep2-{name}"] for r in two_ranks]
    for g in got:
        assert g["nbytes"] == moe_formula(name, "none", g["sent"], g["routed"]), g["table"]
    sent, received = [g["sent"] for g in got], [g["routed"] for g in got]
    assert sum(sent) == sum(received)
    if MOE[name].capacity_factor is None:
        assert sent == [S * B * MOE[name].top_k] * 2
        assert received != sent  # the two ranks' experts took unequal shares: the test sees both terms


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))
