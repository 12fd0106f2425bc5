// The training loop of one rank, in execution order.
#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "engine/kernels/cpu/kernels.h"
#include "engine/model/hf_gpt2.h"
#include "engine/train/optimizer.h"

namespace meshrun {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

GPT2Config ConfigOf(const JobSpec& spec) {
  GPT2Config cfg;
  cfg.vocab_size = spec.model.vocab_size;
  cfg.n_layer = spec.model.n_layer;
  cfg.n_head = spec.model.n_head;
  cfg.d_model = spec.model.d_model;
  cfg.max_seq_len = spec.model.seq_len;
  return cfg;
}

}  // namespace

double MeasureCpuGemmPeakFlops() {
  const int64_t n = 512;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i % 17) - 8) * 0.01f;
    b[i] = static_cast<float>((i % 13) - 6) * 0.01f;
  }
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    cpu::MatmulForward(c.data(), a.data(), b.data(), static_cast<const float*>(nullptr), n, n, n);
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return 2.0 * n * n * n / best;
}

Trainer::Trainer(JobSpec spec, TrainOptions options)
    : spec_(std::move(spec)), options_(options) {}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, TrainOptions options) {
  std::unique_ptr<Trainer> t(new Trainer(spec, options));
  MESHRUN_RETURN_IF_ERROR(t->Init());
  return t;
}

Status Trainer::Init() {
  if (spec_.resources.device != "cpu") {
    return InvalidArgumentError("resources.device: '" + spec_.resources.device +
                                "' is not built into this engine yet (hint: use device: cpu)");
  }
  cpu::SetNumThreads(spec_.resources.threads);
  model_ = std::make_unique<GPT2<float>>(ConfigOf(spec_));

  MESHRUN_ASSIGN_OR_RETURN(TokenStream train, LoadTokens(spec_.data.train, spec_.data.format));
  train_data_ = std::make_unique<TokenStream>(std::move(train));
  if (!spec_.data.val.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(TokenStream val, LoadTokens(spec_.data.val, spec_.data.format));
    val_data_ = std::make_unique<TokenStream>(std::move(val));
  }
  for (const TokenStream* s : {train_data_.get(), val_data_.get()}) {
    if (s != nullptr && s->max_token_id >= spec_.model.vocab_size) {
      return InvalidArgumentError(
          "model.vocab_size: token id " + std::to_string(s->max_token_id) + " in " + s->path +
          " is not below vocab_size(" + std::to_string(spec_.model.vocab_size) +
          ") (hint: raise model.vocab_size or use data tokenized with a smaller vocabulary)");
    }
  }
  MESHRUN_ASSIGN_OR_RETURN(Order order, ParseOrder(spec_.data.order));
  MESHRUN_ASSIGN_OR_RETURN(
      BatchSampler sampler,
      BatchSampler::Create(train_data_.get(), spec_.model.seq_len, spec_.train.global_batch_size,
                           static_cast<uint64_t>(spec_.train.seed), order));
  sampler_ = std::make_unique<BatchSampler>(std::move(sampler));

  if (!spec_.model.init_from.empty()) {
    MESHRUN_RETURN_IF_ERROR(LoadHuggingFaceGPT2(spec_.model.init_from, model_.get()));
  } else {
    model_->InitDeterministic(static_cast<uint64_t>(spec_.train.seed));
  }
  adam_m_ = Tensor::Zeros({model_->num_params()}, ScalarType::kFloat32);
  adam_v_ = Tensor::Zeros({model_->num_params()}, ScalarType::kFloat32);
  peak_flops_ = options_.peak_flops > 0 ? options_.peak_flops : MeasureCpuGemmPeakFlops();
  return OkStatus();
}

StatusOr<double> Trainer::Step(StepMetrics* metrics) {
  const TrainSpec& tr = spec_.train;
  const int T = spec_.model.seq_len, B = tr.global_batch_size, mb = tr.micro_batch_size;
  const double grad_scale = 1.0 / (static_cast<double>(B) * T);
  std::vector<int32_t> inputs(static_cast<size_t>(mb) * T), targets(inputs.size());

  // Forward and backward over the micro-batches of this rank's share of the global batch.
  model_->ZeroGrad();
  double loss_sum = 0;
  for (int first = 0; first < B; first += mb) {
    MESHRUN_RETURN_IF_ERROR(
        sampler_->Fill(step_, first, mb, inputs.data(), targets.data()));
    MESHRUN_ASSIGN_OR_RETURN(
        double loss, model_->ForwardBackward(inputs.data(), targets.data(), mb, T, grad_scale));
    loss_sum += loss;
  }
  const double loss = loss_sum / (static_cast<double>(B) * T);

  // Clip and update.
  const UpdateResult update =
      ClipAndAdamW(model_.get(), adam_m_.data<float>(), adam_v_.data<float>(), tr, step_);
  ++step_;
  metrics->step = step_;
  metrics->loss = loss;
  metrics->lr = update.lr;
  metrics->grad_norm = update.grad_norm;
  return loss;
}

StatusOr<EvalMetrics> Trainer::Evaluate(const TokenStream& stream, int64_t max_windows) {
  const int T = spec_.model.seq_len, mb = spec_.train.micro_batch_size;
  const int64_t n_tokens = stream.size();
  int64_t windows = (n_tokens - 1) / T;
  if (windows <= 0) {
    return InvalidArgumentError("data: " + stream.path + " has " + std::to_string(n_tokens) +
                                " tokens, fewer than seq_len+1 = " + std::to_string(T + 1) +
                                " (hint: use a longer stream or a shorter model.seq_len)");
  }
  if (max_windows > 0) windows = std::min(windows, max_windows);
  std::vector<int32_t> inputs(static_cast<size_t>(mb) * T), targets(inputs.size());
  double loss_sum = 0;
  const int32_t* tok = stream.tokens.data();
  for (int64_t w = 0; w < windows; w += mb) {
    const int rows = static_cast<int>(std::min<int64_t>(mb, windows - w));
    for (int r = 0; r < rows; ++r) {
      const int32_t* src = tok + (w + r) * T;
      std::copy(src, src + T, inputs.begin() + static_cast<int64_t>(r) * T);
      std::copy(src + 1, src + T + 1, targets.begin() + static_cast<int64_t>(r) * T);
    }
    MESHRUN_ASSIGN_OR_RETURN(double loss,
                             model_->ForwardLoss(inputs.data(), targets.data(), rows, T));
    loss_sum += loss;
  }
  EvalMetrics out;
  out.step = step_;
  out.tokens = windows * T;
  out.loss = loss_sum / static_cast<double>(out.tokens);
  return out;
}

StatusOr<RunSummary> Trainer::Run(TrainObserver* observer) {
  TrainObserver none;
  if (observer == nullptr) observer = &none;
  const TrainSpec& tr = spec_.train;
  const CheckpointSpec& ck = spec_.checkpoint;
  if (!ck.dir.empty() && ck.resume == "auto") {
    Status s = LoadLatestCheckpoint(observer);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  }
  RunSummary summary;
  summary.first_step = step_ + 1;
  const int64_t last = options_.stop_after_step > 0
                           ? std::min<int64_t>(options_.stop_after_step, tr.steps)
                           : tr.steps;
  const double tokens_per_step = static_cast<double>(tr.global_batch_size) * spec_.model.seq_len;
  const double flops_per_token = GPT2FlopsPerToken(model_->config(), spec_.model.seq_len);
  double total_seconds = 0;
  CpuAllocator().ResetPeak();

  while (step_ < last) {
    StepMetrics m;
    const auto t0 = Clock::now();
    MESHRUN_ASSIGN_OR_RETURN(double loss, Step(&m));
    m.step_seconds = Seconds(t0, Clock::now());
    m.tokens_per_second = tokens_per_step / m.step_seconds;
    m.tflops = m.tokens_per_second * flops_per_token / 1e12;
    m.mfu = m.tflops * 1e12 / peak_flops_;
    const MemoryStats mem = CpuAllocator().Stats();
    m.allocated_memory_bytes = mem.allocated_bytes;
    m.peak_memory_bytes = mem.peak_bytes;
    m.reserved_memory_bytes = mem.reserved_bytes;
    observer->OnStep(m);
    summary.losses.push_back(loss);
    total_seconds += m.step_seconds;
    summary.peak_memory_bytes = std::max(summary.peak_memory_bytes, m.peak_memory_bytes);

    if (val_data_ && spec_.data.eval_every > 0 && step_ % spec_.data.eval_every == 0) {
      MESHRUN_ASSIGN_OR_RETURN(EvalMetrics e, Evaluate(*val_data_, /*max_windows=*/64));
      observer->OnEval(e);
    }
    const bool at_end = step_ == last;
    if (!ck.dir.empty() && (at_end || (ck.every > 0 && step_ % ck.every == 0))) {
      MESHRUN_RETURN_IF_ERROR(SaveCheckpoint());
      observer->OnLog("checkpoint " + last_checkpoint_);
    }
  }
  summary.steps = static_cast<int64_t>(summary.losses.size());
  summary.final_loss = summary.losses.empty() ? 0.0 : summary.losses.back();
  if (total_seconds > 0) {
    summary.tokens_per_second = tokens_per_step * static_cast<double>(summary.steps) / total_seconds;
    summary.mfu = summary.tokens_per_second * flops_per_token / peak_flops_;
  }
  for (const char* axis : {"tp", "cp", "dp_shard", "dp_replicate"}) summary.comm_bytes[axis] = 0;
  summary.last_checkpoint = last_checkpoint_;
  return summary;
}

}  // namespace meshrun
