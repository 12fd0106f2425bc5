// Weighted mixtures of token streams (docs/data.md "Mixtures"): which source and which of its
// windows each sequence of a global batch is. Like BatchSampler's, the order depends only on
// (sources, weights, seed, order, step), never on the mesh or the world size.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/data/batch_sampler.h"
#include "engine/data/token_stream.h"

namespace meshrun {

// The weights as integers: q_i = round(2^30 · w_i / Σw) (Σw summed in order, round half away
// from zero). INVALID_ARGUMENT when a weight is not a finite positive number or rounds to 0.
StatusOr<std::vector<int64_t>> MixtureQuotas(const std::vector<double>& weights);

// Which source global slot g (= step·B + sequence) reads, and that source's own counter for it
// (how many slots before g read the same source).
struct MixtureSlot {
  int source = 0;
  int64_t index = 0;
};

// The deterministic weighted schedule over sources (Megatron's blended greedy, in integers):
// every source holds an error e_i, 0 at first; for each slot g = 0, 1, 2, …: every e_i += q_i,
// the source j with the largest e_j takes the slot (the lowest index on a tie), e_j −= Q with
// Q = Σq_i. Equivalently j maximizes q_j·(g+1) − Q·c_j with c_j the slots j took before g: the
// source whose count is furthest behind its share of g + 1. Thread-safe; At() is O(1) for the
// slot after the last one asked, else replays from the nearest earlier point it knows.
class MixtureSchedule {
 public:
  explicit MixtureSchedule(std::vector<int64_t> quotas);
  ~MixtureSchedule();

  MixtureSlot At(int64_t slot) const;
  // The slots each source took among slots [0, slot).
  std::vector<int64_t> CountsBefore(int64_t slot) const;
  int num_sources() const { return static_cast<int>(quotas_.size()); }

 private:
  struct Cursor;
  // Moves the cursor to `slot` (the state before it), under its lock.
  void SeekLocked(int64_t slot) const;

  std::vector<int64_t> quotas_;
  int64_t total_ = 0;
  std::unique_ptr<Cursor> cursor_;
};

// Window sampler over a weighted mixture of streams. Slot g = k·B + i (step k, sequence i) reads
// source j = schedule.At(g).source; within it, the source's counter c = schedule.At(g).index is
// the slot of source j's own window order: BatchSampler's rule (sequential or shuffled, epochs of
// that source's N_w windows) with seed + j. One source of any weight gives exactly the windows
// of BatchSampler over that stream. Does not own the streams. Thread-safe.
class MixtureSampler {
 public:
  struct Source {
    const TokenStream* stream = nullptr;
    double weight = 1.0;
  };
  // INVALID_ARGUMENT for no sources, a weight MixtureQuotas refuses, or what BatchSampler::Create
  // refuses of a stream.
  static StatusOr<MixtureSampler> Create(const std::vector<Source>& sources, int seq_len,
                                         int global_batch, uint64_t seed, Order order);

  MixtureSampler(MixtureSampler&&) noexcept;
  MixtureSampler& operator=(MixtureSampler&&) noexcept;
  ~MixtureSampler();

  // As BatchSampler::Fill: sequences [first_seq, first_seq + num_seqs) of step `step`.
  Status Fill(int64_t step, int first_seq, int num_seqs, int32_t* inputs, int32_t* targets) const;

  // Sequence `seq` of step `step`: its source, and the window in that source.
  struct Window {
    int source = 0;
    int64_t window = 0;
  };
  Window WindowOf(int64_t step, int seq) const;

  // The windows each source gave to steps [0, step): the per-source counters a run that has
  // done `step` steps continues from.
  std::vector<int64_t> CountsBefore(int64_t step) const;
  // The epoch of source j that its counter `count` falls in (count / N_w of j).
  int64_t EpochOf(int source, int64_t count) const;

  int num_sources() const { return static_cast<int>(per_source_.size()); }
  int64_t num_windows(int source) const { return per_source_[source].num_windows(); }
  const std::vector<int64_t>& quotas() const { return quotas_; }
  int global_batch() const { return global_batch_; }
  // The shuffled rule of every source (BatchSampler::set_shuffle): kFeistel unless a resumed
  // checkpoint was written under kFisherYates. Not to be called while another thread fills.
  ShuffleRule shuffle() const { return shuffle_; }
  void set_shuffle(ShuffleRule rule);

 private:
  MixtureSampler() = default;

  std::vector<BatchSampler> per_source_;  // global batch 1, seed + j
  std::vector<int64_t> quotas_;
  std::unique_ptr<MixtureSchedule> schedule_;
  int seq_len_ = 0;
  int global_batch_ = 0;
  ShuffleRule shuffle_ = ShuffleRule::kFeistel;
};

}  // namespace meshrun
