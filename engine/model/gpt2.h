// The GPT-2 model of docs/model.md on one rank: parameter layout, deterministic
// initialisation, forward with saved activations, and backward into flat gradients.
// The step reads in execution order (llm.c style) and calls the device-generic ops of
// engine/ops/ops.h, so the same model runs on cpu and cuda (GPT2Config::device).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/core/element_type.h"
#include "engine/core/tensor.h"

namespace meshrun {

// Activation checkpointing (docs/parallelism.md): what a block keeps from its forward for its
// backward. kSelective keeps the GEMM outputs (q, k, v, c_fc) and the residual stream and
// recomputes the LayerNorms, the attention core and GELU; kFull keeps only the block's input
// and recomputes the whole block (its tp and cp collectives included).
enum class Recompute { kNone, kSelective, kFull };

// The architecture of a model (docs/model.md): a family of the registry (common/architecture.h),
// whose description (norm, MLP, positions, biases, embedding scale, head width) the step reads.
using Arch = ModelArch;

// Llama 3's frequency-dependent rescaling of the rotary frequencies (rope_scaling type llama3).
struct RopeScaling {
  bool llama3 = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

struct GPT2Config {
  Arch arch = Arch::kGpt2;
  int vocab_size = 256;
  int n_layer = 2;
  int n_head = 4;
  int n_kv_head = 4;  // grouped-query attention (families with grouped_query; else n_head)
  int d_model = 64;
  int d_ff = 256;  // the MLP's width (families with grouped_query; else 4·d_model)
  // The width of one head (families with free_head_dim; q/k/v/o are n_head·head_dim wide);
  // 0: d_model/n_head.
  int attn_head_dim = 0;
  int max_seq_len = 64;  // rows of the position embedding (n_positions; gpt2 only)
  double ln_eps = 1e-5;  // LayerNorm / RMSNorm epsilon
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_embeddings = true;   // the head reads the token embedding (else its own lm_head)
  bool attention_bias = false;  // llama: biases on q, k and v (Qwen2); gpt2 always has biases
  // Sliding-window attention on every layer: query i sees keys i − W < j ≤ i; 0: none.
  int sliding_window = 0;
  // Tensor parallel: this rank holds 1/tp_size of the heads, MLP units and vocabulary rows.
  int tp_size = 1;
  int tp_rank = 0;
  // FSDP: each unit's flat parameters are padded to a multiple of fsdp_size (= S·C) so that
  // every rank of the dp_shard_cp group holds an equal slice.
  int fsdp_size = 1;
  Recompute recompute = Recompute::kNone;
  // Where the parameters, gradients and activations live; every op runs there (engine/ops).
  Device device;
  // Pipeline parallelism (docs/parallelism.md "Pipeline parallelism"): the global layers this
  // rank holds as [begin, end) ranges, one per model chunk in pipeline order (interleaved 1F1B
  // gives a rank several; empty: one chunk of every layer); the embedding when stage_first (with
  // the first chunk), the final norm, head and loss when stage_last (with the last chunk). A last
  // stage of a tied model also holds the embedding unit (its table is the head; decision 0054).
  // Parameter names keep their global layer index, so checkpoints do not depend on the split.
  std::vector<std::pair<int, int>> chunks;
  bool stage_first = true;
  bool stage_last = true;
  bool operator==(const GPT2Config&) const = default;

  int num_chunks() const { return chunks.empty() ? 1 : static_cast<int>(chunks.size()); }
  // The rank's layers, all chunks: local layer l is global layer GlobalLayer(l).
  int stage_layers() const {
    int n = chunks.empty() ? n_layer : 0;
    for (const auto& [b, e] : chunks) n += e - b;
    return n;
  }
  int GlobalLayer(int local) const {
    for (const auto& [b, e] : chunks) {
      if (local < e - b) return b + local;
      local -= e - b;
    }
    return local;
  }
  // Chunk k's local layers [first, second).
  std::pair<int, int> ChunkLocalLayers(int k) const {
    if (chunks.empty()) return {0, n_layer};
    int first = 0;
    for (int i = 0; i < k; ++i) first += chunks[i].second - chunks[i].first;
    return {first, first + chunks[k].second - chunks[k].first};
  }
  // Whether this stage holds the embedding unit (unit 0): the first stage, and a tied last one.
  bool holds_embedding() const { return stage_first || (stage_last && tie_embeddings); }
  // The same config as one whole model (every layer, embedding and head on one rank).
  GPT2Config WholeModel() const {
    GPT2Config c = *this;
    c.chunks.clear();
    c.stage_first = c.stage_last = true;
    return c;
  }

  // The family's description (the registry's).
  const Architecture& family() const { return ArchitectureOf(arch); }
  // The Llama layout of parameter names (embed_tokens, layers.N.*, norm): Llama and Gemma.
  bool llama() const { return family().names == ParamNames::kLlama; }
  int head_dim() const { return attn_head_dim > 0 ? attn_head_dim : d_model / n_head; }
  int kv_heads() const { return family().grouped_query ? n_kv_head : n_head; }
  int ff() const { return family().mlp == MlpKind::kGelu ? 4 * d_model : d_ff; }  // MLP units
  bool gated_mlp() const { return family().mlp != MlpKind::kGelu; }  // fc output: gate|up
  // This tp rank's vocabulary rows [vocab_first(), vocab_first() + vocab_rows()): ⌈V/T⌉ each,
  // fewer on the last rank.
  int64_t vocab_first() const;
  int64_t vocab_rows() const;
};

// The single-rank model of a job's `model:` section (tp 1, no FSDP padding, no recompute): the
// one place that maps the spec's fields to the model's.
GPT2Config GPT2ConfigOf(const ModelSpec& model);

// A hyper-rectangle of a global tensor: [offset, offset + shape).
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
};

// One parameter tensor, as this tp rank holds it: `offset` places it in the flat layout (the
// own-storage buffer; under FSDP, its unit's gathered buffer at offset − unit offset).
// What a parameter is to the transformer, whatever the architecture names it (GPT-2's
// "h.3.mlp.c_fc.weight" and Llama's "layers.3.mlp.gate_up.weight" are both kUpWeight of layer
// 3). The layout (GPT2ParamLayout) gives every parameter its role; the model resolves its
// parameters by role once, at construction (GPT2::ParamHandles), and never by name.
enum class ParamRole {
  kTokenEmbedding,
  kPositionEmbedding,
  kNorm1Weight,  // the norm before attention
  kNorm1Bias,
  kQkvWeight,  // the fused q|k|v projection
  kQkvBias,
  kOutWeight,  // attention's output projection
  kOutBias,
  kNorm2Weight,  // the norm before the MLP
  kNorm2Bias,
  kUpWeight,  // the MLP's first projection (fused gate|up when gated)
  kUpBias,
  kDownWeight,  // the MLP's second projection
  kDownBias,
  kFinalNormWeight,
  kFinalNormBias,
  kHead,  // the untied head (tied: the token embedding is the head)
  kCount
};

// Tensor parallelism's plan (Megatron; docs/model.md "Tensor parallel"): how each role's
// parameter is split over the tp ranks. The layout cuts each parameter by it (GPT2ParamLayout)
// and the model sums over tp where it says (GPT2::TpAfterMatmul and the two beside it); the
// math itself names no split.
enum class TpSplit {
  kReplicated,  // whole on every rank (norms, positions, the biases added after a sum)
  kColumn,      // output rows: each fused part (q|k|v, gate|up) by heads or units; a matmul's
                // input gradient is a partial sum
  kRow,         // input columns, matching a column split before it; a matmul's output is a
                // partial sum
  kVocab,       // vocabulary rows (token table, head): a lookup's output and the head's input
                // gradient are partial sums
};
TpSplit TpSplitOf(ParamRole role);

struct ParamInfo {
  std::string name;  // e.g. "h.0.attn.c_attn.weight" (docs/model.md)
  ParamRole role = ParamRole::kTokenEmbedding;
  int layer = -1;                     // the stage's local layer index; -1 outside the blocks
  std::vector<int64_t> shape;         // local shape; PyTorch layout, Linear weights (out, in)
  std::vector<int64_t> global_shape;  // the whole tensor
  // The boxes of the global tensor this rank holds; the local tensor is their row-major
  // concatenation along dim 0 (c_attn's q, k and v rows are three boxes under tp).
  std::vector<Box> boxes;
  int64_t offset = 0;  // element offset in the flat buffer
  int64_t numel = 0;
  bool decay = false;       // weight decay applies (2+ dims)
  bool tp_sharded = false;  // false: replicated over tp
  int unit = 0;             // FSDP unit: 0 embeddings, 1..L layers, L+1 final LN
  double init_std = 0.0;    // N(0, init_std); 0 → constant init_value
  double init_value = 0.0;
};

// An FSDP unit: a contiguous run of parameters, padded to a multiple of fsdp_size.
struct UnitInfo {
  int64_t offset = 0;  // first element in the flat buffer
  int64_t padded = 0;  // elements including padding
};

// The parameters of the model in their fixed order (the order of the reference script), with
// this tp rank's local shapes and per-unit padding.
std::vector<ParamInfo> GPT2ParamLayout(const GPT2Config& cfg);
std::vector<UnitInfo> GPT2Units(const GPT2Config& cfg, const std::vector<ParamInfo>& layout);

// The global row-major index of local element i of p (used by initialisation).
int64_t GlobalIndex(const ParamInfo& p, int64_t i);

class Communicator;

// FSDP's hooks into the step, called by a model that does not own its parameters (see
// GPT2::BindUnit). Forward: BeforeForward(u) before unit u's parameters are read, AfterForward(u)
// after a block's forward (not for the embedding and final units, which are used again by the
// head and the backward). Backward: BeforeBackward(u) before unit u's parameters and gradients
// are used (units 0 and L+1 first, then each block), AfterBackward(u) once its gradients for
// this micro-batch are complete. Implemented by ShardedState (engine/train/sharding.h).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual Status BeforeForward(int unit) = 0;
  virtual Status AfterForward(int unit) = 0;
  virtual Status BeforeBackward(int unit) = 0;
  virtual Status AfterBackward(int unit) = 0;
  // Zero-bubble's split backward of a block (decision 0059): the input-gradient pass (B) reads
  // the unit's parameters and writes no gradient (BeforeInputGrad … AfterInputGrad); the
  // weight-gradient pass (W) writes its gradients and reads no parameter (BeforeWeightGrad …
  // AfterWeightGrad, which ends the unit's gradients for that micro-batch as AfterBackward does).
  virtual Status BeforeInputGrad(int unit) = 0;
  virtual Status AfterInputGrad(int unit) = 0;
  virtual Status BeforeWeightGrad(int unit) = 0;
  virtual Status AfterWeightGrad(int unit) = 0;
};

// The collectives the model issues itself (tensor and context parallel) and the FSDP hooks.
// Null members: that parallelism is off. Used only by GPT2<float>.
struct ModelParallel {
  Communicator* tp = nullptr;
  Communicator* cp = nullptr;
  bool cp_ring = false;  // cp_comm_strategy: ring (else allgather)
  UnitHooks* fsdp = nullptr;
};

// Document masking (data.attention: document): for each token of B sequences of T tokens, the
// position in its sequence where its document starts. The end-of-text token `eot` is the last
// token of the document it ends; the token after it starts the next one at position 0 of that
// document. A sequence's first tokens belong to a document that started before it: position 0.
void DocumentStarts(const int32_t* inputs, int B, int T, int32_t eot, int32_t* starts);

// Rows of logits the head computes at once for `tokens` rows of a vocabulary of `vocab`:
// all of them up to 2^23 floats (32 MiB), fewer beyond (the logits of GPT-2 at 1,024 tokens are
// 200 MiB otherwise).
int64_t HeadChunkRows(int64_t tokens, int64_t vocab);

// Model FLOPs per token of docs/model.md: 6·N + 12·n_layer·d_model·seq_len, where N is the
// parameter count without the position embedding.
double GPT2FlopsPerToken(const GPT2Config& cfg, int seq_len);

// The value of element `index` of parameter `name` at initialisation: depends only on
// (seed, name, index), so every mesh starts from the same model.
double InitNormal(uint64_t seed, const std::string& name, int64_t index);

// A GPT-2 whose parameters and gradients are read through one buffer per FSDP unit. With
// own_storage (one rank, tp, dp_replicate) it owns flat buffers of num_params() elements and
// every unit points into them; without (FSDP) it owns none, and the UnitHooks bind each unit's
// transient buffers (BindUnit) while it is in use. Owns its activations. Not thread-safe (one
// per rank; kernels are parallel inside).
template <typename T>
class GPT2 {
 public:
  explicit GPT2(GPT2Config cfg, bool own_storage = true);

  const GPT2Config& config() const { return cfg_; }
  const std::vector<ParamInfo>& params() const { return layout_; }
  // By name, a linear scan (checkpoints, tests); the model's own reads go through handles.
  const ParamInfo* FindParam(const std::string& name) const;
  int64_t num_params() const { return num_params_; }
  bool owns_storage() const { return params_.defined(); }
  // The flat buffers (own_storage only; null otherwise).
  T* params_data() { return owns_storage() ? params_.template data<T>() : nullptr; }
  T* grads_data() { return owns_storage() ? grads_.template data<T>() : nullptr; }
  // p's elements in its unit's current buffers.
  T* param(const ParamInfo& p) { return unit_params_[p.unit] + (p.offset - units_[p.unit].offset); }
  T* grad(const ParamInfo& p) { return unit_grads_[p.unit] + (p.offset - units_[p.unit].offset); }
  // Unit u's current parameter buffer (null while it is not gathered).
  const T* unit_params(int unit) const { return unit_params_[unit]; }
  const T* unit_grads(int unit) const { return unit_grads_[unit]; }
  // Points unit u at `params` and `grads` (units()[u].padded elements each; null: none now).
  void BindUnit(int unit, T* params, T* grads) {
    unit_params_[unit] = params;
    unit_grads_[unit] = grads;
  }

  const std::vector<UnitInfo>& units() const { return units_; }

  // Element i of every parameter from InitNormal(seed, name, global index of i).
  void InitDeterministic(uint64_t seed);
  // Zeroes the flat gradients (own_storage; otherwise the hooks own the gradients).
  void ZeroGrad();
  // Tensor/context parallel communicators and FSDP hooks (float only); null: single rank.
  void SetParallel(const ModelParallel* parallel) { par_ = parallel; }
  // Document masking (data.attention: document) for the NEXT forward only: for each of its B·L
  // tokens, the global position where the token's document starts (DocumentStarts). Queries
  // then see only keys of their own document, and positions (learned or rotary) count from
  // the document's start. Not called: one document per sequence.
  void SetDocumentStarts(std::vector<int32_t> starts) { doc_starts_ = std::move(starts); }

  // Forward of B sequences of L tokens each (inputs: B·L token ids). positions: the global
  // position of each of the L tokens (the same for every sequence; context parallel passes
  // its two chunks); null: 0..L-1. Keeps the activations and the whole logits (B·L·V), which
  // training and ForwardLoss never hold at once (they compute the head in chunks of rows).
  Status Forward(const int32_t* inputs, int B, int seq_len, const int32_t* positions = nullptr);
  // On the model's device.
  const T* logits() const { return logits_.template data<T>(); }

  // Forward, loss and backward of one micro-batch. Returns the SUM of per-token losses; the
  // gradients receive grad_scale·∂(sum of losses) (grad_scale = 1/tokens of the global batch
  // gives the gradient of the mean loss). Gradients accumulate across calls.
  StatusOr<double> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B,
                                   int seq_len, double grad_scale,
                                   const int32_t* positions = nullptr);

  // Sum of per-token losses of a batch without touching gradients.
  StatusOr<double> ForwardLoss(const int32_t* inputs, const int32_t* targets, int B, int seq_len,
                               const int32_t* positions = nullptr);

  // Pipeline stages (config().stage_first/stage_last). `inputs` are the micro-batch's token ids
  // (every stage has them: positions and document masks come from them); `stage_input` is the
  // previous stage's output, B·seq_len·d_model on the device (null on the first stage).
  // StageForward runs the stage's layers without a backward and leaves their output in
  // stage_output() (not on the last stage, whose forward is its loss: ForwardLoss).
  // keep_key ≥ 0 (no activation checkpointing; decision 0066): the micro-batch's activations
  // (the chunk's layers and its input) are kept under that key until the backward that names
  // it (kept_key below), which then runs from them instead of running the forward again.
  // stage_output() stays valid until that backward.
  Status StageForward(const int32_t* inputs, const T* stage_input, int B, int seq_len,
                      const int32_t* positions = nullptr, int keep_key = -1);
  // Which of the rank's model chunks the Stage* calls run (0 … config().num_chunks() − 1).
  void SetActiveChunk(int chunk) { chunk_ = chunk; }
  const T* stage_output() const;
  // Forward and backward of the stage: the last from its loss over `targets` (returns the sum
  // of per-token losses, as ForwardBackward), the others from `output_grad` (the gradient of
  // their output, returning 0). Leaves the gradient of the stage's input in stage_input_grad()
  // (not on the first stage). Gradients accumulate across calls.
  // kept_key ≥ 0: the forward kept under that key by StageForward (same chunk, same tokens:
  // they give the backward its positions, masks and the embedding's rows) is not run again.
  StatusOr<double> StageForwardBackward(const int32_t* inputs, const T* stage_input,
                                        const int32_t* targets, const T* output_grad, int B,
                                        int seq_len, double grad_scale,
                                        const int32_t* positions = nullptr, int kept_key = -1);
  const T* stage_input_grad() const { return dres_.template data<T>(); }
  // Zero-bubble's split backward (decision 0059). StageBackwardInput is StageForwardBackward
  // with each block's weight gradients deferred: it computes the gradients of the stage's input
  // (every block's input-gradient path, tp all-reduces, norms, attention, cp), and the gradients
  // of the embedding, the final norm and the head; for each block it stashes, under `key` (one
  // per pending micro-batch and chunk), what the block's weight gradients need: each linear
  // layer's input and output gradient, and its norms' weight (and bias) gradients.
  // StageBackwardWeight(key) computes those blocks' weight and bias gradients from the stash,
  // adds the norms', and frees the stash. At most set_weight_stash_limit() stashes exist at once
  // (FAILED_PRECONDITION beyond).
  StatusOr<double> StageBackwardInput(int key, const int32_t* inputs, const T* stage_input,
                                      const int32_t* targets, const T* output_grad, int B,
                                      int seq_len, double grad_scale,
                                      const int32_t* positions = nullptr, int kept_key = -1);
  Status StageBackwardWeight(int key);
  void set_weight_stash_limit(int stashes) { stash_limit_ = stashes; }
  int pending_weight_stashes() const { return static_cast<int>(stashes_.size()); }
  // Elements of one stash of the active chunk for B·seq_len tokens (all its layers; see
  // LayerStashLayout): the memory a pending micro-batch holds between its B and its W.
  int64_t WeightStashNumel(int B, int seq_len) const;
  // Forwards kept (StageForward's keep_key) whose backward has not run yet.
  int kept_forwards() const { return static_cast<int>(kept_.size()); }
  // Pipeline stages: the stage's forward for a loss-only pass (evaluation) on a last stage.
  StatusOr<double> StageForwardLoss(const int32_t* inputs, const T* stage_input,
                                    const int32_t* targets, int B, int seq_len,
                                    const int32_t* positions = nullptr);

 private:
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, q, k, v, att, lse, atty, res2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu, res3;
    Tensor k_all, v_all;  // context parallel (allgather): K and V of the whole sequence
  };
  void EnsureActivations(int B, int seq_len);
  // What a forward leaves on the device for its backward besides the activations: token ids,
  // positions, masks, rotary tables, cp positions (EnsureActivations first; consumes the
  // document starts). ForwardTrunk's first part; a kept forward's backward runs it again.
  Status PrepareBatch(const int32_t* inputs, int B, int seq_len, const int32_t* positions);
  // Embedding, blocks and the final LayerNorm (everything but the head); on a pipeline stage
  // its part: from stage_input (not the first stage) through its layers (and the final norm on
  // the last).
  Status ForwardTrunk(const int32_t* inputs, int B, int seq_len, const int32_t* positions,
                      const T* stage_input = nullptr);
  // The head and cross-entropy over HeadChunkRows rows at a time; with_grad also leaves the
  // gradient of the final LayerNorm's output in dln_ and adds the head's to wte's gradient.
  StatusOr<double> HeadLoss(const int32_t* targets, bool with_grad, double grad_scale);
  // The backward from the final LayerNorm down (after HeadLoss with_grad); on a stage that is
  // not the last, from output_grad.
  Status Backward(const T* output_grad = nullptr);
  // Whether unit u holds parameters on this stage (hooks are called only for those).
  bool UnitUsed(int u) const { return units_[u].padded > 0; }
  // The active chunk: its local layers, and whether it is the model's first / last chunk (then
  // it runs the embedding / the final norm and head), and whether it reads the embedding unit.
  std::pair<int, int> ChunkLayers() const { return cfg_.ChunkLocalLayers(chunk_); }
  bool ChunkFirst() const { return cfg_.stage_first && chunk_ == 0; }
  bool ChunkLast() const { return cfg_.stage_last && chunk_ == cfg_.num_chunks() - 1; }
  bool ChunkUsesEmbedding() const {
    return UnitUsed(0) && (ChunkFirst() || (ChunkLast() && cfg_.tie_embeddings));
  }
  int chunk_ = 0;  // SetActiveChunk
  // One block's forward from its input `residual` into acts_[l]; its backward from dres_
  // (the gradient of its output), leaving the gradient of its input in dres_.
  Status BlockForward(int l, const T* residual);
  Status BlockBackward(int l, const T* residual);
  // Zero-bubble's split of BlockBackward (decision 0059): the input gradient into dres_, with
  // what the weight gradients need written to `stash` (one layer's, LayerStashLayout); then,
  // later, the weight and bias gradients of N tokens from it.
  Status BlockBackwardInput(int l, const T* residual, T* stash);
  Status BlockBackwardWeight(int l, int64_t N, const T* stash);
  // One layer's stash for N tokens, as element offsets: each linear layer's input and output
  // gradient (attention qkv: ln1 and dqkv; output projection: atty and d(its output); MLP fc
  // (gate|up): ln2 and d(its output); proj (down): the activation and d(its output)), then the
  // norms' parameter gradients (gpt2: ln_1 weight, bias, ln_2 weight, bias; llama: the two
  // RMSNorm weights), C each.
  struct LayerStash {
    int64_t ln1 = 0, dqkv = 0, atty = 0, dattn = 0, ln2 = 0, dfc = 0, act = 0, dmlp = 0, norms = 0;
    int64_t numel = 0;
  };
  LayerStash LayerStashLayout(int64_t N) const;
  // What activation checkpointing dropped from acts_[l], computed again before its backward.
  Status RecomputeBlock(int l, const T* residual);
  // Attention of one layer over local queries and (under cp) every rank's keys; split_qkv
  // first splits qkv_ into a.q, a.k, a.v (false: they are kept from the forward).
  Status AttentionForward(LayerActs& a, bool split_qkv = true);
  // The merged q, k, v gradient goes to dqkv (dqkv_, or zero-bubble's stash).
  Status AttentionBackward(LayerActs& a, T* dqkv);
  // Sum over the tp group.
  Status TpAllReduce(T* data, int64_t count);
  // Where the plan (TpSplitOf) makes a result a partial sum, its sum over tp: a matmul's output
  // by the weight of role r (row split), its input gradient (column and vocabulary splits),
  // and a lookup in the table of role r (vocabulary split). Elsewhere nothing.
  Status TpAfterMatmul(ParamRole r, T* out, int64_t count);
  Status TpAfterMatmulInputGrad(ParamRole r, T* dinp, int64_t count);
  Status TpAfterLookup(ParamRole r, T* out, int64_t count);
  // The UnitHooks call Hook makes (gpt2.cc).
  enum HookKind {
    kBeforeForward,
    kAfterForward,
    kBeforeBackward,
    kAfterBackward,
    kBeforeInputGrad,
    kAfterInputGrad,
    kBeforeWeightGrad,
    kAfterWeightGrad
  };
  Status Hook(int which, int unit);
  // Columns of the fused q|k|v output on this rank: (heads + 2·kv heads) · head_dim.
  int64_t QkvWidth() const {
    return int64_t{cfg_.n_head / cfg_.tp_size + 2 * (cfg_.kv_heads() / cfg_.tp_size)} *
           cfg_.head_dim();
  }
  // Columns of q (and of the attention output before o_proj) on this rank: heads · head_dim.
  int64_t AttnWidth() const { return int64_t{cfg_.n_head / cfg_.tp_size} * cfg_.head_dim(); }
  // The weight a norm multiplies by: `w` itself, or 1 + w in norm_weight_ for the (1 + w)
  // RMSNorm (its gradient is w's).
  StatusOr<const T*> NormWeight(const T* w);
  // A norm of the family's kind over N rows of d_model: layer l's before attention (which 1)
  // or the MLP (2), or (l = −1) the final norm.
  Status NormForwardOp(T* out, T* mean, T* rstd, const T* inp, int l, int which);
  Status NormBackwardOp(T* dinp, const T* dout, const T* inp, const T* mean, const T* rstd, int l,
                        int which, T* dweight = nullptr, T* dbias = nullptr);
  // The roles of that norm's weight and bias.
  static std::pair<ParamRole, ParamRole> NormRoles(int l, int which);
  // The gated MLP's activation (SwiGLU or GeGLU) of fc's gate|up rows, forward and backward.
  Status GatedForward(T* out, const T* gate_up, int64_t N, int64_t F);
  Status GatedBackward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t F);
  // The rotary cos/sin tables of this forward's positions (llama), on the device.
  Status PrepareRope();
  // Rotary embedding of x (B, heads, T_, D) in place, or its backward (llama).
  Status Rope(T* x, bool backward);
  // Context parallel: the global positions of every cp rank's tokens (cp_positions_, n·T_) and
  // of the gathered keys, on the device.
  Status PrepareCpPositions();
  // Copies n host ids into dst on the model's device (grown as needed).
  Status Upload(Tensor& dst, const int32_t* host, int64_t n);
  const int32_t* tokens_data() const { return tokens_.template data<int32_t>(); }
  const int32_t* positions_data() const { return positions_.template data<int32_t>(); }
  // Layer l's norm before attention (which 1) or the MLP (2): LayerNorm or RMSNorm by arch.
  Status Norm(int l, int which, LayerActs& a, const T* inp);
  // The parameter gradients go to the model's gradients, or (zero-bubble's B) to dweight and
  // dbias when given (dbias: LayerNorm only).
  Status NormBackward(int l, int which, LayerActs& a, const T* inp, T* dinp, const T* dout,
                      T* dweight = nullptr, T* dbias = nullptr);

  // The parameters of one layer (or of the embedding and final units) by role, resolved from
  // the layout at construction; null where the architecture has none (a bias-free Llama).
  struct ParamHandles {
    std::array<const ParamInfo*, static_cast<size_t>(ParamRole::kCount)> of{};
    const ParamInfo* operator[](ParamRole r) const { return of[static_cast<size_t>(r)]; }
  };
  // Parameter (weights) or gradient of role r of local layer l (−1: the embedding and final
  // units'); one the architecture lacks is null.
  const T* W(int l, ParamRole r) {
    const ParamInfo* p = Handles(l)[r];
    return p != nullptr ? param(*p) : nullptr;
  }
  T* Grad(int l, ParamRole r) {
    const ParamInfo* p = Handles(l)[r];
    return p != nullptr ? grad(*p) : nullptr;
  }
  const ParamHandles& Handles(int l) const {
    return l < 0 ? outer_handles_ : layer_handles_[static_cast<size_t>(l)];
  }
  // The head's weight: the token embedding when tied.
  const ParamInfo& HeadParam() const;

  GPT2Config cfg_;
  std::vector<ParamInfo> layout_;
  std::vector<UnitInfo> units_;
  ParamHandles outer_handles_;               // embedding, positions, final norm, head
  std::vector<ParamHandles> layer_handles_;  // per local layer
  const ModelParallel* par_ = nullptr;
  std::vector<T> rope_host_;  // [cos | sin], (T_, head_dim/2) each, this forward's positions
  Tensor rope_;               // the same on the device
  Tensor head_stats_, head_all_stats_, head_lse_;  // vocab-parallel cross-entropy
  Tensor cp_positions_;  // cp: rank j's global positions at j·T_ (the gathered keys' order)
  Tensor cp_send_, cp_recv_, cp_kv_, cp_dkv_;  // cp scratch
  int64_t num_params_ = 0;
  Tensor params_, grads_;                     // own_storage only
  std::vector<T*> unit_params_, unit_grads_;  // per unit: its current buffers

  int B_ = 0, T_ = 0, capacity_tokens_ = 0;
  std::vector<int32_t> seq_positions_;  // positions of one sequence's local tokens (host)
  std::vector<int32_t> doc_starts_;     // SetDocumentStarts, consumed by the next forward
  // Per row (B·T_), on the device: the first key position each query sees (sliding window and
  // document start); undefined when neither applies. Every row's own position for rotary
  // embeddings (document masking: from its document's start); empty: seq_positions_.
  Tensor q_lo_;
  bool has_q_lo_ = false;
  bool row_rope_ = false;  // rope_ holds one table per row (B·T_) rather than per position
  std::vector<int32_t> row_positions_;
  // On the device: this batch's token ids, every row's position, one sequence's positions, and
  // the targets of the loss.
  Tensor tokens_, positions_, seq_positions_dev_, targets_;
  Tensor encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  Tensor norm_weight_;           // 1 + w of the (1 + w) RMSNorm being run (d_model)
  Tensor head_logits_;           // one chunk of the head's logits (then its dlogits)
  int64_t head_rows_ = 0;        // rows per chunk
  std::vector<LayerActs> acts_;  // per layer; what recompute drops are views of work_'s
  // A kept forward (decision 0066): one chunk's layer activations and its input (encoded_),
  // moved out of acts_ and encoded_ after the forward and swapped back in for the backward.
  // The chunk's layers stay without activations in between until a forward of it needs some
  // (EnsureChunkActivations: a set a backward freed, layers_free_, else new tensors); the
  // input is replaced at once (encoded_free_, shared by the chunks).
  struct KeptForward {
    int key = -1;
    int chunk = 0;
    std::vector<LayerActs> layers;
    Tensor encoded;
  };
  Status EnsureChunkActivations();
  std::vector<KeptForward> kept_;
  std::vector<std::vector<std::vector<LayerActs>>> layers_free_;  // per chunk: free layer sets
  std::vector<Tensor> encoded_free_;
  const T* kept_output_ = nullptr;  // the last kept forward's output (stage_output())
  LayerActs work_;                  // under recompute: the dropped tensors of one layer
  // Backward scratch.
  Tensor dres_, dln_, dqkv_, dq_, dk_, dv_, datt_, datty_, dfch_, dfch_gelu_, qkv_;
  // Zero-bubble's weight-gradient stashes, one per pending (micro-batch, chunk) `key`, freed by
  // its W; stash_ is the one the running B fills (null: an unsplit backward).
  struct WeightStash {
    int key = 0;
    int chunk = 0;
    int64_t tokens = 0;
    Tensor data;
  };
  std::vector<WeightStash> stashes_;
  std::vector<Tensor> stash_free_;  // stashes whose W ran, kept for the next B
  int stash_limit_ = 0;
  T* stash_ = nullptr;
};

// Instantiated for float in meshrun_model; GPT2<double> exists only in the test-only float64 twin
// (meshrun_model_float64) that the finite-difference gradient test links (decision 0067).
extern template class GPT2<float>;
extern template class GPT2<double>;

}  // namespace meshrun
