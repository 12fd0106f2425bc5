// Window sampling (sequential and seeded-shuffled) and the context-parallel chunk split.
#include "engine/data/batch_sampler.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <utility>

#include "common/parallel_dims.h"

namespace meshrun {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t EpochKey(uint64_t seed, int64_t epoch) {
  return Mix64(seed) ^ Mix64(static_cast<uint64_t>(epoch) + 0x632BE59BD9B4E019ULL);
}

const char* ShuffleRuleName(ShuffleRule rule) {
  return rule == ShuffleRule::kFeistel ? "feistel" : "fisher-yates";
}

StatusOr<ShuffleRule> ParseShuffleRule(const std::string& name) {
  if (name == "feistel") return ShuffleRule::kFeistel;
  if (name == "fisher-yates") return ShuffleRule::kFisherYates;
  return InvalidArgumentError("unknown shuffle rule '" + name + "'");
}

EpochShuffle::EpochShuffle(int64_t n, uint64_t seed, int64_t epoch)
    : n_(static_cast<uint64_t>(std::max<int64_t>(n, 1))), half_bits_(1) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
  mask_ = half_bits_ == 32 ? 0xFFFFFFFFULL : (uint64_t{1} << half_bits_) - 1;
  SplitMix64 rng(EpochKey(seed, epoch));
  for (uint64_t& k : keys_) k = rng.Next();
}

uint64_t EpochShuffle::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & mask_;
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ (Mix64(right ^ k) & mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t EpochShuffle::At(int64_t i) const {
  // Cycle-walking: the cipher permutes [0, 4^h) ⊇ [0, n); following i's cycle until it is back
  // inside [0, n) gives a permutation of [0, n). 4^h ≤ 4n, so this takes about 4^h/n ≤ 4 steps on
  // average.
  uint64_t y = Encrypt(static_cast<uint64_t>(i));
  while (y >= n_) y = Encrypt(y);
  return static_cast<int64_t>(y);
}

StatusOr<Order> ParseOrder(const std::string& order) {
  if (const std::optional<DataOrder> parsed = ParseDataOrder(order)) return *parsed;
  return InvalidArgumentError("unknown data order '" + order +
                              "' (hint: use sequential or shuffled)");
}

const char* OrderName(Order order) {
  return order == Order::kSequential ? "sequential" : "shuffled";
}

uint64_t SplitMix64::Next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  return Mix64(state_);
}

uint64_t SplitMix64::Uniform(uint64_t bound) {
  // Reject the low values that would make `r % bound` favour small results (as in Lemire's and
  // PCG's bounded generators): the accepted range is a whole number of copies of [0, bound).
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = Next();
    if (r >= threshold) return r % bound;
  }
}

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SplitMix64 rng(EpochKey(seed, epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

StatusOr<SeqRange> DpRankRange(int global_batch, int dp_size, int dp_rank) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    return InvalidArgumentError("dp rank " + std::to_string(dp_rank) + " of dp size " +
                                std::to_string(dp_size) + " is out of range");
  }
  if (global_batch < 1 || global_batch % dp_size != 0) {
    return InvalidArgumentError("train.global_batch_size(" + std::to_string(global_batch) +
                                ") is not a multiple of the dp size (" + std::to_string(dp_size) +
                                ") (hint: make the batch a multiple of dp_replicate_size × "
                                "dp_shard_size)");
  }
  const int per_rank = global_batch / dp_size;
  return SeqRange{dp_rank * per_rank, per_rank};
}

// kFisherYates: the permutations of the two most recently used epochs (a step may straddle two
// epochs). Empty under kFeistel.
struct BatchSampler::PermCache {
  std::mutex mu;
  int64_t epochs[2] = {-1, -1};
  std::vector<int64_t> perms[2];
  int next = 0;  // which entry to replace next
};

BatchSampler::BatchSampler(const TokenStream* stream, int seq_len, int global_batch, uint64_t seed,
                           Order order)
    : stream_(stream),
      seq_len_(seq_len),
      global_batch_(global_batch),
      seed_(seed),
      order_(order),
      num_windows_((stream->size() - 1) / seq_len),
      cache_(std::make_unique<PermCache>()) {}

BatchSampler::BatchSampler(BatchSampler&&) noexcept = default;
BatchSampler& BatchSampler::operator=(BatchSampler&&) noexcept = default;
BatchSampler::~BatchSampler() = default;

StatusOr<BatchSampler> BatchSampler::Create(const TokenStream* stream, int seq_len,
                                            int global_batch, uint64_t seed, Order order) {
  if (stream == nullptr) return InvalidArgumentError("BatchSampler: no token stream");
  if (seq_len < 1) {
    return InvalidArgumentError("model.seq_len(" + std::to_string(seq_len) + ") must be >= 1");
  }
  if (global_batch < 1) {
    return InvalidArgumentError("train.global_batch_size(" + std::to_string(global_batch) +
                                ") must be >= 1");
  }
  if (stream->size() < static_cast<int64_t>(seq_len) + 1) {
    return InvalidArgumentError(stream->path + ": " + std::to_string(stream->size()) +
                                " tokens is too short for one " + "window of seq_len(" +
                                std::to_string(seq_len) + ") + 1 tokens (hint: use more data or " +
                                "a smaller model.seq_len)");
  }
  return BatchSampler(stream, seq_len, global_batch, seed, order);
}

int64_t BatchSampler::WindowOfSlot(int64_t slot) const {
  const int64_t pos = slot % num_windows_;
  if (order_ == Order::kSequential) return pos;
  const int64_t epoch = slot / num_windows_;
  if (shuffle_ == ShuffleRule::kFeistel) return EpochShuffle(num_windows_, seed_, epoch).At(pos);
  std::lock_guard<std::mutex> lock(cache_->mu);
  for (int i = 0; i < 2; ++i) {
    if (cache_->epochs[i] == epoch) return cache_->perms[i][pos];
  }
  const int i = cache_->next;
  cache_->next = 1 - i;
  cache_->epochs[i] = epoch;
  cache_->perms[i] = EpochPermutation(num_windows_, seed_, epoch);
  return cache_->perms[i][pos];
}

int64_t BatchSampler::WindowOf(int64_t step, int seq) const {
  return WindowOfSlot(step * global_batch_ + seq);
}

Status BatchSampler::Fill(int64_t step, int first_seq, int num_seqs, int32_t* inputs,
                          int32_t* targets) const {
  if (step < 0 || first_seq < 0 || num_seqs < 0 || first_seq + num_seqs > global_batch_) {
    return InvalidArgumentError("BatchSampler::Fill: step " + std::to_string(step) +
                                ", sequences [" + std::to_string(first_seq) + ", " +
                                std::to_string(first_seq + num_seqs) +
                                ") is outside a global batch of " + std::to_string(global_batch_));
  }
  const size_t t = static_cast<size_t>(seq_len_);
  for (int i = 0; i < num_seqs; ++i) {
    // Read converts only this window's tokens (a mapped stream is never read whole).
    const int64_t begin = WindowOf(step, first_seq + i) * seq_len_;
    MESHRUN_RETURN_IF_ERROR(stream_->Read(begin, seq_len_, inputs + i * t));
    MESHRUN_RETURN_IF_ERROR(stream_->Read(begin + 1, seq_len_, targets + i * t));
  }
  return OkStatus();
}

Status ValidateCpSplit(int seq_len, int cp_size, int cp_rank) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    return InvalidArgumentError("cp rank " + std::to_string(cp_rank) + " of cp_size " +
                                std::to_string(cp_size) + " is out of range");
  }
  if (cp_size > 1 && seq_len % (2 * cp_size) != 0) {
    return InvalidArgumentError(
        "model.seq_len(" + std::to_string(seq_len) + ") is not a multiple of 2·cp_size(" +
        std::to_string(cp_size) + ") = " + std::to_string(2 * cp_size) +
        " (hint: pick a seq_len divisible by " + std::to_string(2 * cp_size) + ")");
  }
  return OkStatus();
}

void CpChunk(const int32_t* seq_tokens, int seq_len, int cp_size, int cp_rank, int32_t* out_tokens,
             int32_t* out_positions) {
  if (cp_size == 1) {
    std::memcpy(out_tokens, seq_tokens, static_cast<size_t>(seq_len) * sizeof(int32_t));
    if (out_positions) std::iota(out_positions, out_positions + seq_len, 0);
    return;
  }
  const int chunk = seq_len / (2 * cp_size);
  const int starts[2] = {CpChunkIndex(cp_size, cp_rank, 0) * chunk,
                         CpChunkIndex(cp_size, cp_rank, 1) * chunk};
  for (int half = 0; half < 2; ++half) {
    std::memcpy(out_tokens + half * chunk, seq_tokens + starts[half],
                static_cast<size_t>(chunk) * sizeof(int32_t));
    if (out_positions) {
      std::iota(out_positions + half * chunk, out_positions + (half + 1) * chunk, starts[half]);
    }
  }
}

void CpChunkBatch(const int32_t* tokens, int num_seqs, int seq_len, int cp_size, int cp_rank,
                  int32_t* out_tokens, int32_t* out_positions) {
  const int local = seq_len / cp_size;
  for (int s = 0; s < num_seqs; ++s) {
    CpChunk(tokens + static_cast<size_t>(s) * seq_len, seq_len, cp_size, cp_rank,
            out_tokens + static_cast<size_t>(s) * local,
            out_positions ? out_positions + static_cast<size_t>(s) * local : nullptr);
  }
}

}  // namespace meshrun
