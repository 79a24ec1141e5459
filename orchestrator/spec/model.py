"""What model (ModelSpec) and how to train it (TrainingSpec): a model spec file. Frozen pydantic
models with ``extra="forbid"``, so that a typo is an error rather than a silently ignored key."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from orchestrator.errors import SpecError
from orchestrator.spec.overrides import Overrides
from orchestrator.spec.training import TrainingSpec
from orchestrator.spec.yamlio import FROZEN, Loaded, format_validation, load_yaml

# --------------------------------------------------------------------------------------------
# Model spec
# --------------------------------------------------------------------------------------------


class MoESpec(BaseModel):
    """Mixture-of-experts feed-forward layers (Shazeer et al. 2017; GShard; Switch): each token goes
    to ``top_k`` of ``num_experts`` routed experts, plus the shared experts every token passes
    through (DeepSeekMoE, Dai et al. 2024). Named as Megatron-LM's --num-experts, --moe-router-topk,
    --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size, --moe-layer-freq."""

    model_config = FROZEN

    num_experts: int = Field(gt=1, le=100_000, description="routed experts per MoE layer")
    top_k: int = Field(gt=0, le=1_000, description="routed experts per token")
    # One expert's intermediate size; the dense layers keep model.ffn_hidden_size.
    ffn_hidden_size: int = Field(gt=0, le=100_000_000)
    # Shared experts every token passes through beside its routed ones (DeepSeekMoE); 0: none.
    shared_experts: int = Field(default=0, ge=0, le=1_000)
    # The shared experts' intermediate size, all of them together (Megatron-LM's
    # --moe-shared-expert-intermediate-size); one expert's size times shared_experts when omitted.
    shared_ffn_hidden_size: int | None = Field(default=None, gt=0, le=100_000_000)
    # Qwen2-MoE's sigmoid gate on the shared expert's output (--moe-shared-expert-gate): h weights.
    shared_expert_gate: bool = False
    # The first layers keep a dense MLP (DeepSeek-V3's first_k_dense_replace = 3); of the rest,
    # every layer_freq-th is MoE (Megatron-LM --moe-layer-freq: layer i is MoE when i % freq == 0,
    # counted after the dense leading layers).
    dense_leading_layers: int = Field(default=0, ge=0, le=100_000)
    # Every layer_freq-th layer after the dense leading ones is MoE (Megatron-LM --moe-layer-freq); 1: all.
    layer_freq: int = Field(default=1, gt=0, le=100_000)
    # Router: softmax over the experts (Mixtral, Qwen) or sigmoid scores (DeepSeek-V3,
    # --moe-router-score-function); renormalized over the chosen top_k (norm_topk_prob); DeepSeek-V3's
    # grouped top-k picks top_k among the best ``group_top_k`` of ``groups`` expert groups
    # (--moe-router-num-groups / --moe-router-group-topk), scaled by ``scale``.
    router: Literal["softmax", "sigmoid"] = "softmax"
    # Renormalize the top_k chosen scores to sum to 1 (Hugging Face's norm_topk_prob). With softmax, false
    # emits Megatron-LM --moe-router-pre-softmax; the megatron runtime refuses false with sigmoid (top_k > 1).
    norm_top_k: bool = True
    # Expert groups of grouped top-k routing (Megatron-LM --moe-router-num-groups): divides num_experts,
    # set together with group_top_k; None: plain top-k.
    groups: int | None = Field(default=None, gt=0, le=100_000)
    # The groups a token's top_k experts are picked from (Megatron-LM --moe-router-group-topk); at most groups.
    group_top_k: int | None = Field(default=None, gt=0, le=100_000)
    # Factor on the routed experts' weights (DeepSeek-V3's routed_scaling_factor; Megatron-LM
    # --moe-router-topk-scaling-factor, emitted when not 1).
    scale: float = Field(default=1.0, gt=0)
    # Load balancing: Switch's auxiliary loss over the batch (aux_loss) or per sequence
    # (seq_aux_loss, DeepSeek-V3), weighted by aux_loss_coeff; expert_bias is DeepSeek-V3's
    # auxiliary-loss-free balancing (a per-expert bias on the routing scores, Wang et al. 2024).
    load_balancing: Literal["aux_loss", "seq_aux_loss", "none"] = "aux_loss"
    # Weight of the load-balancing loss (Megatron-LM --moe-aux-loss-coeff); unused with load_balancing none.
    aux_loss_coeff: float = Field(default=0.01, ge=0, le=100)
    # Auxiliary-loss-free balancing: a learned per-expert bias on the routing scores (DeepSeek-V3;
    # Megatron-LM --moe-router-enable-expert-bias).
    expert_bias: bool = False
    # Tokens an expert takes per batch, as a multiple of the balanced share; the rest are dropped.
    # None: dropless (every token reaches its experts; Megatron-LM's default).
    capacity_factor: float | None = Field(default=None, gt=0, le=1_000)

    @model_validator(mode="after")
    def _routing(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} is above num_experts {self.num_experts}; a token picks among them")
        if (self.groups is None) != (self.group_top_k is None):
            raise ValueError("groups and group_top_k go together (grouped top-k routing): set both or neither")
        if self.groups is not None and self.group_top_k is not None:
            if self.num_experts % self.groups:
                raise ValueError(f"groups {self.groups} does not divide num_experts {self.num_experts}")
            if self.group_top_k > self.groups:
                raise ValueError(f"group_top_k {self.group_top_k} is above groups {self.groups}")
        if self.shared_ffn_hidden_size is not None and self.shared_experts == 0:
            raise ValueError("shared_ffn_hidden_size without shared_experts: set shared_experts (1 or more)")
        if self.shared_expert_gate and self.shared_experts == 0:
            raise ValueError("shared_expert_gate without shared_experts: set shared_experts (1 or more)")
        return self

    @property
    def shared_ffn(self) -> int:
        """The shared experts' intermediate size, all together (0 without them)."""
        if self.shared_experts == 0:
            return 0
        return self.shared_ffn_hidden_size or self.shared_experts * self.ffn_hidden_size


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2, Sec. 2.1): queries through a low-rank ``q_lora_rank``
    (None: a full projection), keys and values through a shared ``kv_lora_rank`` latent, each head
    ``qk_nope_head_dim`` + ``qk_rope_head_dim`` wide for Q and K (the rotary part of K shared by the
    heads) and ``v_head_dim`` for V. Megatron-LM --multi-latent-attention and its --q-lora-rank,
    --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim."""

    model_config = FROZEN

    # Rank of the queries' low-rank compression (Megatron-LM --q-lora-rank); None: a full query projection.
    q_lora_rank: int | None = Field(default=None, gt=0, le=10_000_000)
    # Width of the latent the keys and values share (Megatron-LM --kv-lora-rank).
    kv_lora_rank: int = Field(gt=0, le=10_000_000)
    # Per-head query and key width without the rotary embedding (Megatron-LM --qk-head-dim).
    qk_nope_head_dim: int = Field(gt=0, le=100_000)
    # Per-head query and key width that carries the rotary embedding, the key's part shared by the heads
    # (Megatron-LM --qk-pos-emb-head-dim).
    qk_rope_head_dim: int = Field(gt=0, le=100_000)
    # Per-head value width (Megatron-LM --v-head-dim).
    v_head_dim: int = Field(gt=0, le=100_000)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class ModelSpec(BaseModel):
    """Decoder-only transformer architecture (Llama / GPT family), dense or mixture of experts."""

    model_config = FROZEN

    # Transformer layers (Megatron-LM --num-layers; Hugging Face's num_hidden_layers).
    num_layers: int = Field(gt=0, le=100_000)
    # Model width h: the residual stream and the embedding (Megatron-LM --hidden-size).
    hidden_size: int = Field(gt=0, le=10_000_000)
    # Intermediate size of a dense layer's MLP (Megatron-LM --ffn-hidden-size; Hugging Face's
    # intermediate_size).
    ffn_hidden_size: int = Field(gt=0, le=100_000_000)
    # Query heads per layer (Megatron-LM --num-attention-heads).
    num_attention_heads: int = Field(gt=0, le=1_000_000)
    # GQA (Ainslie et al. 2023): equal to num_attention_heads (plain MHA) when omitted.
    num_kv_heads: int | None = Field(default=None, gt=0, le=1_000_000)
    # Width of one attention head (Megatron-LM --kv-channels, Hugging Face's head_dim);
    # hidden_size / num_attention_heads when omitted. Qwen3 and GPT-OSS set their own
    # (Qwen3-30B-A3B: 32 heads x 128 on hidden 2048).
    kv_channels: int | None = Field(default=None, gt=0, le=100_000)
    # Tokens in the vocabulary: rows of the embedding and of the output layer (Megatron-LM --vocab-size).
    vocab_size: int = Field(gt=0, le=100_000_000)
    # swiglu (Shazeer 2020; Llama) and geglu (Gemma) are gated: three MLP matrices; gelu two.
    # quick_geglu is GPT-OSS's gate, x * sigmoid(1.702 x) (Megatron-LM --quick-geglu).
    activation: Literal["swiglu", "geglu", "gelu", "quick_geglu"] = "swiglu"
    # GPT-OSS clamps the gate and linear halves of its GLU to +-7 (--activation-func-clamp-value)
    # and adds 1 to the linear half (--glu-linear-offset): numerics, same shapes and work.
    activation_clamp: float | None = Field(default=None, gt=0)
    # Added to the GLU's linear half (GPT-OSS: 1; Megatron-LM --glu-linear-offset, emitted when not 0).
    glu_linear_offset: float = 0.0
    # The output layer reuses the input embedding's weights (Hugging Face's tie_word_embeddings); false
    # emits Megatron-LM --untie-embeddings-and-output-weights.
    tied_embeddings: bool = False
    # The norm before attention and MLP and at the end (Megatron-LM --normalization RMSNorm / LayerNorm).
    normalization: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    # Rotary embedding (RoPE) or a learned absolute table of max_position_embeddings rows
    # (Megatron-LM --position-embedding-type rope / learned_absolute).
    position_embedding: Literal["rope", "learned"] = "rope"
    # Biases on the linear layers (GPT-2/3 style, GPT-OSS); Llama has none.
    bias: bool = False
    # Biases on the query, key and value projections only (Qwen2; Megatron-LM --add-qkv-bias).
    qkv_bias: bool = False
    # RMSNorm on each head's query and key before RoPE (Qwen3; Megatron-LM --qk-layernorm).
    qk_norm: bool = False
    # Attention and MLP read the same input, each through its own norm, and both add to the
    # residual (GPT-J, GPT-NeoX/Pythia, Falcon 40B/180B). Same parameters and FLOPs as the
    # sequential block; the megatron runtime has no such block and refuses it.
    parallel_residual: bool = False
    # Sliding-window attention (Mistral v0.1, GPT-OSS): each query sees the last sliding_window
    # tokens. With global_attention_every N, every N-th layer (the last of each N) attends to the
    # whole sequence (GPT-OSS alternates, N = 2; Megatron-LM --window-attn-skip-freq).
    sliding_window: int | None = Field(default=None, gt=0, le=100_000_000)
    # Every N-th layer attends to the whole sequence (needs sliding_window; Megatron-LM
    # --window-attn-skip-freq); None: every layer uses the window.
    global_attention_every: int | None = Field(default=None, gt=1, le=100_000)
    # A learned logit per head that takes part in the softmax and absorbs attention (GPT-OSS's
    # attention sinks; Megatron-LM --softmax-type learnable): one parameter per head and layer.
    attention_sinks: bool = False
    # Multi-head latent attention (DeepSeek-V2/V3); None: multi-head or grouped-query attention.
    mla: MLASpec | None = None
    # Mixture-of-experts feed-forward layers; None: a dense model.
    moe: MoESpec | None = None
    # Multi-token prediction (DeepSeek-V3, Sec. 2.2): this many extra modules, each one more layer
    # (of the model's own kind) and a projection from [h; embedding] to h, predicting one more
    # token ahead; they share the embedding and the output head (Megatron-LM --mtp-num-layers).
    mtp_layers: int = Field(default=0, ge=0, le=100)
    # Longest sequence the positions cover, at least training.seq_length (Megatron-LM
    # --max-position-embeddings, seq_length when omitted); the rows of the learned position table.
    max_position_embeddings: int | None = Field(default=None, gt=0, le=100_000_000)
    # RoPE's base frequency (Megatron-LM --rotary-base; Hugging Face's rope_theta); read with rope only.
    rope_theta: float = Field(default=10000.0, gt=0)
    # The epsilon inside RMSNorm / LayerNorm (Megatron-LM --norm-epsilon, default 1e-5; Hugging
    # Face's rms_norm_eps: Llama 3 1e-5, Qwen2 1e-6). Numerics only, but loaded weights need it.
    norm_epsilon: float = Field(default=1e-5, gt=0, lt=1)
    # Standard deviation of the normal weight initialization (Megatron-LM --init-method-std; Hugging
    # Face's initializer_range).
    init_method_std: float = Field(default=0.02, gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        a, kv = self.num_attention_heads, self.kv_heads
        if self.kv_channels is None and self.mla is None and self.hidden_size % a:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {a}; "
                f"choose heads that divide the hidden size, or set kv_channels"
            )
        if self.bias and self.qkv_bias:
            raise ValueError("bias: true already puts biases on the query, key and value projections; drop qkv_bias")
        if a % kv:
            raise ValueError(
                f"num_attention_heads {a} is not divisible by num_kv_heads {kv}; "
                f"GQA needs every key/value head shared by the same number of query heads"
            )
        if self.mla is not None and (self.num_kv_heads not in (None, a) or self.kv_channels is not None):
            raise ValueError(
                "mla sets the attention's shapes itself (every head has its own key and value from the "
                "latent): drop num_kv_heads and kv_channels"
            )
        if self.global_attention_every is not None and self.sliding_window is None:
            raise ValueError("global_attention_every without sliding_window: set the window, or drop it")
        if self.moe is not None:
            k = self.moe.dense_leading_layers
            if k >= self.num_layers:
                raise ValueError(f"moe.dense_leading_layers {k} leaves no MoE layer of {self.num_layers}; lower it")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head (of the query and key with MLA, nope + rope)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @property
    def gated(self) -> bool:
        """A gated MLP (gate, up and down matrices)."""
        return self.activation in ("swiglu", "geglu", "quick_geglu")

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.num_attention_heads

    # ---- which layers are what ----

    def is_moe_layer(self, i: int) -> bool:
        """Layer i (0-based) has a MoE feed-forward (Megatron-LM's moe_layer_pattern)."""
        if self.moe is None or i < self.moe.dense_leading_layers:
            return False
        return (i - self.moe.dense_leading_layers) % self.moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_sliding_layer(self, i: int) -> bool:
        """Layer i attends within the sliding window (not every global_attention_every-th one)."""
        if self.sliding_window is None:
            return False
        n = self.global_attention_every
        return n is None or (i + 1) % n != 0

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.is_sliding_layer(i) for i in range(self.num_layers))

    # ---- parameter counts (exact for the architecture as described) ----

    @property
    def norm_params(self) -> int:
        """One norm's weights (and bias with LayerNorm)."""
        return (2 if self.normalization == "layernorm" else 1) * self.hidden_size

    @property
    def attention_params(self) -> int:
        """One layer's attention: projections, their biases, QK-norms, sinks (its input norm apart)."""
        h, a, d = self.hidden_size, self.num_attention_heads, self.head_dim
        if self.mla is not None:
            m = self.mla
            # DeepSeek-V2 Sec. 2.1 / Megatron-Core MLASelfAttention: W^DQ (h x q_lora) + its RMSNorm
            # + W^UQ (q_lora x a(nope+rope)), or one W^Q; W^DKV with the shared rope key
            # (h x (kv_lora + rope)) + its RMSNorm + W^UK, W^UV (kv_lora x a(nope + v)); W^O (a v x h).
            q = h * a * d if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * d
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + a * m.v_head_dim * h + (a * m.v_head_dim + h if self.bias else 0)
        q, kv_dim = a * d, self.kv_heads * d
        proj = h * q + 2 * h * kv_dim + q * h  # Q, K, V, output projection
        qkv_bias = q + 2 * kv_dim
        bias = qkv_bias + h if self.bias else qkv_bias if self.qkv_bias else 0
        qk_norm = 2 * d if self.qk_norm else 0  # one weight per head channel, shared by the heads
        sinks = a if self.attention_sinks else 0
        return proj + bias + qk_norm + sinks

    def mlp_params(self, f: int) -> int:
        """A (gated) MLP of intermediate size f, with its biases."""
        h = self.hidden_size
        weights = (3 if self.gated else 2) * h * f
        return weights + ((2 * f if self.gated else f) + h if self.bias else 0)

    @property
    def expert_params(self) -> int:
        """One routed expert (0 for a dense model)."""
        return 0 if self.moe is None else self.mlp_params(self.moe.ffn_hidden_size)

    @property
    def router_params(self) -> int:
        """The router's h x E weights (and GPT-OSS's bias, DeepSeek-V3's expert bias)."""
        if self.moe is None:
            return 0
        e = self.moe.num_experts
        return self.hidden_size * e + (e if self.bias else 0) + (e if self.moe.expert_bias else 0)

    @property
    def shared_expert_params(self) -> int:
        if self.moe is None or self.moe.shared_experts == 0:
            return 0
        return self.mlp_params(self.moe.shared_ffn) + (self.hidden_size if self.moe.shared_expert_gate else 0)

    @property
    def params_per_layer(self) -> int:
        """A dense layer: attention, MLP, two norms."""
        return self.attention_params + self.mlp_params(self.ffn_hidden_size) + 2 * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """A MoE layer: attention, router, every routed expert, the shared experts, two norms."""
        if self.moe is None:
            return self.params_per_layer
        return (
            self.attention_params
            + self.router_params
            + self.moe.num_experts * self.expert_params
            + self.shared_expert_params
            + 2 * self.norm_params
        )

    @property
    def moe_layer_active_params(self) -> int:
        """A MoE layer as one token sees it: top_k routed experts."""
        if self.moe is None:
            return self.params_per_layer
        return self.moe_layer_params - (self.moe.num_experts - self.moe.top_k) * self.expert_params

    @property
    def embedding_params(self) -> int:
        pos = (self.max_position_embeddings or 0) * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def output_params(self) -> int:
        """Output projection (0 when tied to the input embedding) plus the final norm."""
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) + self.norm_params

    @property
    def mtp_params(self) -> int:
        """The multi-token-prediction modules (DeepSeek-V3 Sec. 2.2, Fig. 3): each has the norms of
        its two inputs, the 2h -> h projection, one layer (MoE in a MoE model), and its own final
        norm; embedding and output head are the main model's."""
        h = self.hidden_size
        layer = self.moe_layer_params if self.moe is not None else self.params_per_layer
        return self.mtp_layers * (2 * self.norm_params + 2 * h * h + layer + self.norm_params)

    @property
    def num_params(self) -> int:
        """The main model (the MTP modules apart: ``mtp_params``)."""
        moe = self.num_moe_layers
        layers = (self.num_layers - moe) * self.params_per_layer + moe * self.moe_layer_params
        return layers + self.embedding_params + self.output_params

    @property
    def active_params(self) -> int:
        """Parameters one token passes through in the main model, embedding included (the
        convention of DeepSeek-V3's 37B, Mixtral's 12.9B and Qwen3's 3.3B)."""
        moe = self.num_moe_layers
        layers = (self.num_layers - moe) * self.params_per_layer + moe * self.moe_layer_active_params
        return layers + self.embedding_params + self.output_params


class SpecFile(BaseModel):
    """A model spec file: name, source, architecture and training settings."""

    model_config = FROZEN

    # The name reaches job names and script headers: one line, no control characters.
    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    source: str = Field(min_length=1, description="paper or config.json the numbers come from")
    # The architecture.
    model: ModelSpec
    # How to train it: sequence, batch, length, precision, optimizer, data, checkpoints.
    training: TrainingSpec
    # Extra Megatron-LM flags and ds_config.json keys merged into the generated files
    # (orchestrator.spec.overrides; render.overrides refuses those the layout sets).
    overrides: Overrides = Overrides()

    @model_validator(mode="after")
    def _moe_options(self) -> SpecFile:
        t = self.training
        set_ = [k for k in ("moe_dispatcher", "moe_overlap_ep_comm") if getattr(t, k)]
        set_ += ["moe_load_imbalance"] if t.moe_load_imbalance != 1.0 else []
        if self.model.moe is None and set_:
            raise ValueError(
                f"training.{set_[0]} applies to mixture-of-experts models and model.moe is not set: drop it"
            )
        return self

    @model_validator(mode="after")
    def _positions_cover_sequence(self) -> SpecFile:
        mpe = self.model.max_position_embeddings
        if mpe is not None and mpe < self.training.seq_length:
            # Megatron-LM's validate_args: seq_length <= max_position_embeddings.
            raise ValueError(
                f"training.seq_length {self.training.seq_length} exceeds model.max_position_embeddings "
                f"{mpe}; raise max_position_embeddings or shorten the sequence"
            )
        return self


def load_spec(path: str | Path) -> tuple[SpecFile, Loaded]:
    """Read and validate a model spec file."""
    loaded = load_yaml(Path(path))
    try:
        spec = SpecFile.model_validate(loaded.data)
    except ValidationError as e:
        raise SpecError(format_validation(e, loaded, SpecFile, "model spec")) from e
    return spec, loaded
