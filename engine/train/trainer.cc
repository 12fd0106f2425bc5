// The training loop of one rank, in execution order. The parallel plans are applied in one
// order, written here once: tensor parallel (the model's layout and its tp all-reduces),
// context parallel (this rank's chunks of each sequence, attention over all ranks' keys),
// FSDP over dp_shard_cp and replication over dp_replicate (ShardedState).
#include "engine/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/mfu.h"
#include "engine/comm/communicator.h"
#include "engine/data/instruction.h"
#include "engine/data/tokenizer.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/ops/ops.h"
#include "engine/train/device.h"
#include "engine/train/pipeline.h"
#include "engine/train/update.h"

namespace meshrun {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// data.attention: document: the id that ends a document, the tokenizer's end-of-text token
// (data.tokenizer), else the eos_token_id of model.init_from's config.json.
StatusOr<int32_t> DocumentEndOf(const JobSpec& spec) {
  const std::string hint =
      " (hint: set data.tokenizer to the tokenizer folder that made the data, or use "
      "data.attention: causal)";
  if (!spec.data.tokenizer.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tok,
                             Tokenizer::Load(spec.data.tokenizer));
    if (tok->end_of_text_id() < 0) {
      return InvalidArgumentError("data.attention: 'document' needs an end-of-text token, and " +
                                  spec.data.tokenizer + " has none" + hint);
    }
    return tok->end_of_text_id();
  }
  if (!spec.model.init_from.empty()) {
    const int32_t eos = HuggingFaceEosId(spec.model.init_from);
    if (eos >= 0) return eos;
  }
  return InvalidArgumentError(
      "data.attention: 'document' needs the end-of-text token that separates documents, and "
      "the job names no tokenizer (and no model.init_from with an eos_token_id)" +
      hint);
}

// data.attention: document (docs/data.md "Documents"): for the T input tokens of the window
// that starts at token `begin` of `stream`, the index in the window where each token's document
// starts. Data with flags (instruction data, token files with a .mask) has its documents from
// the sample starts: a template's turns may end with the end-of-text token itself (ChatML whose
// eos_token is <|im_end|>, Llama 2's </s>), and a sample's turns are one document. Other data:
// a document ends at each end-of-text token `eot`.
Status WindowDocumentStarts(const TokenStream& stream, int64_t begin, int T, int32_t eot,
                            const int32_t* inputs, std::vector<uint8_t>* flags, int32_t* starts) {
  if (!stream.has_flags()) {
    DocumentStarts(inputs, 1, T, eot, starts);
    return OkStatus();
  }
  flags->resize(static_cast<size_t>(T));
  MESHRUN_RETURN_IF_ERROR(stream.ReadFlags(begin, T, flags->data()));
  int32_t start = 0;  // the first sample of a window may have begun before it
  for (int t = 0; t < T; ++t) {
    if (((*flags)[t] & kTokenDocStart) != 0) start = t;
    starts[t] = start;
  }
  return OkStatus();
}

}  // namespace

double MeasureCpuGemmPeakFlops() {
  // One core's rate times the rank's threads: a small GEMM split over many threads (or measured
  // while other ranks of the host start too) reads far below the cores' sum, and by how much
  // depends on how the host is split into ranks, so the same job read a different MFU under
  // `train`, `train --nproc` and a worker. Measured once per process.
  static const double per_core = [] {
    const int threads = cpu::NumThreads();
    cpu::SetNumThreads(1);
    const double flops = cpu::MeasureMatmulFlops();
    cpu::SetNumThreads(threads);
    return flops;
  }();
  return per_core * std::max(1, cpu::NumThreads());
}

Trainer::Trainer(JobSpec spec, TrainOptions options, RankContext context)
    : spec_(std::move(spec)), options_(options), ctx_(std::move(context)) {}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, TrainOptions options,
                                                   RankContext context) {
  std::unique_ptr<Trainer> t(new Trainer(spec, std::move(options), std::move(context)));
  MESHRUN_RETURN_IF_ERROR(t->Init());
  return t;
}

Communicator* Trainer::Comm(MeshAxis axis) const {
  return ctx_.comms ? &ctx_.comms->Get(axis) : nullptr;
}

Status Trainer::Init() {
  if (!options_.counting) MESHRUN_RETURN_IF_ERROR(CheckTrainingDevice(spec_.resources.device));
  if (!options_.counting) cpu::SetNumThreads(spec_.resources.threads);  // no kernel runs then
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims dims, MeshOf(spec_));
  dims_ = dims;
  if (ctx_.comms == nullptr && dims.world_size() != 1) {
    return InvalidArgumentError("parallelism: a mesh of " + dims.ToString() +
                                " needs one process per rank (hint: meshrun train --nproc " +
                                std::to_string(dims.world_size()) + ")");
  }
  coords_ = dims.CoordsOf(ctx_.rank);

  // Tensor parallel: this rank's heads and MLP columns; FSDP pads units for S·C shards.
  GPT2Config cfg = GPT2ConfigOf(spec_.model);
  cfg.tp_size = dims.tp();
  cfg.tp_rank = coords_.tp;
  cfg.fsdp_size = dims.dp_shard() * dims.cp();
  // Pipeline parallelism: this stage's layers (engine/train/pipeline.h; every rank computes the
  // same split).
  stage_ = coords_.pp;
  if (dims.pp() > 1) {
    // Rank p holds the pipeline's chunks k·P + p, k < v (one chunk without virtual stages).
    const std::vector<int> layers = PipelineLayers(spec_);
    const int P = dims.pp(), v = static_cast<int>(layers.size()) / P;
    for (int k = 0; k < v; ++k) {
      int begin = 0;
      for (int g = 0; g < k * P + stage_; ++g) begin += layers[g];
      cfg.chunks.emplace_back(begin, begin + layers[k * P + stage_]);
    }
    cfg.stage_first = stage_ == 0;
    cfg.stage_last = stage_ == P - 1;
  }
  const Checkpointing ac = CheckpointingOf(spec_.train);
  cfg.recompute = ac == Checkpointing::kFull        ? Recompute::kFull
                  : ac == Checkpointing::kSelective ? Recompute::kSelective
                                                    : Recompute::kNone;
  // The rank's device: every parameter, gradient, activation and AdamW moment lives there; the
  // host keeps the tokens, the scalars and the checkpoint files. On cuda a rank uses the GPU its
  // communicators use (RankContext::cuda_device; the worker gives each rank its own).
  // train.precision bf16 (cuda only; the
  // spec's validation refuses it on cpu) runs the GEMMs in bf16 with float32 accumulation and
  // gathers FSDP units in bf16; master weights, gradients, reductions and AdamW state stay
  // float32 (decision 0027).
  const bool bf16 = PrecisionOf(spec_.train) == TrainPrecision::kBf16;
  if (DeviceOf(spec_.resources) == ComputeDevice::kCuda)
    cfg.device = Device{DeviceType::kCuda, ctx_.cuda_device};
  if (options_.counting) {
    cfg.device = Device{DeviceType::kCount, 0};
  } else if (bf16 && cfg.device.type != DeviceType::kCuda) {
    return InvalidArgumentError(
        "train.precision: 'bf16' needs resources.device: cuda; the CPU engine computes in float32 "
        "(hint: use precision: fp32 on cpu)");
  }
  if (cfg.device.type == DeviceType::kCuda) {
    MESHRUN_RETURN_IF_ERROR(ops::SetMatmulPrecision(
        cfg.device, bf16 ? ops::MatmulPrecision::kBf16 : ops::MatmulPrecision::kFloat32));
  }
  // Under FSDP the model owns no full buffers: its units are gathered when used (sharding.h).
  const bool fsdp = cfg.fsdp_size > 1;
  model_ = std::make_unique<GPT2<float>>(cfg, /*own_storage=*/!fsdp);
  if (AttentionMaskOf(spec_.data) == AttentionMask::kDocument) {
    if (options_.counting) {
      // Where documents start changes no buffer's size, only that they are given: the count's
      // zeros end one at every token, and the step allocates what document masks need.
      document_end_ = 0;
    } else {
      MESHRUN_ASSIGN_OR_RETURN(document_end_, DocumentEndOf(spec_));
    }
  }
  shards_ = std::make_unique<ShardedState>(model_.get(), Comm(MeshAxis::kDpShardCp),
                                           Comm(MeshAxis::kDpReplicate), Comm(MeshAxis::kTp),
                                           spec_.parallelism.fsdp_reshard_after_forward);
  shards_->set_gather_bf16(bf16);
  if (dims.pp() > 1) {
    // A tied last stage's embedding unit is a copy of the first stage's: counted there only.
    shards_->SetPipeline(Comm(MeshAxis::kPp), !(cfg.holds_embedding() && !cfg.stage_first));
  }
  // The optimizer's state: as long as the shard, on its device (engine/train/optimizer.h).
  optimizer_ = MakeOptimizer(OptimizerOf(spec_.train), shards_->size(), shards_->device());
  model_par_.tp = Comm(MeshAxis::kTp);
  model_par_.cp = Comm(MeshAxis::kCp);
  model_par_.cp_ring = CpCommOf(spec_.parallelism) == CpComm::kRing;
  // The hooks gather and reduce-scatter FSDP units and start dp_replicate's buckets.
  model_par_.fsdp = shards_->wants_hooks() ? shards_.get() : nullptr;
  model_->SetParallel(&model_par_);
  if (cfg.device.type == DeviceType::kCuda && ctx_.comms) {
    // NCCL orders its collectives after the model's work on this stream (and the model waits
    // for theirs): without it they would run on the legacy stream, unordered with the model.
    MESHRUN_ASSIGN_OR_RETURN(void* stream, ops::ComputeStreamOf(cfg.device));
    ctx_.comms->SetComputeStream(stream);
  }

  // Text read with data.tokenizer comes from the cache under checkpoint.dir when its key
  // matches (`meshrun train` fills it before the ranks start).
  const LoadOptions load = LoadOptionsOf(spec_);
  // One stream per source of data.train (one for a single path; docs/data.md "Mixtures").
  std::vector<DataSource> sources = TrainSources(spec_.data);
  std::vector<MixtureSampler::Source> mixture;
  train_data_.clear();
  if (options_.counting) {
    // No data is read: the tokens' values never reach the counting device's no-op kernels. The
    // training windows cycle over two; evaluation gets as many windows as a global batch, so it
    // runs its batches as on real data.
    auto zeros = [&](int64_t windows) {
      TokenStream s;
      s.format = "text";
      s.tokens.assign(static_cast<size_t>(windows) * static_cast<size_t>(spec_.model.seq_len + 1),
                      0);
      s.max_token_id = 0;
      return s;
    };
    for (const DataSource& source : sources) {
      train_data_.push_back(std::make_unique<TokenStream>(zeros(2)));
      mixture.push_back({train_data_.back().get(), source.weight});
    }
    sources.clear();
    if (!spec_.data.val.empty()) {
      val_data_ = std::make_unique<TokenStream>(zeros(spec_.train.global_batch_size + 1));
    }
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string field = TrainSourceField(spec_.data, i);
    MESHRUN_ASSIGN_OR_RETURN(TokenStream train,
                             LoadTokens(sources[i].path, spec_.data.format, load));
    train_data_.push_back(std::make_unique<TokenStream>(std::move(train)));
    MESHRUN_RETURN_IF_ERROR(CheckStreamVocab(*train_data_.back(), spec_, field));
    MESHRUN_RETURN_IF_ERROR(CheckStreamWindow(*train_data_.back(), spec_, field));
    MESHRUN_RETURN_IF_ERROR(CheckStreamLossMask(*train_data_.back(), spec_, field));
    mixture.push_back({train_data_.back().get(), sources[i].weight});
  }
  if (!spec_.data.val.empty() && !options_.counting) {
    MESHRUN_ASSIGN_OR_RETURN(TokenStream val, LoadTokens(spec_.data.val, spec_.data.format, load));
    val_data_ = std::make_unique<TokenStream>(std::move(val));
    MESHRUN_RETURN_IF_ERROR(CheckStreamVocab(*val_data_, spec_, "data.val"));
    MESHRUN_RETURN_IF_ERROR(CheckStreamWindow(*val_data_, spec_, "data.val"));
    MESHRUN_RETURN_IF_ERROR(CheckStreamLossMask(*val_data_, spec_, "data.val"));
  }
  masked_ = spec_.train.loss_on_mode() != LossOn::kAll;
  for (const auto& stream : train_data_) masked_ = masked_ || stream->has_flags();
  MESHRUN_ASSIGN_OR_RETURN(Order order, ParseOrder(spec_.data.order));
  MESHRUN_ASSIGN_OR_RETURN(
      MixtureSampler sampler,
      MixtureSampler::Create(mixture, spec_.model.seq_len, spec_.train.global_batch_size,
                             static_cast<uint64_t>(spec_.train.seed), order));
  sampler_ = std::make_unique<MixtureSampler>(std::move(sampler));

  if (options_.counting) {
    // nothing to load or initialise: the counting device holds no values
  } else if (!spec_.model.init_from.empty()) {
    // Each rank reads only the slices it holds: its tp shard, and under FSDP its piece of it.
    MESHRUN_RETURN_IF_ERROR(LoadHuggingFaceShard(spec_.model.init_from, cfg, shards_.get()));
  } else {
    shards_->InitDeterministic(static_cast<uint64_t>(spec_.train.seed));
  }
  peak_flops_ = options_.peak_flops > 0 ? options_.peak_flops
                : options_.counting     ? 1.0
                                        : MeasureCpuGemmPeakFlops();
  return OkStatus();
}

void Trainer::LocalDocuments(int rows) {
  const int T = spec_.model.seq_len, C = dims_->cp();
  std::vector<int32_t> starts(doc_starts_.begin(), doc_starts_.begin() + int64_t{rows} * T);
  if (C == 1) {
    model_->SetDocumentStarts(std::move(starts));
    return;
  }
  std::vector<int32_t> local(starts.size() / C);
  CpChunkBatch(starts.data(), rows, T, C, coords_.cp, local.data(), nullptr);
  model_->SetDocumentStarts(std::move(local));
}

void Trainer::LocalTokens(const int32_t* inputs, const int32_t* targets, int rows) {
  if (document_end_ >= 0) LocalDocuments(rows);
  const int T = spec_.model.seq_len, C = dims_->cp(), Tl = T / C;
  local_in_.resize(static_cast<size_t>(rows) * Tl);
  local_tg_.resize(local_in_.size());
  local_pos_.resize(Tl);
  if (C == 1) {
    std::copy(inputs, inputs + rows * T, local_in_.begin());
    std::copy(targets, targets + rows * T, local_tg_.begin());
    for (int t = 0; t < T; ++t) local_pos_[t] = t;
    return;
  }
  std::vector<int32_t> positions(local_in_.size());
  CpChunkBatch(inputs, rows, T, C, coords_.cp, local_in_.data(), positions.data());
  CpChunkBatch(targets, rows, T, C, coords_.cp, local_tg_.data(), nullptr);
  std::copy(positions.begin(), positions.begin() + Tl, local_pos_.begin());
}

StatusOr<double> Trainer::Step(StepMetrics* metrics) {
  const TrainSpec& tr = spec_.train;
  const int T = spec_.model.seq_len, B = tr.global_batch_size, mb = tr.micro_batch_size;
  std::vector<int32_t> inputs(static_cast<size_t>(mb) * T), targets(inputs.size());
  // This dp rank's sequences of the global batch (docs/data.md).
  const int dp = dims_->dp_replicate() * dims_->dp_shard();
  const int d = coords_.dp_replicate * dims_->dp_shard() + coords_.dp_shard;
  MESHRUN_ASSIGN_OR_RETURN(SeqRange range, DpRankRange(B, dp, d));
  // The loss is the mean over the global batch's targets (docs/data.md "Loss masks"). The batch
  // depends only on (data, seed, step), so every rank counts the targets of all B sequences
  // itself: the same count, hence the same gradient scale, on every mesh, with no collective
  // (decision 0044). Without flags every token is a target: B·T.
  const LossOn loss_on = spec_.train.loss_on_mode();
  std::vector<MixtureSampler::Window> windows(static_cast<size_t>(B));
  int64_t batch_targets = int64_t{B} * T;
  if (masked_) {
    batch_targets = 0;
    for (int i = 0; i < B; ++i) {
      windows[i] = sampler_->WindowOf(step_, i);
      MESHRUN_ASSIGN_OR_RETURN(int64_t n, CountTargets(*train_data_[windows[i].source],
                                                       windows[i].window * T + 1, T, loss_on));
      batch_targets += n;
    }
  }
  // A batch without a single target (all prompt) has loss 0 and no gradient.
  const double grad_scale = batch_targets > 0 ? 1.0 / static_cast<double>(batch_targets) : 0.0;

  // Forward and backward over the micro-batches, as the schedule orders them (one stage, or
  // the pipeline's); FSDP gathers and reduce-scatters per unit.
  shards_->ZeroGrad();
  double loss_sum = 0;
  // Micro-batch m of this dp rank's sequences, for the model: its tokens and targets (the loss
  // masks applied), each sequence's document starts under data.attention: document, this cp
  // rank's part of them. Every pipeline stage reads the tokens itself (positions and document
  // masks come from them); only activations and their gradients cross stages.
  auto fill = [&](int m) -> Status {
    const int first = m * mb;
    MESHRUN_RETURN_IF_ERROR(
        sampler_->Fill(step_, range.first + first, mb, inputs.data(), targets.data()));
    for (int r = 0; masked_ && r < mb; ++r) {
      const MixtureSampler::Window& w = windows[range.first + first + r];
      MESHRUN_RETURN_IF_ERROR(MaskTargets(*train_data_[w.source], w.window * T + 1, T, loss_on,
                                          targets.data() + int64_t{r} * T)
                                  .status());
    }
    if (document_end_ >= 0) {
      doc_starts_.resize(inputs.size());
      for (int r = 0; r < mb; ++r) {
        const int32_t* row = inputs.data() + int64_t{r} * T;
        int32_t* out = doc_starts_.data() + int64_t{r} * T;
        if (!masked_) {  // no stream has flags
          DocumentStarts(row, 1, T, document_end_, out);
          continue;
        }
        const MixtureSampler::Window& w = windows[range.first + first + r];
        MESHRUN_RETURN_IF_ERROR(WindowDocumentStarts(*train_data_[w.source], w.window * T, T,
                                                     document_end_, row, &doc_flags_, out));
      }
    }
    LocalTokens(inputs.data(), targets.data(), mb);
    return OkStatus();
  };
  const int micro_batches = range.count / mb;
  if (dims_->pp() > 1) {
    MESHRUN_RETURN_IF_ERROR(PipelineMicroBatches(micro_batches, fill, grad_scale, &loss_sum));
  } else {
    MESHRUN_RETURN_IF_ERROR(OneStageMicroBatches(micro_batches, fill, grad_scale, &loss_sum));
  }
  // Replicas sum their gradients; then clip by the global norm and update the shard.
  MESHRUN_RETURN_IF_ERROR(shards_->FinishGradients());
  MESHRUN_RETURN_IF_ERROR(SyncTiedEmbedding());
  MESHRUN_ASSIGN_OR_RETURN(UpdateResult update, ClipAndStep(*shards_, *optimizer_, tr, step_));
  // The loss of the global batch: every token is on exactly one rank of dp_cp (of the last
  // pipeline stage, which sums it to the others over pp).
  MESHRUN_ASSIGN_OR_RETURN(double total,
                           SumOverGroup(Comm(MeshAxis::kDpCp), loss_sum, CommCharge::Metrics()));
  if (dims_->pp() > 1) {
    MESHRUN_ASSIGN_OR_RETURN(total,
                             SumOverGroup(Comm(MeshAxis::kPp), total, CommCharge::Metrics()));
  }
  const double loss = batch_targets > 0 ? total / static_cast<double>(batch_targets) : 0.0;
  ++step_;
  metrics->step = step_;
  metrics->loss = loss;
  metrics->lr = update.lr;
  metrics->grad_norm = update.grad_norm;
  return loss;
}

StatusOr<EvalMetrics> Trainer::Evaluate(const TokenStream& stream, int64_t max_windows) {
  const int T = spec_.model.seq_len, mb = spec_.train.micro_batch_size, Tl = T / dims_->cp();
  const int dp = dims_->dp_replicate() * dims_->dp_shard();
  const int d = coords_.dp_replicate * dims_->dp_shard() + coords_.dp_shard;
  const int64_t n_tokens = stream.size();
  int64_t windows = (n_tokens - 1) / T;
  if (windows <= 0) {
    return InvalidArgumentError("data: " + stream.path + " has " + std::to_string(n_tokens) +
                                " tokens, fewer than seq_len+1 = " + std::to_string(T + 1) +
                                " (hint: use a longer stream or a shorter model.seq_len)");
  }
  if (max_windows > 0) windows = std::min(windows, max_windows);
  // Every rank of an FSDP or cp group must run the same number of forwards.
  if (dims_->world_size() > 1) windows = windows / (static_cast<int64_t>(dp) * mb) * dp * mb;
  if (windows == 0) {
    return InvalidArgumentError("data.val: " + stream.path + " has too few windows for " +
                                std::to_string(dp) + " dp ranks × micro_batch_size " +
                                std::to_string(mb) + " (hint: use a longer validation stream)");
  }
  std::vector<int32_t> inputs(static_cast<size_t>(mb) * T), targets(inputs.size());
  double loss_sum = 0, target_count = 0;
  const LossOn loss_on = spec_.train.loss_on_mode();
  // dp rank d takes batches d, d + dp, d + 2·dp, … of mb windows.
  for (int64_t w = static_cast<int64_t>(d) * mb; w < windows; w += static_cast<int64_t>(dp) * mb) {
    const int rows = static_cast<int>(std::min<int64_t>(mb, windows - w));
    for (int r = 0; r < rows; ++r) {
      MESHRUN_RETURN_IF_ERROR(stream.Read((w + r) * T, T, inputs.data() + int64_t{r} * T));
      MESHRUN_RETURN_IF_ERROR(stream.Read((w + r) * T + 1, T, targets.data() + int64_t{r} * T));
      MESHRUN_ASSIGN_OR_RETURN(int64_t n, MaskTargets(stream, (w + r) * T + 1, T, loss_on,
                                                      targets.data() + int64_t{r} * T));
      target_count += static_cast<double>(n);
      if (document_end_ >= 0) {
        doc_starts_.resize(inputs.size());
        MESHRUN_RETURN_IF_ERROR(WindowDocumentStarts(stream, (w + r) * T, T, document_end_,
                                                     inputs.data() + int64_t{r} * T, &doc_flags_,
                                                     doc_starts_.data() + int64_t{r} * T));
      }
    }
    LocalTokens(inputs.data(), targets.data(), rows);
    if (dims_->pp() > 1) {
      // The pipeline's forward, one micro-batch through every chunk in turn (rank 0's chunk 0,
      // rank 1's chunk 0, …, rank P−1's chunk 0, rank 0's chunk 1, …).
      Communicator* pp = Comm(MeshAxis::kPp);
      const GPT2Config& cfg = model_->config();
      const int P = dims_->pp(), v = cfg.num_chunks();
      const size_t acts = static_cast<size_t>(rows) * Tl * cfg.d_model;
      // A buffer of the pipeline's free list (training left one there: no new memory).
      Tensor eval_input;
      float* in = TakePipeBuffer(eval_input, acts);
      for (int k = 0; k < v; ++k) {
        const int g = k * P + stage_;
        model_->SetActiveChunk(k);
        if (g > 0) {
          MESHRUN_RETURN_IF_ERROR(pp->Recv(in, acts, (stage_ + P - 1) % P));
        }
        if (g == P * v - 1) {
          MESHRUN_ASSIGN_OR_RETURN(
              double loss, model_->StageForwardLoss(local_in_.data(), in, local_tg_.data(), rows,
                                                    Tl, local_pos_.data()));
          loss_sum += loss;
        } else {
          MESHRUN_RETURN_IF_ERROR(model_->StageForward(local_in_.data(), g == 0 ? nullptr : in,
                                                       rows, Tl, local_pos_.data()));
          MESHRUN_RETURN_IF_ERROR(pp->Send(model_->stage_output(), acts, (stage_ + 1) % P));
        }
        // Document masks are consumed by each forward: set them again for the next chunk.
        if (k + 1 < v) LocalTokens(inputs.data(), targets.data(), rows);
      }
      GivePipeBuffer(eval_input);
      model_->SetActiveChunk(0);
      continue;
    }
    MESHRUN_ASSIGN_OR_RETURN(double loss, model_->ForwardLoss(local_in_.data(), local_tg_.data(),
                                                              rows, Tl, local_pos_.data()));
    loss_sum += loss;
  }
  shards_->ReleaseAll();
  MESHRUN_ASSIGN_OR_RETURN(double total,
                           SumOverGroup(Comm(MeshAxis::kDpCp), loss_sum, CommCharge::Metrics()));
  if (dims_->pp() > 1) {
    MESHRUN_ASSIGN_OR_RETURN(total,
                             SumOverGroup(Comm(MeshAxis::kPp), total, CommCharge::Metrics()));
  }
  MESHRUN_ASSIGN_OR_RETURN(
      double targets_all, SumOverGroup(Comm(MeshAxis::kDpCp), target_count, CommCharge::Metrics()));
  // Each token is on one rank of dp_cp, but each rank of a cp group counted whole windows.
  targets_all /= dims_->cp();
  EvalMetrics out;
  out.step = step_;
  out.tokens = static_cast<int64_t>(std::llround(targets_all));
  out.loss = out.tokens > 0 ? total / static_cast<double>(out.tokens) : 0.0;
  return out;
}

StatusOr<std::vector<double>> Trainer::MaxOverRanks(std::vector<double> values) {
  const size_t n = values.size();
  for (MeshAxis axis : {MeshAxis::kTp, MeshAxis::kDpCp, MeshAxis::kPp}) {
    Communicator* comm = Comm(axis);
    if (comm == nullptr || comm->size() <= 1 || n == 0) continue;
    std::vector<double> all(n * comm->size());
    MESHRUN_RETURN_IF_ERROR(comm->AllGatherBytes(values.data(), all.data(), sizeof(double) * n,
                                                 CallOptions::Charged(CommCharge::Metrics())));
    for (int r = 0; r < comm->size(); ++r) {
      for (size_t i = 0; i < n; ++i) values[i] = std::max(values[i], all[r * n + i]);
    }
  }
  return values;
}

StatusOr<double> Trainer::SumOverWorld(double value, CommCharge charge) {
  MESHRUN_ASSIGN_OR_RETURN(double over_tp, SumOverGroup(Comm(MeshAxis::kTp), value, charge));
  MESHRUN_ASSIGN_OR_RETURN(double stage, SumOverGroup(Comm(MeshAxis::kDpCp), over_tp, charge));
  return SumOverGroup(Comm(MeshAxis::kPp), stage, charge);
}

Status Trainer::OneStageMicroBatches(int micro_batches, const std::function<Status(int)>& fill,
                                     double grad_scale, double* loss_sum) {
  const int mb = spec_.train.micro_batch_size, Tl = spec_.model.seq_len / dims_->cp();
  for (int m = 0; m < micro_batches; ++m) {
    MESHRUN_RETURN_IF_ERROR(fill(m));
    // In the last micro-batch each unit's gradients are final after its backward: the
    // dp_replicate buckets start then, overlapping the rest of the backward.
    shards_->set_last_micro_batch(m + 1 == micro_batches);
    MESHRUN_ASSIGN_OR_RETURN(
        double loss, model_->ForwardBackward(local_in_.data(), local_tg_.data(), mb, Tl, grad_scale,
                                             local_pos_.data()));
    *loss_sum += loss;
  }
  return OkStatus();
}

Status Trainer::PipelineMicroBatches(int micro_batches, const std::function<Status(int)>& fill,
                                     double grad_scale, double* loss_sum) {
  Communicator* pp = Comm(MeshAxis::kPp);
  const GPT2Config& cfg = model_->config();
  const int P = dims_->pp(), M = micro_batches, mb = spec_.train.micro_batch_size;
  pipe_wait_seconds_ = 0;
  for (int k = 0; k < 4; ++k) pipe_op_seconds_[k] = 0, pipe_ops_[k] = 0;
  const int v = cfg.num_chunks(), G = P * v;
  const int Tl = spec_.model.seq_len / dims_->cp();
  const size_t acts = static_cast<size_t>(mb) * Tl * cfg.d_model;  // one activation, floats
  const PpSchedule schedule = PpScheduleOf(spec_.parallelism);
  // Every rank's operations and the timetable (pipeline.h): the same on every rank.
  std::vector<std::vector<PipeOp>> ops(P);
  for (int p = 0; p < P; ++p) ops[p] = PipelineOps(schedule, P, p, M, v);
  MESHRUN_ASSIGN_OR_RETURN(const PipeTimetable table, BuildTimetable(ops, P, v, M));
  // Zero-bubble (decision 0059): B keeps each micro-batch's weight-gradient stash until its W,
  // at most as many at once as the schedule has pending.
  model_->set_weight_stash_limit(MaxPendingWeightGrads(ops[stage_]));
  auto buffer = [&](Tensor& t) { return TakePipeBuffer(t, acts); };
  // Without activation checkpointing a chunk keeps each micro-batch's activations from its
  // forward to its backward (decision 0066); with it, only the input, and the backward runs the
  // forward again (decision 0054).
  const bool keep = PipelineKeepsActivations(spec_);
  // Per (chunk, micro-batch): the input received from the previous chunk and the gradient of
  // the output received from the next, each in a buffer of pipe_free_ from its receive until
  // the micro-batch's backward through the chunk ran.
  pipe_inputs_.resize(static_cast<size_t>(v) * M);
  pipe_output_grads_.resize(pipe_inputs_.size());
  auto slot_of = [&](int k, int m) { return static_cast<size_t>(k) * M + m; };
  // The operation rank p runs in slot t (null: none).
  auto op_at = [&](size_t t, int p) -> const PipeOp* {
    const int i = table.slots[t][p];
    return i < 0 ? nullptr : &ops[p][static_cast<size_t>(i)];
  };
  const int next = (stage_ + 1) % P, prev = (stage_ + P - 1) % P;
  const CallOptions charge = CallOptions::Axis(MeshAxis::kPp);
  auto exchange = [&](const float* send, int dst, float* recv, int src) -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = OkStatus();
    if (send != nullptr && recv != nullptr) {
      s = pp->SendRecv(send, acts, dst, recv, acts, src, charge);
    } else if (send != nullptr) {
      s = pp->Send(send, acts, dst, charge);
    } else if (recv != nullptr) {
      s = pp->Recv(recv, acts, src, charge);
    }
    pipe_wait_seconds_ += Seconds(t0, std::chrono::steady_clock::now());
    return s;
  };
  // Runs one of this rank's operations; the outputs to send are left in *send_forward (to the
  // next rank) and *send_backward (to the previous one), null when none.
  auto run_op = [&](const PipeOp& op, const float** send_forward,
                    const float** send_backward) -> Status {
    *send_forward = *send_backward = nullptr;
    if (op.kind == PipeOpKind::kWeight) {
      // The deferred weight gradients of a micro-batch whose B ran (nothing to send); the
      // step's last micro-batch makes each block's gradients final.
      shards_->set_last_micro_batch(op.micro == M - 1);
      model_->SetActiveChunk(op.chunk);
      return model_->StageBackwardWeight(static_cast<int>(slot_of(op.chunk, op.micro)));
    }
    const int g = op.chunk * P + stage_;
    const float* input = g == 0 ? nullptr : pipe_inputs_[slot_of(op.chunk, op.micro)].data<float>();
    model_->SetActiveChunk(op.chunk);
    MESHRUN_RETURN_IF_ERROR(fill(op.micro));
    if (op.kind == PipeOpKind::kForward) {
      MESHRUN_RETURN_IF_ERROR(
          model_->StageForward(local_in_.data(), input, mb, Tl, local_pos_.data(),
                               keep ? static_cast<int>(slot_of(op.chunk, op.micro)) : -1));
      *send_forward = model_->stage_output();
      return OkStatus();
    }
    // The backward runs from the forward's kept activations, or runs the chunk's forward again
    // from its kept input; the last chunk's runs its forward (it has no forward operation).
    // The step's last micro-batch makes each unit's gradients final.
    shards_->set_last_micro_batch(op.micro == M - 1);
    const float* output_grad =
        g == G - 1 ? nullptr : pipe_output_grads_[slot_of(op.chunk, op.micro)].data<float>();
    const int kept = keep && g != G - 1 ? static_cast<int>(slot_of(op.chunk, op.micro)) : -1;
    double loss = 0;
    if (schedule == PpSchedule::kZeroBubble) {
      // B: input gradients now, the blocks' weight gradients at this micro-batch's W.
      MESHRUN_ASSIGN_OR_RETURN(
          loss, model_->StageBackwardInput(static_cast<int>(slot_of(op.chunk, op.micro)),
                                           local_in_.data(), input, local_tg_.data(), output_grad,
                                           mb, Tl, grad_scale, local_pos_.data(), kept));
    } else {
      MESHRUN_ASSIGN_OR_RETURN(
          loss, model_->StageForwardBackward(local_in_.data(), input, local_tg_.data(), output_grad,
                                             mb, Tl, grad_scale, local_pos_.data(), kept));
    }
    *loss_sum += loss;
    if (g > 0) *send_backward = model_->stage_input_grad();
    GivePipeBuffer(pipe_inputs_[slot_of(op.chunk, op.micro)]);
    GivePipeBuffer(pipe_output_grads_[slot_of(op.chunk, op.micro)]);
    return OkStatus();
  };
  // Each operation timed by its kind (StepMetrics::pipeline_op_seconds).
  auto run = [&](const PipeOp& op, const float** send_forward,
                 const float** send_backward) -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = run_op(op, send_forward, send_backward);
    const bool last = op.chunk * P + stage_ == G - 1;
    const int kind = op.kind == PipeOpKind::kForward  ? 0
                     : op.kind == PipeOpKind::kWeight ? 2
                     : last                           ? 3
                                                      : 1;
    pipe_op_seconds_[kind] += Seconds(t0, std::chrono::steady_clock::now());
    ++pipe_ops_[kind];
    return s;
  };
  const bool lockstep = pp->overlaps() || options_.pipeline_lockstep;
  if (!lockstep) {
    // Host backends (Gloo, fake; decision 0064): this rank runs its own operations in their
    // order, without lockstep. Each receive is posted ahead (PipelineReceives: as early as the
    // lockstep's count of receive buffers allows) and waited for only by the operation that
    // reads it; each output is copied into the next of a ring of send buffers and sent at once,
    // and a send is waited for only when its buffer comes round again (or at the end). The time
    // spent in those waits is the stage's wait on the others.
    const std::vector<PipeOp>& mine = ops[static_cast<size_t>(stage_)];
    const std::vector<PipeRecv> recvs = PipelineReceives(ops, table, P, v, stage_);
    std::vector<CommWork> input_recv(pipe_inputs_.size()), grad_recv(pipe_inputs_.size());
    const int ring = PipelineSendBuffers(mine, P, v, stage_);
    if (static_cast<int>(pipe_send_.size()) < ring) pipe_send_.resize(static_cast<size_t>(ring));
    for (int i = 0; i < ring; ++i) {
      Tensor& t = pipe_send_[static_cast<size_t>(i)];
      if (!t.defined() || t.numel() < static_cast<int64_t>(acts)) {
        MemoryKindScope kind(MemoryKind::kCommunication);
        t = Tensor::Empty({static_cast<int64_t>(acts)}, ScalarType::kFloat32, cfg.device);
      }
    }
    std::vector<CommWork> sends(static_cast<size_t>(ring));  // the last send from each buffer
    size_t sent = 0;
    auto waited = [&](CommWork& w) -> Status {
      if (!w.pending()) return OkStatus();
      const auto t0 = std::chrono::steady_clock::now();
      Status s = pp->Wait(w);
      pipe_wait_seconds_ += Seconds(t0, std::chrono::steady_clock::now());
      return s;
    };
    auto started = [&](StatusOr<CommWork> w, CommWork* into,
                       std::chrono::steady_clock::time_point t0) -> Status {
      pipe_wait_seconds_ += Seconds(t0, std::chrono::steady_clock::now());
      if (!w.ok()) return w.status();
      *into = std::move(w).value();
      return OkStatus();
    };
    size_t posted = 0;
    for (size_t j = 0; j < mine.size(); ++j) {
      for (; posted < recvs.size() && recvs[posted].before_op <= static_cast<int>(j); ++posted) {
        const PipeRecv& r = recvs[posted];
        const size_t at = slot_of(r.chunk, r.micro);
        float* into = buffer(r.gradient ? pipe_output_grads_[at] : pipe_inputs_[at]);
        const auto t0 = std::chrono::steady_clock::now();
        MESHRUN_RETURN_IF_ERROR(started(pp->StartRecv(into, acts, r.gradient ? next : prev, charge),
                                        r.gradient ? &grad_recv[at] : &input_recv[at], t0));
      }
      const PipeOp& op = mine[j];
      if (op.kind != PipeOpKind::kWeight) {
        const size_t at = slot_of(op.chunk, op.micro);
        MESHRUN_RETURN_IF_ERROR(waited(input_recv[at]));
        if (op.kind == PipeOpKind::kBackward) MESHRUN_RETURN_IF_ERROR(waited(grad_recv[at]));
      }
      const float* send_forward = nullptr;
      const float* send_backward = nullptr;
      MESHRUN_RETURN_IF_ERROR(run(op, &send_forward, &send_backward));
      for (const auto& [data, peer] :
           {std::make_pair(send_forward, next), std::make_pair(send_backward, prev)}) {
        if (data == nullptr) continue;
        const size_t at = sent++ % sends.size();
        MESHRUN_RETURN_IF_ERROR(waited(sends[at]));
        float* copy = pipe_send_[at].data<float>();
        MESHRUN_RETURN_IF_ERROR(ops::Copy(cfg.device, copy, data, sizeof(float) * acts));
        const auto t0 = std::chrono::steady_clock::now();
        MESHRUN_RETURN_IF_ERROR(started(pp->StartSend(copy, acts, peer, charge), &sends[at], t0));
      }
    }
    for (CommWork& w : sends) MESHRUN_RETURN_IF_ERROR(waited(w));
    if (posted != recvs.size()) {
      return InternalError("pipeline executor: " + std::to_string(recvs.size() - posted) +
                           " receives were never posted");
    }
  }
  // A device backend (NCCL) runs its point-to-point calls in issue order on one stream, where a
  // receive posted ahead could wait on a send queued behind it (communicator.h): it keeps the
  // lockstep timetable, each slot's exchanges paired in one SendRecv (as does a host backend
  // under TrainOptions::pipeline_lockstep).
  for (size_t t = 0; lockstep && t < table.slots.size(); ++t) {
    const float* send_forward = nullptr;
    const float* send_backward = nullptr;
    if (const PipeOp* op = op_at(t, stage_); op != nullptr) {
      MESHRUN_RETURN_IF_ERROR(run(*op, &send_forward, &send_backward));
    }
    // Outputs move one rank on (pipeline.h): forwards' to the next rank, then input gradients
    // to the previous one; each rank posts its send and its receive at once.
    float* recv_forward = nullptr;
    if (const PipeOp* from = op_at(t, prev);
        from != nullptr && from->kind == PipeOpKind::kForward) {
      const int k = stage_ == 0 ? from->chunk + 1 : from->chunk;  // the chunk it feeds here
      recv_forward = buffer(pipe_inputs_[slot_of(k, from->micro)]);
    }
    MESHRUN_RETURN_IF_ERROR(exchange(send_forward, next, recv_forward, prev));
    float* recv_backward = nullptr;
    if (const PipeOp* from = op_at(t, next);
        from != nullptr && from->kind == PipeOpKind::kBackward && from->chunk * P + next > 0) {
      const int k = stage_ == P - 1 ? from->chunk - 1 : from->chunk;
      recv_backward = buffer(pipe_output_grads_[slot_of(k, from->micro)]);
    }
    MESHRUN_RETURN_IF_ERROR(exchange(send_backward, prev, recv_backward, next));
  }
  model_->SetActiveChunk(0);
  if (model_->pending_weight_stashes() != 0) {
    return InternalError("pipeline schedule: " + std::to_string(model_->pending_weight_stashes()) +
                         " micro-batches' weight gradients never ran");
  }
  return OkStatus();
}

float* Trainer::TakePipeBuffer(Tensor& t, size_t floats) {
  if (!t.defined()) {
    // Every buffer holds one micro-batch's activation: any free one fits (an evaluation's rows
    // are at most a micro-batch's).
    for (auto it = pipe_free_.end(); it != pipe_free_.begin();) {
      --it;
      if (it->numel() >= static_cast<int64_t>(floats)) {
        t = *it;
        pipe_free_.erase(it);
        break;
      }
    }
  }
  if (!t.defined() || t.numel() < static_cast<int64_t>(floats)) {
    MemoryKindScope kind(MemoryKind::kActivations);
    t = Tensor::Empty({static_cast<int64_t>(floats)}, ScalarType::kFloat32,
                      model_->config().device);
  }
  return t.data<float>();
}

void Trainer::GivePipeBuffer(Tensor& t) {
  if (!t.defined()) return;
  pipe_free_.push_back(t);
  t = Tensor();
}

Status Trainer::SyncTiedEmbedding() {
  const GPT2Config& cfg = model_->config();
  const int P = dims_->pp();
  if (P == 1 || !cfg.tie_embeddings || !(cfg.stage_first || cfg.stage_last)) return OkStatus();
  // The same layout on both (pipeline.h): the shards line up element for element. Both add the
  // other's gradient to their own, so both hold the same sum (a + b = b + a in float).
  const auto [offset, count] = shards_->UnitShard(0);
  if (count == 0) return OkStatus();
  if (!pipe_tied_.defined() || pipe_tied_.numel() < count) {
    MemoryKindScope kind(MemoryKind::kCommunication);
    pipe_tied_ = Tensor::Empty({count}, ScalarType::kFloat32, cfg.device);
  }
  const int peer = cfg.stage_first ? P - 1 : 0;
  float* grads = shards_->grads() + offset;
  MESHRUN_RETURN_IF_ERROR(Comm(MeshAxis::kPp)
                              ->SendRecv(grads, static_cast<size_t>(count), peer,
                                         pipe_tied_.data<float>(), static_cast<size_t>(count), peer,
                                         CallOptions::Axis(MeshAxis::kPp)));
  return ops::Accumulate(cfg.device, grads, pipe_tied_.data<float>(), count);
}

StatusOr<bool> Trainer::StopAgreed() {
  if (options_.stop_requested == nullptr) return false;
  const double mine = *options_.stop_requested != 0 ? 1.0 : 0.0;
  // Over tp, dp_cp and pp: the whole world, in the groups every rank already has.
  MESHRUN_ASSIGN_OR_RETURN(double all, SumOverWorld(mine, CommCharge::Control()));
  return all > 0;
}

StatusOr<RunSummary> Trainer::Run(TrainObserver* observer) {
  TrainObserver none;
  if (observer == nullptr) observer = &none;
  const TrainSpec& tr = spec_.train;
  const CheckpointSpec& ck = spec_.checkpoint;
  if (!ck.dir.empty() && ResumeOf(ck) == ResumeMode::kAuto) {
    Status s = LoadLatestCheckpoint(observer);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  }
  RunSummary summary;
  summary.resumed_step = step_;
  summary.first_step = step_ + 1;
  const int64_t last = options_.stop_after_step > 0
                           ? std::min<int64_t>(options_.stop_after_step, tr.steps)
                           : tr.steps;
  const double tokens_per_step = static_cast<double>(tr.global_batch_size) * spec_.model.seq_len;
  GPT2Config global_cfg = model_->config();
  global_cfg.tp_size = 1;
  const double flops_per_token = GPT2FlopsPerToken(global_cfg, spec_.model.seq_len);
  double total_seconds = 0;
  // Memory is reported for the model's device (cpu, or the rank's GPU).
  const Device device = model_->config().device;
  AllocatorFor(device).ResetPeak();
  ResetMemoryBreakdownPeak(device.type);
  std::shared_ptr<CommStats> stats = ctx_.comms ? ctx_.comms->stats() : nullptr;
  if (stats) stats->Reset();

  while (step_ < last) {
    StepMetrics m;
    // The pp axis's exposed seconds: the time its calls blocked this rank (a receive posted ahead
    // runs while the rank computes; only its wait counts, decision 0064).
    const double pp_seconds_before = stats ? stats->AxisTotal(MeshAxis::kPp).exposed_seconds : 0;
    const auto t0 = Clock::now();
    MESHRUN_ASSIGN_OR_RETURN(double loss, Step(&m));
    m.step_seconds = Seconds(t0, Clock::now());
    // The measured bubble (decision 0060): the part of the step this rank spent waiting on the
    // other stages: in the pipeline's sends and receives (the stage before or after it
    // computing, or the transfer itself) and, once its last operation ran, in the pp axis's
    // calls that follow (the tied embedding's exchange, the grad norm's sum over pp) while the
    // stages before it drain: all of the step's time blocked in communication over pp.
    if (dims_->pp() > 1 && m.step_seconds > 0) {
      double waited = pipe_wait_seconds_;
      if (stats) {
        waited =
            std::max(waited, stats->AxisTotal(MeshAxis::kPp).exposed_seconds - pp_seconds_before);
      }
      m.pipeline_bubble_ratio = waited / m.step_seconds;
      for (int k = 0; k < 4; ++k) {
        m.pipeline_op_seconds[k] = pipe_op_seconds_[k];
        m.pipeline_ops[k] = pipe_ops_[k];
      }
    }
    // Beside it, the schedule's in theory (decisions 0060, 0068), over the step's micro-batches
    // and, for zero-bubble, at this stage's operation times of the step.
    if (dims_->pp() > 1) {
      auto each = [&](int k) {
        return pipe_ops_[k] > 0 ? pipe_op_seconds_[k] / pipe_ops_[k] : 0.0;
      };
      const double forward_backward = pipe_ops_[3] > 0 ? each(3) : each(0) + each(1);
      m.pipeline_bubble_theory =
          PipelineBubbleTheory(PpScheduleOf(spec_.parallelism), dims_->pp(),
                               static_cast<int>(MicroBatchesPerStep(spec_)),
                               model_->config().num_chunks(), forward_backward, each(2));
    }
    m.tokens_per_second = tokens_per_step / m.step_seconds;
    m.tflops = m.tokens_per_second * flops_per_token / 1e12;
    m.mfu = ModelFlopsUtilization(m.tokens_per_second, flops_per_token, peak_flops_,
                                  dims_->world_size());
    const MemoryStats mem = AllocatorFor(device).Stats();
    m.allocated_memory_bytes = mem.allocated_bytes;
    m.peak_memory_bytes = mem.peak_bytes;
    m.reserved_memory_bytes = mem.reserved_bytes;
    m.memory = MemoryBreakdownOf(device.type);
    if (stats) m.comm = stats->Snapshot();
    observer->OnStep(m);
    summary.losses.push_back(loss);
    total_seconds += m.step_seconds;
    summary.peak_memory_bytes = std::max(summary.peak_memory_bytes, m.peak_memory_bytes);

    if (val_data_ && spec_.data.eval_every > 0 && step_ % spec_.data.eval_every == 0) {
      MESHRUN_ASSIGN_OR_RETURN(EvalMetrics e, Evaluate(*val_data_, /*max_windows=*/64));
      observer->OnEval(e);
    }
    loss_history_.push_back(loss);
    MESHRUN_ASSIGN_OR_RETURN(const bool stop, StopAgreed());
    const bool at_end = step_ == last;
    if (!ck.dir.empty() && (at_end || stop || (ck.every > 0 && step_ % ck.every == 0))) {
      MESHRUN_RETURN_IF_ERROR(SaveCheckpoint());
      observer->OnLog("checkpoint " + last_checkpoint_);
      observer->OnCheckpoint(step_, last_checkpoint_);
    }
    if (stop && !at_end) {
      summary.interrupted = true;
      break;
    }
  }
  summary.steps = static_cast<int64_t>(summary.losses.size());
  summary.last_step = step_;
  // The last step's loss: this run's, else the resumed checkpoint's (its history ends at step_).
  summary.final_loss = !loss_history_.empty() ? loss_history_.back() : std::nan("");
  if (total_seconds > 0) {
    summary.tokens_per_second =
        tokens_per_step * static_cast<double>(summary.steps) / total_seconds;
    summary.mfu = ModelFlopsUtilization(summary.tokens_per_second, flops_per_token, peak_flops_,
                                        dims_->world_size());
  }
  // Bus bytes per rank per step, averaged over every rank of the job (docs/parallelism.md).
  std::vector<MeshAxis> comm_axes = {MeshAxis::kTp, MeshAxis::kCp, MeshAxis::kDpShard,
                                     MeshAxis::kDpReplicate};
  if (dims_->pp() > 1) comm_axes.push_back(MeshAxis::kPp);
  for (MeshAxis axis : comm_axes) {
    double mine = 0;
    if (stats && summary.steps > 0) mine = stats->AxisTotal(axis).bytes / summary.steps;
    MESHRUN_ASSIGN_OR_RETURN(double all, SumOverWorld(mine, CommCharge::Metrics()));
    summary.comm_bytes[axis] = all / dims_->world_size();
  }
  // Memory: the largest rank's figures (every rank runs this, in the same order).
  // One gather of [peak, each kind's peak, max RSS].
  const MemoryBreakdown mem = MemoryBreakdownOf(device.type);
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  std::vector<double> mine = {static_cast<double>(summary.peak_memory_bytes)};
  for (int k = 0; k < kNumMemoryKinds; ++k) mine.push_back(static_cast<double>(mem.peak[k]));
  mine.push_back(static_cast<double>(usage.ru_maxrss) * 1024);
  MESHRUN_ASSIGN_OR_RETURN(std::vector<double> most, MaxOverRanks(std::move(mine)));
  summary.peak_memory_bytes = static_cast<int64_t>(most[0]);
  for (int k = 0; k < kNumMemoryKinds; ++k)
    summary.memory.peak[k] = static_cast<int64_t>(most[1 + k]);
  summary.max_rss_bytes = static_cast<int64_t>(most.back());
  summary.last_checkpoint = last_checkpoint_;
  return summary;
}

}  // namespace meshrun
