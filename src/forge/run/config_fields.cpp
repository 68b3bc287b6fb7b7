// The run config's key table (config_schema.h): every key's type (through its member of
// RunConfig) and documentation. Parsing, checks and printing are in config.cpp.
#include "forge/nn/model_registry.h"
#include "forge/run/config_schema.h"

namespace forge::train::detail {

// A [model] key's documentation, led by the model types that read it (nn/model_registry.h)
// unless every language model does: "llama: RMSNorm epsilon".
std::string model_doc(const std::string& key, const std::string& doc) {
  std::string readers;
  bool every_lm = true;
  for (const auto& f : nn::model_families()) {
    if (f.reads(key)) readers += (readers.empty() ? "" : ", ") + f.type;
    else if (f.is_transformer()) every_lm = false;
  }
  return every_lm ? doc : readers + ": " + doc;
}

#define FORGE_FIELD(sec, member, doc) \
  Field{#sec "." #member, #sec, #member, AnyAccessor{+[](RunConfig& c) -> auto& { return c.sec.member; }}, doc}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      FORGE_FIELD(run, name, "the run's name; its directory is <run.dir>/<run.name>"),
      FORGE_FIELD(run, dir, "the parent directory of run directories"),
      FORGE_FIELD(run, seed, "seeds model initialisation, data order and dropout (>= 0)"),
      FORGE_FIELD(run, device, "\"auto\" (cuda:0 when a GPU is visible, else cpu), \"cpu\", \"cuda\" or \"cuda:N\""),
      FORGE_FIELD(run, dtype,
                  "compute dtype of parameters and activations: \"auto\" (bf16 on a GPU, f32 on the CPU), \"f32\", "
                  "\"bf16\" or \"f16\" (16-bit: f32 master weights and moments; f16 adds dynamic loss scaling)"),
      FORGE_FIELD(run, overwrite,
                  "start afresh: remove the checkpoints and metrics an earlier run left in the run directory and "
                  "train from step 0. Without it the same command continues from the latest valid checkpoint, or "
                  "starts when there is none"),
      FORGE_FIELD(run, allow_tf32,
                  "f32 matrix products on CUDA use TF32 tensor cores (faster, relative error ~1e-3; changes results, "
                  "so it is a config key, recorded with the run; bf16/f16 runs are not affected)"),
      FORGE_FIELD(run, fp8,
                  "the linear layers' matrix products in FP8 (Note [FP8 recipes]): \"off\", \"tensorwise\", "
                  "\"rowwise\" or \"blockwise\"; the blocks' linears only (not the output head); on a GPU the FP8 "
                  "tensor cores (compute capability 8.9+; rowwise and blockwise 9.0), on the CPU an emulation (slow, "
                  "for tests; docs/fp8.md)"),
      FORGE_FIELD(run, fp8_scaling,
                  "where an FP8 cast's scale comes from (Note [FP8 delayed scaling]): \"current\" (the amax of the "
                  "tensor cast) or \"delayed\" (the largest amax of the layer's last run.fp8_amax_history casts of "
                  "that operand; run.fp8 = \"tensorwise\" only; the histories are saved in checkpoints)"),
      FORGE_FIELD(run, fp8_select,
                  "on a GPU, which linear layers' shapes run in FP8 (Note [FP8 GEMM choice]): \"measured\" (each "
                  "shape's three GEMMs timed both ways, casts included, at its first use; the faster kept and "
                  "logged) or \"all\" (every shape the FP8 GEMMs can run)"),
      FORGE_FIELD(run, fp8_amax_history,
                  "delayed FP8 scaling: how many casts of each layer and operand the amax history remembers (>= 1)"),
      FORGE_FIELD(run, attention,
                  "which CUDA attention kernels run: \"auto\" (cuDNN's fused attention where it applies, then forge's "
                  "flash kernels, then the composed GEMM path), \"flash\" (forge's flash kernels, then the composed "
                  "path) or \"composed\" (GEMMs and a fused softmax only); results differ in the last bits"),
      FORGE_FIELD(run, deterministic,
                  "CUDA attention backward without atomics, so reruns give the same gradients bit for bit (cuDNN's "
                  "deterministic algorithm, else the composed path; slower), and GEMM algorithms from cuBLASLt's "
                  "heuristic, never timed (run.gemm_tuning is ignored)"),
      FORGE_FIELD(run, gemm_tuning,
                  "\"cached\": on CUDA, time cuBLASLt's candidate algorithms for each GEMM shape once and run the "
                  "fastest, kept in the tuning cache file (FORGE_GEMM_TUNE_CACHE) for later runs; \"off\": "
                  "cuBLASLt's heuristic first choice. Another algorithm may round differently in the last bits, "
                  "so it is recorded with the run"),
      FORGE_FIELD(run, cuda_graph,
                  "on CUDA, capture the whole training step (forward, backward, gradient reduction, update) in a "
                  "CUDA graph at step 2 and replay it from then on; where a step cannot be captured (dropout, "
                  "ZeRO, a batch of another shape) it runs without the graph and the log says why"),
      FORGE_FIELD(run, time_limit,
                  "a wall-clock limit such as \"23h50m\", \"90m\" or \"1d12h\": before it runs out, checkpoint and "
                  "stop with exit code 75 (leave room for one checkpoint write); \"\" = none"),
      FORGE_FIELD(run, preempt_signal,
                  "a signal that, like SIGTERM and SIGINT, finishes the current step, checkpoints on every rank and "
                  "stops with exit code 75 (Slurm: --signal=USR1@120): \"USR1\", \"USR2\", \"HUP\" or \"\" for none"),
      FORGE_FIELD(model, type, nn::model_type_list()),
      FORGE_FIELD(model, vocab_size,
                  model_doc("vocab_size", "embedding rows; 0 = the tokenizer's vocabulary size (else >= it)")),
      FORGE_FIELD(model, block_size, model_doc("block_size", "maximum context in tokens (learned positions for GPT)")),
      FORGE_FIELD(model, n_layer, model_doc("n_layer", "transformer blocks")),
      FORGE_FIELD(model, n_head, model_doc("n_head", "attention heads (must divide n_embd / dim)")),
      FORGE_FIELD(model, n_embd, model_doc("n_embd", "the residual width")),
      FORGE_FIELD(model, dropout, model_doc("dropout", "dropout probability in [0, 1)")),
      FORGE_FIELD(model, bias, model_doc("bias", "biases in Linear and LayerNorm layers")),
      FORGE_FIELD(model, checkpoint_activations,
                  model_doc("checkpoint_activations", "re-run each block's forward in backward to save memory")),
      FORGE_FIELD(model, n_kv_head, model_doc("n_kv_head", "key/value heads for grouped-query attention; 0 = n_head")),
      FORGE_FIELD(model, dim, model_doc("dim", "the residual width")),
      FORGE_FIELD(model, ffn_hidden,
                  model_doc("ffn_hidden", "SwiGLU hidden width; 0 = 8*dim/3 rounded up to a multiple of 32")),
      FORGE_FIELD(model, rope_theta, model_doc("rope_theta", "rotary embedding base")),
      FORGE_FIELD(model, rope_scaling, model_doc("rope_scaling", "\"\" (none) or \"llama3\" (LLaMA-3.1's bands)")),
      FORGE_FIELD(model, rope_factor, model_doc("rope_factor", "llama3: the context stretch factor")),
      FORGE_FIELD(model, rope_low_freq_factor, model_doc("rope_low_freq_factor", "llama3: low-frequency band edge")),
      FORGE_FIELD(model, rope_high_freq_factor, model_doc("rope_high_freq_factor", "llama3: high-frequency band edge")),
      FORGE_FIELD(model, rope_original_context, model_doc("rope_original_context", "llama3: the pretraining context")),
      FORGE_FIELD(model, norm_eps, model_doc("norm_eps", "RMSNorm epsilon")),
      FORGE_FIELD(model, init_std, model_doc("init_std", "standard deviation of the weight init")),
      FORGE_FIELD(model, init_from, model_doc("init_from", "a Hugging Face model directory to start from (its shape, "
                                              "weights and tokenizer; docs/train.md)")),
      FORGE_FIELD(data, source,
                  "language models: \"files\" (data.files, tokenized) or \"random\" (uniform random tokens of "
                  "model.vocab_size, for benchmarks; no tokenizer, no validation)"),
      FORGE_FIELD(data, files,
                  "language models: text files, glob patterns or directories (their files, not recursive); or "
                  "token shards already encoded (forge's, llm.c's .bin, Megatron's .bin beside its .idx), trained on "
                  "as they are"),
      FORGE_FIELD(data, exclude, "glob patterns of files to skip when expanding globs and directories"),
      FORGE_FIELD(data, tokenizer,
                  "a tokenizer file: forge BPE JSON, Hugging Face tokenizer.json, tiktoken ranks or sentencepiece "
                  ".model (docs/tokenizers.md); \"\" = train one on data.files"),
      FORGE_FIELD(data, vocab_size, "vocabulary of the tokenizer trained on the fly (>= 256)"),
      FORGE_FIELD(data, val_fraction, "the last fraction of each file held out for validation, in [0, 1)"),
      FORGE_FIELD(data, val_files,
                  "validation data of their own, as data.files (text, or token shards when data.files are shards): "
                  "data.files then train whole and data.val_fraction is not used"),
      FORGE_FIELD(data, order,
                  "the training windows: \"random\" (seeded, with replacement) or \"sequential\" (in order, "
                  "non-overlapping, epoch after epoch: another trainer reading the same shards can follow it)"),
      FORGE_FIELD(data, packing,
                  "\"none\" (a window's tokens attend to every earlier token of it) or \"documents\" (attention "
                  "and positions restart after each end-of-text token: every document trains as if alone)"),
      FORGE_FIELD(data, shards_dir, "where the token shards go; \"\" = <run dir>/data"),
      FORGE_FIELD(data, text_key, "*.jsonl and *.jsonl.gz files: the key of each line's text (one document per line)"),
      FORGE_FIELD(data, eos_token,
                  "the token appended after every document (a text file is one, a .jsonl line one): \"auto\" = the "
                  "tokenizer's end-of-text token (\"<|endoftext|>\" for one trained on the fly), a special token "
                  "such as \"</s>\", or \"\" = none"),
      FORGE_FIELD(data, format,
                  "\"text\" (documents: text files, .jsonl lines of data.text_key) or \"chat\" (.jsonl lines "
                  "{\"messages\": [{\"role\", \"content\"}, ...]} rendered by data.chat_template: docs/chat.md)"),
      FORGE_FIELD(data, chat_template,
                  "chat: \"auto\" (the chat_template of the tokenizer_config.json beside data.tokenizer or in "
                  "model.init_from), a built-in template (\"chatml\", \"llama3\"), or a tokenizer_config.json or "
                  ".jinja file"),
      FORGE_FIELD(data, train_on,
                  "chat: \"assistant\" (the loss covers the assistant turns and their end-of-turn tokens only) or "
                  "\"all\" (every token)"),
      FORGE_FIELD(data, dir, "lenet: the directory of the Fashion-MNIST IDX files"),
      FORGE_FIELD(data, max_train_samples, "lenet: use the first N training images (0 = all)"),
      FORGE_FIELD(data, max_test_samples, "lenet: use the first N test images (0 = all)"),
      FORGE_FIELD(optim, name, "\"adamw\" or \"sgd\""),
      FORGE_FIELD(optim, lr, "the peak learning rate"),
      FORGE_FIELD(optim, weight_decay, "decoupled (adamw) / L2 (sgd) decay of matmul weights only"),
      FORGE_FIELD(optim, beta1, "adamw: first-moment decay, in [0, 1)"),
      FORGE_FIELD(optim, beta2, "adamw: second-moment decay, in [0, 1)"),
      FORGE_FIELD(optim, eps, "adamw: denominator epsilon (> 0)"),
      FORGE_FIELD(optim, momentum, "sgd: momentum, in [0, 1)"),
      FORGE_FIELD(optim, nesterov, "sgd: Nesterov momentum"),
      FORGE_FIELD(optim, grad_clip, "clip the global gradient norm to this (0 = no clipping)"),
      FORGE_FIELD(schedule, kind, "\"cosine\", \"linear\" or \"constant\""),
      FORGE_FIELD(schedule, warmup_steps, "linear warmup from lr/warmup_steps to lr"),
      FORGE_FIELD(schedule, min_lr, "where the decay ends, in [0, optim.lr]"),
      FORGE_FIELD(schedule, decay_steps, "the step the decay reaches min_lr (warmup included); 0 = train.steps"),
      FORGE_FIELD(train, steps, "optimizer steps (language models)"),
      FORGE_FIELD(train, batch_size,
                  "language models: sequences per optimizer step, over every data-parallel rank and micro-batch (the "
                  "global batch; each rank's micro-batch is batch_size / (dp x grad_accum)); lenet: images per step"),
      FORGE_FIELD(train, seq_len, "tokens per sequence, <= model.block_size"),
      FORGE_FIELD(train, grad_accum,
                  "micro-batches per optimizer step on each rank (each loss divided by grad_accum); divides batch_size"),
      FORGE_FIELD(train, log_every, "steps between progress lines and metrics.jsonl records"),
      FORGE_FIELD(train, max_bad_steps,
                  "consecutive steps with a non-finite loss or gradient norm (each skipped) before the run stops (>= 1)"),
      FORGE_FIELD(train, epochs, "lenet: passes over the training images"),
      FORGE_FIELD(train, eval_batch_size, "lenet: images per evaluation batch"),
      FORGE_FIELD(eval, every, "steps between validation passes (0 = only at the end)"),
      FORGE_FIELD(eval, batches, "validation batches per pass, sequential from the start (0 = all windows)"),
      FORGE_FIELD(eval, bigram_baseline,
                  "at the end, also the validation loss of an add-one-smoothed bigram model of the training tokens"),
      FORGE_FIELD(eval, tasks,
                  "multiple-choice files in the HellaSwag layout scored at every evaluation (acc, acc_norm in "
                  "metrics.jsonl; interop/evaluate.h); whole-model layouts only (dist.tp = dist.pp = 1, ZeRO <= 2)"),
      FORGE_FIELD(eval, task_examples, "the first N examples of each eval.tasks file (0 = all)"),
      FORGE_FIELD(checkpoint, every, "steps between checkpoints (0 = none by steps)"),
      FORGE_FIELD(checkpoint, interval_minutes,
                  "wall-clock minutes between checkpoints (0 = none by time): what a crash can lose at most; a "
                  "preemption signal loses nothing"),
      FORGE_FIELD(checkpoint, keep_last, "checkpoints kept in <run dir>/checkpoints (>= 1)"),
      FORGE_FIELD(checkpoint, at_end, "write a checkpoint when the run ends (false: benchmarks that need none)"),
      FORGE_FIELD(checkpoint, async,
                  "copy the state to host memory at the step boundary and write it on a thread of its own while "
                  "training goes on (false: training waits for the whole write)"),
      FORGE_FIELD(lora, rank, "LoRA: the adapters' rank r (> 0): A is (r, in), B (out, r) (docs/lora.md)"),
      FORGE_FIELD(lora, alpha, "LoRA: the adapter's output is scaled by lora.alpha / lora.rank (> 0; PEFT's lora_alpha)"),
      FORGE_FIELD(lora, dropout, "LoRA: dropout on the adapters' input while training, in [0, 1) (PEFT's lora_dropout)"),
      FORGE_FIELD(lora, targets,
                  "LoRA: the linears to adapt (empty = LoRA off; the base model is then trained whole). GPT: "
                  "\"c_attn\", \"attn.c_proj\", \"c_fc\", \"mlp.c_proj\" (\"c_proj\" = both c_proj); LLaMA: \"q\", "
                  "\"k\", \"v\", \"o\", \"gate\", \"up\", \"down\" (or HF's q_proj ... down_proj). The base is frozen: "
                  "no gradients, no optimizer state; only the adapters train"),
      FORGE_FIELD(dist, tp,
                  "tensor-parallel degree: ranks that split each layer's weights (1 = none; divides the heads, "
                  "kv-heads, FFN width and vocabulary)"),
      FORGE_FIELD(dist, sequence_parallel,
                  "dist.tp > 1: keep the norms and residuals split along the sequence (all-gather / reduce-scatter "
                  "in place of all-reduce; activation memory per GPU divided by tp)"),
      FORGE_FIELD(dist, pp, "pipeline-parallel degree: stages of consecutive blocks (1 = none; <= model.n_layer)"),
      FORGE_FIELD(dist, cp,
                  "context-parallel degree: ranks that each hold 1/cp of every sequence, attention exchanging keys "
                  "and values (1 = none; 2 x cp divides train.seq_len; GPT and LLaMA)"),
      FORGE_FIELD(dist, cp_kind,
                  "dist.cp > 1: \"ring\" (K/V blocks passed around the ranks, overlapped with attention; any head "
                  "count) or \"ulysses\" (all-to-all from sequence parts to head groups; the heads of each tp rank "
                  "divisible by cp)"),
      FORGE_FIELD(dist, pp_schedule,
                  "dist.pp > 1: \"1f1b\" (one forward one backward: at most pp micro-batches in flight per stage) or "
                  "\"gpipe\" (all forwards, then all backwards) or \"zb-h1\" (1F1B with the weight gradients "
                  "postponed into the drain) or \"interleaved\" (dist.pp_virtual_stages model chunks per rank); "
                  "train.grad_accum is the micro-batches per step"),
      FORGE_FIELD(dist, pp_layers,
                  "dist.pp > 1: the blocks of each pipeline stage, e.g. [5, 5, 4, 2] (summing to model.n_layer; "
                  "empty: balanced by forge plan's cost, the last stage lighter by the head)"),
      FORGE_FIELD(dist, pp_virtual_stages,
                  "dist.pp_schedule = \"interleaved\": model chunks per pipeline rank (>= 2; the bubble shrinks by "
                  "this factor, the point-to-point traffic grows by it)"),
      FORGE_FIELD(dist, zero_stage,
                  "data parallel (several ranks): 0 = DDP, 1 = shard the optimizer state, 2 = also the gradients, "
                  "3 = also the blocks' parameters"),
      FORGE_FIELD(dist, offload_optimizer,
                  "ZeRO-1/2/3: keep the f32 master weights and moments on the CPU and run the update there"),
      FORGE_FIELD(dist, bucket_mb, "gradient bucket size in MB for the reductions that overlap backward (> 0)"),
      FORGE_FIELD(dist, dp_reduce,
                  "the data-parallel reductions: \"flat\" (one ring over the group) or \"hierarchical\" (reduce-scatter "
                  "within each node, all-reduce across nodes over 1/node of the bytes, all-gather within the node: "
                  "for nodes joined by a slower network; docs/dist.md)"),
      FORGE_FIELD(dist, node_size,
                  "ranks per node for dist.dp_reduce = \"hierarchical\" (0 = the launcher's ranks per host; a smaller "
                  "value splits one host into simulated nodes)"),
      FORGE_FIELD(dist, link_gbps,
                  "simulated nodes (dist.node_size): the data-parallel traffic between them takes at least the time "
                  "of a link of this many Gb/s (10, 25, 100: Ethernet; 0 = off; docs/dist.md \"Several machines\")"),
      FORGE_FIELD(dist, link_latency_us, "dist.link_gbps > 0: the simulated link's latency per ring step, microseconds"),
      FORGE_FIELD(dist, grad_compression,
                  "how the data-parallel gradient reductions travel, for slow links (docs/dist.md \"Several "
                  "machines\"): \"none\" (the gradients' dtype), \"fp8\" (e4m3 blocks of 128 with error feedback: "
                  "~0.52 of bf16's bytes; any ZeRO stage, pipeline stages; with dist.dp_reduce = \"hierarchical\" "
                  "between nodes only) or \"powersgd\" (DDP only: each weight matrix's gradient averaged as a "
                  "rank-dist.powersgd_rank approximation with error feedback: far fewer bytes)"),
      FORGE_FIELD(dist, fp8_error_feedback,
                  "dist.grad_compression = \"fp8\": which reductions add what their coding left out to the next "
                  "step's (an f32 copy of the gradients per rank): \"auto\" (DDP and ZeRO-1, which hold whole "
                  "gradients anyway), \"on\" (ZeRO-2/3 too) or \"off\""),
      FORGE_FIELD(dist, powersgd_rank, "dist.grad_compression = \"powersgd\": the approximation's rank (>= 1)"),
      FORGE_FIELD(dist, powersgd_start_step,
                  "dist.grad_compression = \"powersgd\": the optimizer steps before it with plain all-reduces (>= 0; "
                  "PyTorch's start_powerSGD_iter: compression from the start slows early training)"),
      FORGE_FIELD(telemetry, tensorboard,
                  "write <run dir>/tb/events.out.tfevents.* (rank 0): every scalar of metrics.jsonl by step, for "
                  "tensorboard --logdir"),
      FORGE_FIELD(telemetry, gpu_sampling,
                  "on a GPU: NVML read every 100 ms off the training thread; each progress record gets the mean "
                  "utilisation, memory-controller utilisation and power, the lowest SM clock, the highest temperature, "
                  "the memory used and the clock-event reasons (gpu_* keys)"),
      FORGE_FIELD(telemetry, fp8_amax,
                  "with run.fp8: every progress record gets fp8_amax, each layer's largest amax since the last record "
                  "per operand (activation, weight, gradient): where a scale is heading before it overflows"),
      FORGE_FIELD(telemetry, idle_warn_pct,
                  "warn when the GPU ran no kernel for more than this percentage of a logging interval (the input "
                  "pipeline or the host kept it waiting)"),
      FORGE_FIELD(telemetry, profile_steps,
                  "\"A:B\": write <run dir>/trace.rank<r>.json, a Chrome/Perfetto trace of steps A..B (data, the "
                  "step's phases on the host and, on a GPU, on the device; NVTX ranges while tracing); \"\" = none"),
      FORGE_FIELD(debug, skip_reductions,
                  "data parallel (DDP, ZeRO-1): skip every gradient and loss reduction. The run is WRONG: a diagnostic "
                  "that measures what the rest of data parallelism costs"),
      FORGE_FIELD(debug, abort_at, "\"<rank>:<step>\": that rank aborts at the start of that step (failure tests)"),
      FORGE_FIELD(debug, hang_at,
                  "\"<rank>:<step>\": that rank stops at the start of that step without exiting (stuck-peer tests)"),
      FORGE_FIELD(debug, masters_from_rounded,
                  "16-bit runs: start AdamW's f32 master weights from the 16-bit parameters (as forge did before "
                  "2026-12 and Megatron-LM does) instead of the f32 weights they were rounded from; the first "
                  "updates below half a bf16 spacing are then lost (Note [masters from the f32 initial weights] in "
                  "src/forge/train/strategy.h). For A/B measurements"),
  };
  return table;
}

#undef FORGE_FIELD

}  // namespace forge::train::detail
