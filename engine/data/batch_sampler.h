// The window sampler of docs/data.md: which token windows form the global batch of step k,
// and the context-parallel split of a sequence. The batch of a step depends only on (data,
// seed, k, order), never on the mesh; each rank asks for its own slice of it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/data/token_stream.h"

namespace meshrun {

// data.order, parsed at the spec boundary (common/job_spec.h).
using Order = DataOrder;

// "sequential" or "shuffled"; anything else is INVALID_ARGUMENT.
StatusOr<Order> ParseOrder(const std::string& order);
const char* OrderName(Order order);

// splitmix64 (Steele, Lea, Flood 2014): a counter-based generator whose output depends only on
// its 64-bit state, so the same seed gives the same numbers on every machine and compiler.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, bound), without modulo bias (rejection). bound > 0.
  uint64_t Uniform(uint64_t bound);

 private:
  uint64_t state_;
};

// Which rule `order: shuffled` follows (docs/data.md "Windows and order", decision 0042):
//  - kFeistel (this version's): a keyed Feistel bijection over the window indices of an epoch,
//    computed per window, nothing stored;
//  - kFisherYates (checkpoints written before it): a stored Fisher–Yates permutation of the
//    epoch's windows (8 bytes a window), kept only so such a checkpoint resumes the same stream.
enum class ShuffleRule { kFeistel, kFisherYates };
// "feistel" or "fisher-yates", as a checkpoint's data record holds them.
const char* ShuffleRuleName(ShuffleRule rule);
// The inverse of ShuffleRuleName; INVALID_ARGUMENT for any other name.
StatusOr<ShuffleRule> ParseShuffleRule(const std::string& name);

// splitmix64's output function (its "mix"), a bijection of 64-bit words.
uint64_t Mix64(uint64_t z);

// The 64-bit key of epoch `epoch` under `seed`: Mix64(Mix64(seed) XOR Mix64(epoch +
// 0x632BE59BD9B4E019)), all mod 2^64.
uint64_t EpochKey(uint64_t seed, int64_t epoch);

// The shuffled order of one epoch (ShuffleRule::kFeistel): a bijection of [0, n), n ≥ 1, keyed
// by (seed, epoch). Indices are cut into two halves of h bits (h the least ≥ 1 with 4^h ≥ n);
// kRounds Feistel rounds (L, R) → (R, L XOR (Mix64(R XOR k_r) mod 2^h)) with k_r the first
// kRounds outputs of splitmix64 started at EpochKey make a permutation of [0, 4^h); cycle-walking
// (apply it again while the result is ≥ n) restricts it to [0, n). O(1) memory, and the expected
// work per index is about 4^h/n ≤ 4 cipher applications of kRounds mixes each.
class EpochShuffle {
 public:
  static constexpr int kRounds = 6;
  EpochShuffle(int64_t n, uint64_t seed, int64_t epoch);
  // The window at position `i` (0 ≤ i < n) of the epoch.
  int64_t At(int64_t i) const;

 private:
  uint64_t Encrypt(uint64_t x) const;
  uint64_t n_;
  int half_bits_;
  uint64_t mask_;
  uint64_t keys_[kRounds];
};

// The permutation of [0, n) that ShuffleRule::kFisherYates uses for epoch `epoch` under `seed`:
// a Fisher–Yates shuffle driven by SplitMix64 seeded with EpochKey(seed, epoch).
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch);

// Sequences [first, first + count) of the global batch: what one dp rank takes (docs/data.md).
struct SeqRange {
  int first = 0;
  int count = 0;
};
// dp rank d of dp_size takes [d·B/dp_size, (d+1)·B/dp_size); B must divide evenly.
StatusOr<SeqRange> DpRankRange(int global_batch, int dp_size, int dp_rank);

// Window sampler over one TokenStream. Window j is tokens [j·T, j·T + T + 1) (inputs and
// next-token targets), j < N_w = ⌊(N − 1)/T⌋. Global slot s = k·B + i (step k, sequence i):
//  - sequential: window s mod N_w;
//  - shuffled: epoch e = ⌊s / N_w⌋ covers slots [e·N_w, (e+1)·N_w); window
//    EpochShuffle(N_w, seed, e).At(s mod N_w) (or, under ShuffleRule::kFisherYates,
//    EpochPermutation(N_w, seed, e)[s mod N_w]).
// Does not own the stream (which must outlive it). Thread-safe: Fill may be called
// concurrently (kFisherYates caches the last two epoch permutations under a mutex).
// Called by the trainer (training batches) and the evaluator (all windows, sequential).
class BatchSampler {
 public:
  // INVALID_ARGUMENT when the stream has fewer than seq_len + 1 tokens or a size is < 1.
  static StatusOr<BatchSampler> Create(const TokenStream* stream, int seq_len, int global_batch,
                                       uint64_t seed, Order order);

  BatchSampler(BatchSampler&&) noexcept;
  BatchSampler& operator=(BatchSampler&&) noexcept;
  ~BatchSampler();

  // Writes sequences [first_seq, first_seq + num_seqs) of step `step`'s global batch:
  // inputs and targets are each num_seqs × seq_len, row-major.
  Status Fill(int64_t step, int first_seq, int num_seqs, int32_t* inputs, int32_t* targets) const;

  // The window index of sequence `seq` (0 ≤ seq < global_batch) of step `step` (≥ 0).
  int64_t WindowOf(int64_t step, int seq) const;

  int64_t num_windows() const { return num_windows_; }
  int seq_len() const { return seq_len_; }
  int global_batch() const { return global_batch_; }
  Order order() const { return order_; }
  uint64_t seed() const { return seed_; }
  ShuffleRule shuffle() const { return shuffle_; }
  // Chooses the shuffled rule (kFeistel unless a resumed checkpoint says otherwise); not to be
  // called while another thread fills.
  void set_shuffle(ShuffleRule rule) { shuffle_ = rule; }

 private:
  struct PermCache;
  BatchSampler(const TokenStream* stream, int seq_len, int global_batch, uint64_t seed,
               Order order);
  int64_t WindowOfSlot(int64_t slot) const;

  const TokenStream* stream_;
  int seq_len_;
  int global_batch_;
  uint64_t seed_;
  Order order_;
  ShuffleRule shuffle_ = ShuffleRule::kFeistel;
  int64_t num_windows_;
  std::unique_ptr<PermCache> cache_;
};

// Context-parallel split of one sequence (docs/data.md): the sequence is cut into 2·cp_size
// equal chunks of seq_len / (2·cp_size) tokens; cp rank c holds chunk c followed by chunk 2·cp_size
// − 1 − c. Writes seq_len / cp_size tokens to out_tokens and their global positions (0-based index
// in the sequence) to out_positions (skipped when null, e.g. for the targets). Preconditions
// (validated with the job spec): seq_len % (2·cp_size) == 0 when cp_size > 1, 0 ≤ cp_rank <
// cp_size. cp_size == 1 copies the sequence unchanged.
void CpChunk(const int32_t* seq_tokens, int seq_len, int cp_size, int cp_rank, int32_t* out_tokens,
             int32_t* out_positions);

// CpChunk for num_seqs row-major sequences of seq_len tokens; out_tokens and out_positions
// (optional) are num_seqs × seq_len / cp_size.
void CpChunkBatch(const int32_t* tokens, int num_seqs, int seq_len, int cp_size, int cp_rank,
                  int32_t* out_tokens, int32_t* out_positions);

// Checks CpChunk's preconditions; INVALID_ARGUMENT naming the values otherwise.
Status ValidateCpSplit(int seq_len, int cp_size, int cp_rank);

}  // namespace meshrun
