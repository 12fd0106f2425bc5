// The job spec of docs/job-spec.md as plain structs with every default, the one table of its
// fields (ForEachJobSpecField), and ValidateJobSpec: ranges, enums and the mesh rules.
// Pure: no I/O. The YAML reader/writer lives in common/job_spec_yaml.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/architecture.h"
#include "common/parallel_dims.h"
#include "common/status.h"

namespace meshrun {

// train.loss_on, parsed once here (ParseLossOn); the engine reads only the enum.
enum class LossOn {
  kAll,         // every token of the data is a target (padding and sample starts excepted)
  kCompletion,  // only completion / assistant tokens (the others as transformers' -100)
};
// "all" or "completion"; anything else is INVALID_ARGUMENT naming train.loss_on.
StatusOr<LossOn> ParseLossOn(std::string_view value);

// Field names are the YAML keys, so the structs read like the spec.
struct ModelSpec {
  std::string arch = "gpt2";  // a registered family (common/architecture.h): gpt2 | llama
  int n_layer = 2;
  int n_head = 4;
  int d_model = 64;
  int seq_len = 64;
  int vocab_size = 256;
  // A Hugging Face folder (GPT-2 or Llama family, docs/checkpoints.md); empty: random init.
  std::string init_from;
  int n_kv_head = 0;  // llama: key/value heads (grouped-query attention); 0: n_head
  int d_ff = 0;       // llama: the MLP's width; 0: 4·d_model (gpt2 always 4·d_model)
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;  // llama
  // llama: rope_scaling (YAML `rope_scaling: {type: llama3, factor: …}`; none: no scaling).
  std::string rope_scaling_type = "none";  // none | llama3
  double rope_scaling_factor = 8.0;
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int rope_scaling_original_max_position_embeddings = 8192;
  // The head reads the token embedding. Left out: true for gpt2, false for llama.
  bool tie_embeddings = true;
  bool attention_bias = false;  // llama: biases on q, k and v (as Qwen2 has)
  // Sliding-window attention (Mistral's sliding_window): query i sees keys i − W < j ≤ i.
  // 0: none (the whole causal prefix).
  int sliding_window = 0;
  // The width of one attention head; 0: d_model/n_head. Families with free_head_dim only.
  int head_dim = 0;

  // The family's description (the registry's; gpt2 for a name it does not hold).
  const Architecture& family() const;
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int ff() const;          // the MLP's width: d_ff (0: 4·d_model), 4·d_model for gpt2
  int head_width() const;  // head_dim, or d_model/n_head

  bool operator==(const ModelSpec&) const = default;
};

struct ParallelismSpec {
  int dp_replicate_size = 1;
  int dp_shard_size = 1;
  int cp_size = 1;
  int tp_size = 1;
  std::string cp_comm_strategy = "allgather";  // allgather | ring
  // FSDP: free a block's gathered parameters after its forward (gathered again for its
  // backward); false keeps them until the backward (less traffic, more memory).
  bool fsdp_reshard_after_forward = true;
  // Every collective and store wait of a rank is bounded by it: a hung peer fails the attempt.
  int comm_timeout_seconds = 60;
  // `auto`: the planner chooses the four sizes (left out) for the ranks available
  // (docs/planning.md); a resolved spec has it false and the sizes set.
  bool auto_mesh = false;
  // Pipeline parallelism (docs/parallelism.md "Pipeline parallelism"): stages, the schedule
  // (1f1b | interleaved_1f1b | zero_bubble, PpScheduleOf), model chunks per rank for the
  // interleaved schedule, and the layers of each stage (empty: null, split by the engine's cost;
  // else pp_size·pp_virtual_stages entries, in pipeline order).
  int pp_size = 1;
  std::string pp_schedule = "1f1b";
  int pp_virtual_stages = 1;
  std::vector<int> pp_layers;

  bool operator==(const ParallelismSpec&) const = default;
};

struct TrainSpec {
  int steps = 20;
  int global_batch_size = 8;  // sequences per optimizer step, independent of the mesh
  int micro_batch_size = 2;   // sequences per forward/backward on one dp rank
  double lr = 3e-4;
  double min_lr = 3e-5;
  int warmup_steps = 2;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // global L2 norm; 0 disables clipping
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  int64_t seed = 1337;
  std::string precision = "fp32";  // fp32 | bf16
  // none | selective (recompute the attention core and elementwise ops in backward) | full
  // (keep only each block's input, recompute the block).
  std::string activation_checkpointing = "none";
  // adamw | lion: the update rule (docs/job-spec.md; engine code reads OptimizerOf(train)).
  std::string optimizer = "adamw";
  // Lion (train.optimizer: lion): the interpolation factor of the update's sign and the
  // momentum's decay (Chen et al. 2023's defaults).
  double lion_beta1 = 0.9;
  double lion_beta2 = 0.99;
  // all | completion: which tokens the loss is the mean over (docs/data.md "Loss masks").
  std::string loss_on = "all";
  // The enum of loss_on (kAll for a value validation would refuse).
  LossOn loss_on_mode() const {
    StatusOr<LossOn> m = ParseLossOn(loss_on);
    return m.ok() ? *m : LossOn::kAll;
  }

  bool operator==(const TrainSpec&) const = default;
};

// train.optimizer parsed once (ValidateJobSpec has checked its value): engine code switches on
// this, never on the string.
enum class OptimizerKind { kAdamW, kLion };
OptimizerKind OptimizerOf(const TrainSpec& train);
// The spec's spelling of a kind ("adamw", "lion").
const char* OptimizerName(OptimizerKind kind);

// One source of a weighted mixture (`data.train: [{path: PATH, weight: W}, …]`, docs/data.md).
struct DataSource {
  std::string path;     // the same kinds as a single data.train
  double weight = 1.0;  // > 0; the weights of a mixture are normalized by their sum

  bool operator==(const DataSource&) const = default;
};

// The most sources a mixture may list, and the smallest share of the weights' sum one may have.
inline constexpr int kMaxDataSources = 256;
inline constexpr double kMinSourceShare = 1e-6;

struct DataSpec {
  // Required: a text file, a folder of text files or a .bin file; empty when train_sources
  // holds a mixture.
  std::string train;
  // data.train written as a list: a weighted mixture of sources (docs/data.md "Mixtures").
  // Not in ForEachJobSpecField (it is not a scalar): the YAML reader and writer, the proto and
  // `validate -o json` handle it beside the table. Empty: `train` is the one source.
  std::vector<DataSource> train_sources;
  std::string val;                   // optional, same kinds
  std::string format = "auto";       // auto | text | llmc | nanogpt
  std::string order = "sequential";  // sequential | shuffled
  int eval_every = 0;                // steps between evaluations on val; 0: never
  // A Hugging Face tokenizer folder (tokenizer.json): text is tokenized with it instead of read
  // as bytes (docs/data.md "Tokenizers"). Empty: byte-level text.
  std::string tokenizer;
  // How JSONL instruction records are rendered (docs/data.md "Templates"): "" (the chat template
  // of data.tokenizer's tokenizer_config.json), chatml | llama2 | mistral | llama3, or a template
  // spelled out with {prompt} and {completion}. YAML key `template`.
  std::string chat_template;
  // causal | document: with document, no attention across the end-of-text tokens that separate
  // documents, and positions restart at each document (docs/data.md "Documents"). Read it
  // through AttentionMaskOf.
  std::string attention = "causal";

  bool operator==(const DataSpec&) const = default;
};

// data.attention parsed (the spec boundary: the engine sees only the enum).
enum class AttentionMask { kCausal, kDocument };
// The mask of a validated spec's data.attention.
AttentionMask AttentionMaskOf(const DataSpec& data);

struct CheckpointSpec {
  std::string dir;              // empty: no checkpoints
  int every = 0;                // steps between checkpoints; 0: only after the last step
  int keep = 2;                 // complete checkpoints kept
  std::string resume = "auto";  // auto | never

  bool operator==(const CheckpointSpec&) const = default;
};

struct ResourcesSpec {
  std::string device = "cpu";  // cpu | cuda
  int threads = 0;             // per rank; 0: OMP_NUM_THREADS, else all cores; ≤ kMaxThreads
  // resources.elastic (YAML `elastic: {min_ranks, max_ranks, wait_seconds}`; null: a fixed
  // world): the coordinator re-meshes the job between min_ranks and max_ranks as capacity comes
  // and goes (docs/job-spec.md "Elastic jobs", decision 0056). 0 and 0: not elastic.
  int elastic_min_ranks = 0;
  int elastic_max_ranks = 0;
  int elastic_wait_seconds = 60;  // a lost worker's replacement is waited for this long
  bool elastic() const { return elastic_min_ranks > 0 || elastic_max_ranks > 0; }

  bool operator==(const ResourcesSpec&) const = default;
};

// The most automatic restarts a job may ask for: each one re-runs the whole attempt after a
// growing backoff, so more is a loop, not resilience (docs/security.md "Limits").
inline constexpr int kMaxRestarts = 100;
// The most OpenMP threads a rank may ask for; a worker also clamps it to its --cores.
inline constexpr int kMaxThreads = 1024;

struct RestartSpec {
  int max_restarts = 0;  // at most kMaxRestarts

  bool operator==(const RestartSpec&) const = default;
};

struct JobSpec {
  std::string name = "job";
  ModelSpec model;
  ParallelismSpec parallelism;
  TrainSpec train;
  DataSpec data;
  CheckpointSpec checkpoint;
  ResourcesSpec resources;
  RestartSpec restart;

  bool operator==(const JobSpec&) const = default;
};

// The other closed sets of the spec parsed the same way (decision 0050): the string fields stay
// for YAML, proto and JSON; the engine reads these enums and never compares the strings. Each
// ...Of reads a validated spec; a value outside the set reads as the set's default (the first),
// except checkpoint.resume, where it reads as never (no resume from an unknown mode).
enum class ComputeDevice { kCpu, kCuda };                        // resources.device
enum class TrainPrecision { kFp32, kBf16 };                      // train.precision
enum class Checkpointing { kNone, kSelective, kFull };           // train.activation_checkpointing
enum class CpComm { kAllgather, kRing };                         // parallelism.cp_comm_strategy
enum class RopeScalingType { kNone, kLlama3 };                   // model.rope_scaling_type
enum class ResumeMode { kAuto, kNever };                         // checkpoint.resume
enum class DataOrder { kSequential, kShuffled };                 // data.order
enum class DataFormat { kAuto, kText, kLlmc, kNanogpt };         // data.format
enum class PpSchedule { k1F1B, kInterleaved1F1B, kZeroBubble };  // parallelism.pp_schedule
// A device name from outside a validated spec (a worker flag, an API field): nullopt if unknown.
std::optional<ComputeDevice> ParseComputeDevice(std::string_view name);
std::optional<TrainPrecision> ParseTrainPrecision(std::string_view name);
std::optional<Checkpointing> ParseCheckpointing(std::string_view name);
std::optional<DataOrder> ParseDataOrder(std::string_view name);
std::optional<DataFormat> ParseDataFormat(std::string_view name);
std::optional<PpSchedule> ParsePpSchedule(std::string_view name);
// "1f1b", "interleaved_1f1b", "zero_bubble".
const char* PpScheduleName(PpSchedule schedule);
ComputeDevice DeviceOf(const ResourcesSpec& resources);
TrainPrecision PrecisionOf(const TrainSpec& train);
Checkpointing CheckpointingOf(const TrainSpec& train);
CpComm CpCommOf(const ParallelismSpec& parallelism);
PpSchedule PpScheduleOf(const ParallelismSpec& parallelism);
// Micro-batches per optimizer step on every dp rank (and so through every pipeline):
// global_batch_size / (dp_replicate_size·dp_shard_size·micro_batch_size), the gradient
// accumulation count. 0 when the spec's sizes are not ≥ 1.
int64_t MicroBatchesPerStep(const JobSpec& spec);
ModelArch ArchOf(const ModelSpec& model);
RopeScalingType RopeScalingOf(const ModelSpec& model);
ResumeMode ResumeOf(const CheckpointSpec& checkpoint);

// Calls f(section, key, member) for every field in spec order, section "" for the top-level
// `name`; member is a bool&, int&, int64_t&, double&, std::string& or std::vector<int>& (a list
// of integers, empty meaning null: parallelism.pp_layers) (const when spec is const).
// This is the one table of the schema: the YAML reader, the writer, --set and the JSON output
// all walk it, so a new field is added here and in its struct, nowhere else.
template <typename Spec, typename F>
void ForEachJobSpecField(Spec& spec, F&& f) {
  f("", "name", spec.name);
  auto& m = spec.model;
  f("model", "arch", m.arch);
  f("model", "n_layer", m.n_layer);
  f("model", "n_head", m.n_head);
  f("model", "d_model", m.d_model);
  f("model", "seq_len", m.seq_len);
  f("model", "vocab_size", m.vocab_size);
  f("model", "init_from", m.init_from);
  f("model", "n_kv_head", m.n_kv_head);
  f("model", "d_ff", m.d_ff);
  f("model", "norm_eps", m.norm_eps);
  f("model", "rope_theta", m.rope_theta);
  f("model", "rope_scaling.type", m.rope_scaling_type);
  f("model", "rope_scaling.factor", m.rope_scaling_factor);
  f("model", "rope_scaling.low_freq_factor", m.rope_scaling_low_freq_factor);
  f("model", "rope_scaling.high_freq_factor", m.rope_scaling_high_freq_factor);
  f("model", "rope_scaling.original_max_position_embeddings",
    m.rope_scaling_original_max_position_embeddings);
  f("model", "tie_embeddings", m.tie_embeddings);
  f("model", "attention_bias", m.attention_bias);
  f("model", "sliding_window", m.sliding_window);
  f("model", "head_dim", m.head_dim);
  auto& p = spec.parallelism;
  f("parallelism", "dp_replicate_size", p.dp_replicate_size);
  f("parallelism", "dp_shard_size", p.dp_shard_size);
  f("parallelism", "cp_size", p.cp_size);
  f("parallelism", "tp_size", p.tp_size);
  f("parallelism", "cp_comm_strategy", p.cp_comm_strategy);
  f("parallelism", "fsdp_reshard_after_forward", p.fsdp_reshard_after_forward);
  f("parallelism", "comm_timeout_seconds", p.comm_timeout_seconds);
  f("parallelism", "auto", p.auto_mesh);
  f("parallelism", "pp_size", p.pp_size);
  f("parallelism", "pp_schedule", p.pp_schedule);
  f("parallelism", "pp_virtual_stages", p.pp_virtual_stages);
  f("parallelism", "pp_layers", p.pp_layers);
  auto& t = spec.train;
  f("train", "steps", t.steps);
  f("train", "global_batch_size", t.global_batch_size);
  f("train", "micro_batch_size", t.micro_batch_size);
  f("train", "lr", t.lr);
  f("train", "min_lr", t.min_lr);
  f("train", "warmup_steps", t.warmup_steps);
  f("train", "weight_decay", t.weight_decay);
  f("train", "grad_clip", t.grad_clip);
  f("train", "beta1", t.beta1);
  f("train", "beta2", t.beta2);
  f("train", "eps", t.eps);
  f("train", "seed", t.seed);
  f("train", "precision", t.precision);
  f("train", "activation_checkpointing", t.activation_checkpointing);
  f("train", "optimizer", t.optimizer);
  f("train", "lion.beta1", t.lion_beta1);
  f("train", "lion.beta2", t.lion_beta2);
  f("train", "loss_on", t.loss_on);
  auto& d = spec.data;
  f("data", "train", d.train);
  f("data", "val", d.val);
  f("data", "format", d.format);
  f("data", "order", d.order);
  f("data", "eval_every", d.eval_every);
  f("data", "tokenizer", d.tokenizer);
  f("data", "template", d.chat_template);
  f("data", "attention", d.attention);
  auto& c = spec.checkpoint;
  f("checkpoint", "dir", c.dir);
  f("checkpoint", "every", c.every);
  f("checkpoint", "keep", c.keep);
  f("checkpoint", "resume", c.resume);
  f("resources", "device", spec.resources.device);
  f("resources", "threads", spec.resources.threads);
  f("resources", "elastic.min_ranks", spec.resources.elastic_min_ranks);
  f("resources", "elastic.max_ranks", spec.resources.elastic_max_ranks);
  f("resources", "elastic.wait_seconds", spec.resources.elastic_wait_seconds);
  f("restart", "max_restarts", spec.restart.max_restarts);
}

// The training sources of `data`: train_sources when it is a list, else {train, weight 1}.
std::vector<DataSource> TrainSources(const DataSpec& data);
// The spec field of source `index` of `data`: "data.train" for a single path, else
// "data.train[INDEX]" (e.g. in errors about that source's stream).
std::string TrainSourceField(const DataSpec& data, size_t index);

// The sections of the spec in order: "model", "parallelism", ... "restart".
const std::vector<std::string>& JobSpecSections();
// The keys of one section (or of the top level for ""), in spec order; empty if unknown.
std::vector<std::string> JobSpecKeys(std::string_view section);

// The values an enum-like string field accepts, e.g. {"auto","text","llmc","nanogpt"} for
// ("data", "format"); empty for free-form fields.
std::vector<std::string> AllowedValues(std::string_view section, std::string_view key);

// `value` made safe for an error message: cut to 80 bytes, then escaped as EscapeText does
// (common/escape.h; tabs too), so that a message always stays one printable line. Quote adds
// single quotes.
std::string EscapeForMessage(std::string_view value);
std::string QuoteForMessage(std::string_view value);

// Checks every range and enum and every cross-field rule of docs/job-spec.md. nproc > 0 also
// requires the world size to equal nproc (0: not checked). Errors are INVALID_ARGUMENT with
// the message `<field.path>: <what is wrong, with the values> (hint: <how to fix>)`.
Status ValidateJobSpec(const JobSpec& spec, int nproc = 0);

// The mesh of a spec (only the sizes are checked here; ValidateJobSpec checks the rest).
StatusOr<ParallelDims> MeshOf(const JobSpec& spec);

// Elastic jobs (resources.elastic, decision 0056): the sizes `spec` runs with on `world` ranks
// when it keeps its tp and cp and changes only the data axes: dp = world / (tp·cp), dp_replicate
// the largest divisor of dp not over the spec's, dp_shard the rest; global_batch_size is kept
// (more micro-batches per rank). nullopt when no such mesh passes ValidateJobSpec.
std::optional<ParallelismSpec> ElasticDataAxesMesh(const JobSpec& spec, int world);

}  // namespace meshrun
