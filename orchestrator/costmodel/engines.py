"""What the training engines allocate and run that the cost model counts, as dsorch configures
them: DeepSpeed's ZeRO buckets (which dsorch writes into ds_config.json), Megatron-LM's DDP
buckets, and the optimizer step's memory traffic."""

# DeepSpeed ZeRO-1/2 communication buckets, in elements; dsorch writes these into ds_config.json.
# (DeepSpeed's default is 5e8 elements, 1 GB each in bf16; 2e8 keeps the buffers at 400 MB.)
ZERO_BUCKET_ELEMENTS = 200_000_000
# DeepSpeed ZeRO-3 keeps at most this many gathered parameters alive (stage3_max_live_parameters).
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
# Megatron-LM's DDP bucket (core/distributed/distributed_data_parallel.py: bucket_size default
# max(40M, 1M x dp) elements, "so that the per-rank chunk is large enough"); only its count of
# collectives (latency) matters here.
MEGATRON_BUCKET_ELEMENTS = 40_000_000
MEGATRON_BUCKET_PER_DP = 1_000_000
# Adam step per parameter: read fp32 master, momentum, variance, fp32 gradient (16 B), write the
# first three (12 B) and the 16-bit weight copy (2 B); plus the gradient norm and unscale reads.
OPTIMIZER_BYTES_PER_PARAM = 34.0
