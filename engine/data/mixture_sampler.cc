// The weighted schedule over sources and the window sampler of a mixture (docs/data.md
// "Mixtures").
#include "engine/data/mixture_sampler.h"

#include <cmath>
#include <mutex>
#include <string>
#include <utility>

namespace meshrun {

StatusOr<std::vector<int64_t>> MixtureQuotas(const std::vector<double>& weights) {
  constexpr double kScale = 1073741824.0;  // 2^30
  if (weights.empty()) return InvalidArgumentError("data.train: a mixture needs a source");
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<int64_t> quotas;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double w = weights[i];
    const double q =
        std::isfinite(w) && w > 0 && std::isfinite(sum) ? std::round(w / sum * kScale) : 0.0;
    if (q < 1) {
      return InvalidArgumentError("data.train[" + std::to_string(i) +
                                  "].weight: " + std::to_string(w) +
                                  " is not a usable weight (hint: use positive weights of "
                                  "comparable size, e.g. 0.7 and 0.3)");
    }
    quotas.push_back(static_cast<int64_t>(q));
  }
  return quotas;
}

// The state before slot `slot`: the errors e_i and the counts c_i.
struct MixtureSchedule::Cursor {
  std::mutex mu;
  int64_t slot = 0;
  std::vector<int64_t> errors;
  std::vector<int64_t> counts;
};

MixtureSchedule::MixtureSchedule(std::vector<int64_t> quotas)
    : quotas_(std::move(quotas)), cursor_(std::make_unique<Cursor>()) {
  for (int64_t q : quotas_) total_ += q;
  cursor_->errors.assign(quotas_.size(), 0);
  cursor_->counts.assign(quotas_.size(), 0);
}

MixtureSchedule::~MixtureSchedule() = default;

void MixtureSchedule::SeekLocked(int64_t slot) const {
  Cursor& c = *cursor_;
  if (slot < c.slot) {  // replay from the start (the trainer only moves forward)
    c.slot = 0;
    c.errors.assign(quotas_.size(), 0);
    c.counts.assign(quotas_.size(), 0);
  }
  const size_t n = quotas_.size();
  for (; c.slot < slot; ++c.slot) {
    size_t best = 0;
    for (size_t i = 0; i < n; ++i) {
      c.errors[i] += quotas_[i];
      if (c.errors[i] > c.errors[best]) best = i;
    }
    c.errors[best] -= total_;
    ++c.counts[best];
  }
}

MixtureSlot MixtureSchedule::At(int64_t slot) const {
  if (quotas_.size() == 1) return {0, slot};
  std::lock_guard<std::mutex> lock(cursor_->mu);
  SeekLocked(slot);
  const std::vector<int64_t> before = cursor_->counts;
  SeekLocked(slot + 1);
  for (size_t i = 0; i < before.size(); ++i) {
    if (cursor_->counts[i] != before[i]) return {static_cast<int>(i), before[i]};
  }
  return {0, slot};  // unreachable: every slot goes to one source
}

std::vector<int64_t> MixtureSchedule::CountsBefore(int64_t slot) const {
  if (quotas_.size() == 1) return {slot};
  std::lock_guard<std::mutex> lock(cursor_->mu);
  SeekLocked(slot);
  return cursor_->counts;
}

MixtureSampler::MixtureSampler(MixtureSampler&&) noexcept = default;
MixtureSampler& MixtureSampler::operator=(MixtureSampler&&) noexcept = default;
MixtureSampler::~MixtureSampler() = default;

StatusOr<MixtureSampler> MixtureSampler::Create(const std::vector<Source>& sources, int seq_len,
                                                int global_batch, uint64_t seed, Order order) {
  if (global_batch < 1) {
    return InvalidArgumentError("train.global_batch_size(" + std::to_string(global_batch) +
                                ") must be >= 1");
  }
  std::vector<double> weights;
  for (const Source& s : sources) weights.push_back(s.weight);
  MESHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> quotas, MixtureQuotas(weights));
  MixtureSampler out;
  for (size_t j = 0; j < sources.size(); ++j) {
    MESHRUN_ASSIGN_OR_RETURN(
        BatchSampler sampler,
        BatchSampler::Create(sources[j].stream, seq_len, /*global_batch=*/1, seed + j, order));
    out.per_source_.push_back(std::move(sampler));
  }
  out.quotas_ = quotas;
  out.schedule_ = std::make_unique<MixtureSchedule>(std::move(quotas));
  out.seq_len_ = seq_len;
  out.global_batch_ = global_batch;
  return out;
}

MixtureSampler::Window MixtureSampler::WindowOf(int64_t step, int seq) const {
  const MixtureSlot slot = schedule_->At(step * global_batch_ + seq);
  return {slot.source, per_source_[slot.source].WindowOf(slot.index, 0)};
}

Status MixtureSampler::Fill(int64_t step, int first_seq, int num_seqs, int32_t* inputs,
                            int32_t* targets) const {
  if (step < 0 || first_seq < 0 || num_seqs < 0 || first_seq + num_seqs > global_batch_) {
    return InvalidArgumentError("MixtureSampler::Fill: step " + std::to_string(step) +
                                ", sequences [" + std::to_string(first_seq) + ", " +
                                std::to_string(first_seq + num_seqs) +
                                ") is outside a global batch of " + std::to_string(global_batch_));
  }
  const size_t t = static_cast<size_t>(seq_len_);
  for (int i = 0; i < num_seqs; ++i) {
    const MixtureSlot slot = schedule_->At(step * global_batch_ + first_seq + i);
    // The source's own order: its counter is the step of a one-sequence batch.
    MESHRUN_RETURN_IF_ERROR(
        per_source_[slot.source].Fill(slot.index, 0, 1, inputs + i * t, targets + i * t));
  }
  return OkStatus();
}

std::vector<int64_t> MixtureSampler::CountsBefore(int64_t step) const {
  return schedule_->CountsBefore(step * global_batch_);
}

void MixtureSampler::set_shuffle(ShuffleRule rule) {
  shuffle_ = rule;
  for (BatchSampler& s : per_source_) s.set_shuffle(rule);
}

int64_t MixtureSampler::EpochOf(int source, int64_t count) const {
  return count / per_source_[source].num_windows();
}

}  // namespace meshrun
