// The training loop of one rank: data → forward/backward over micro-batches → clip → AdamW,
// with metrics per step, periodic evaluation and checkpoints (docs/data.md, docs/checkpoints.md).
// Instrumentation reaches the outside only through TrainObserver; the math stays in Step().
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/comm/comm_stats.h"
#include "engine/comm/mesh_comms.h"
#include "engine/comm/store.h"
#include "engine/data/batch_sampler.h"
#include "engine/data/mixture_sampler.h"
#include "engine/data/token_stream.h"
#include "engine/model/gpt2.h"
#include "engine/train/optimizer.h"
#include "engine/train/sharding.h"

namespace meshrun {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of updates done after this step
  double loss = 0;   // mean loss of the step's global batch, before its update
  double lr = 0;     // learning rate of this step's update
  double grad_norm = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  double tflops = 0;
  double mfu = 0;
  int64_t allocated_memory_bytes = 0;
  int64_t peak_memory_bytes = 0;
  int64_t reserved_memory_bytes = 0;
  // Peak bytes of each MemoryKind on this rank since the run started (docs/parallelism.md).
  MemoryBreakdown memory;
  // Pipeline parallelism: the part of the step this rank waited on the other stages, its
  // communication over pp (the stage-to-stage sends and receives, then the drain; the measured
  // bubble, decision 0060; 0 without pp).
  double pipeline_bubble_ratio = 0;
  // The schedule's bubble in theory (PipelineBubbleTheory; 0 without pp), to set beside it.
  double pipeline_bubble_theory = 0;
  // Pipeline parallelism: this rank's seconds computing its operations in the step, by kind
  // (PipeOpTime: forward, backward, weight gradients, and the backward of the pipeline's last
  // chunk, which runs its forward too), each operation's own work with its tp, cp and FSDP calls
  // but not the pipeline's sends and receives, and how many of each ran: what bench/pipeline
  // replays the schedules with. Zeros without pp.
  double pipeline_op_seconds[4] = {0, 0, 0, 0};
  int pipeline_ops[4] = {0, 0, 0, 0};
  // This rank's communication by (charge, op) since its first step: seconds, bus bytes
  // (docs/parallelism.md) and calls; cumulative, like the Prometheus counters they feed.
  std::map<CommStats::Key, CommCounter> comm;
};

struct EvalMetrics {
  int64_t step = 0;
  double loss = 0;
  int64_t tokens = 0;
};

struct RunSummary {
  int64_t steps = 0;         // steps run by this process
  int64_t first_step = 0;    // 1-based number of the first step run (after a resume, > 1)
  int64_t resumed_step = 0;  // the step of the checkpoint this run resumed from (0: none)
  int64_t last_step = 0;     // updates done at the end of this run (train.steps when complete)
  // The loss of the run's last step, also when it was trained before a resume (from the
  // checkpoint's loss history); NaN when no step was ever recorded.
  double final_loss = 0;
  std::vector<double> losses;  // this process's steps only
  bool interrupted = false;    // stopped early by a stop request (SIGINT/SIGTERM)
  double tokens_per_second = 0;
  double mfu = 0;
  // The maximum over the job's ranks of: the peak of every tensor counted together, the
  // peak of each kind, and the kernel's high-water mark of the process's resident set.
  int64_t peak_memory_bytes = 0;
  MemoryBreakdown memory;
  int64_t max_rss_bytes = 0;
  std::map<MeshAxis, double> comm_bytes;  // per mesh axis (the four), per rank per step
  std::string last_checkpoint;            // step dir of the last checkpoint written
};

// Receives what the loop produces. Called on the training thread; must not throw.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void OnStep(const StepMetrics&) {}
  virtual void OnEval(const EvalMetrics&) {}
  virtual void OnLog(const std::string& /*line*/) {}
  // A complete checkpoint of `step` was written to `step_dir` (after its "checkpoint" log line).
  virtual void OnCheckpoint(int64_t /*step*/, const std::string& /*step_dir*/) {}
  // Every rank loaded `step_dir` (of `step`) before its first step: rank 0 chose it.
  virtual void OnResumed(int64_t /*step*/, const std::string& /*step_dir*/) {}
};

// Where this rank sits in the job. The default is a single rank with no communication.
struct RankContext {
  int rank = 0;
  std::shared_ptr<MeshComms> comms;  // null: one rank
  std::shared_ptr<Store> store;      // the job's store (checkpoint barriers); null: one rank
  // The GPU of this rank on cuda (RankCudaDevice: local rank mod visible GPUs; 0 when the worker
  // gave it one GPU): the model, its state and the NCCL communicators all live there.
  int cuda_device = 0;
};

struct TrainOptions {
  int64_t stop_after_step = 0;  // > 0: stop (with a checkpoint) after this step
  // Set (non-zero) by a signal handler to ask for a stop. The ranks agree at every step boundary
  // (one 8-byte gather per step over the world), so all stop after the same step, checkpoint
  // (with checkpoint.dir) and Run returns with `interrupted`. Null: never checked.
  const volatile std::sig_atomic_t* stop_requested = nullptr;
  double peak_flops = 0;  // device peak for MFU; 0: measure a float32 GEMM at start
  std::string spec_yaml;  // the resolved spec, stored in checkpoint metadata
  // Recorded in every checkpoint this run writes; checkpoint.keep prunes only folders with
  // the same owner (PruneCheckpoints). A cluster job's id; "" for a standalone run.
  std::string checkpoint_owner;
  // Pipeline parallelism: run the lockstep timetable (what a device backend runs) even on a host
  // backend, instead of the asynchronous executor (decision 0064). Same results bit for bit;
  // for tests and bench/pipeline, which compare the two. The memory model predicts the
  // asynchronous executor's memory.
  bool pipeline_lockstep = false;
  // Counting (engine/train/counted_step.h): the rank runs on the counting device, which
  // allocates and computes nothing; data.train and data.val are not read (each stream is
  // `counting_tokens` zeros, at least a batch and a window), no device is checked and no GEMM
  // peak measured. What the run allocates, by kind, is what the real run allocates.
  bool counting = false;
};

// Owns the model, optimizer state and data of one rank. Not thread-safe; one per process.
class Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Create(const JobSpec& spec, TrainOptions options,
                                                   RankContext context = {});

  // Resumes when the spec asks for it, then trains to the last step (or stop_after_step).
  StatusOr<RunSummary> Run(TrainObserver* observer);

  // Mean loss over the windows of `stream` (docs/data.md windows, in batches): all of them
  // on one rank; on a mesh, the first multiple of dp·micro_batch_size of them (at most
  // max_windows when > 0), split over the dp ranks.
  StatusOr<EvalMetrics> Evaluate(const TokenStream& stream, int64_t max_windows);

  GPT2<float>& model() { return *model_; }
  int64_t step() const { return step_; }
  Status SaveCheckpoint();
  // The one decision of where a run resumes (decision 0048): rank 0 finds the newest complete
  // checkpoint under checkpoint.dir (FindLatestComplete, the one completeness rule), every rank
  // learns its step over the world and loads it; OnResumed tells the observer. NOT_FOUND when
  // there is none (then every rank starts fresh).
  Status LoadLatestCheckpoint(TrainObserver* observer);
  Status LoadCheckpoint(const std::string& step_dir);
  // LoadCheckpoint, then the "resumed from …" log line.
  Status ResumeFrom(const std::string& step_dir, TrainObserver* observer);

 private:
  Trainer(JobSpec spec, TrainOptions options, RankContext context);
  Status Init();
  Communicator* Comm(MeshAxis axis) const;
  // Inputs/targets/positions of this rank's tokens for `rows` full sequences (cp chunks).
  // With data.attention: document, doc_starts_ holds the rows' document starts first.
  void LocalTokens(const int32_t* inputs, const int32_t* targets, int rows);
  // data.attention: document: where each local token's document starts (doc_starts_, of the
  // whole sequences, so every cp rank agrees), for the model's next forward.
  void LocalDocuments(int rows);
  Status WaitForAllRanks(const std::string& key);
  // One optimizer step over the global batch of step_ (0-based); returns the mean loss.
  StatusOr<double> Step(StepMetrics* metrics);
  // Whether any rank was asked to stop (the same answer on every rank).
  StatusOr<bool> StopAgreed();
  // The element-wise maximum of `values` over every rank of the job (the same on every rank).
  StatusOr<std::vector<double>> MaxOverRanks(std::vector<double> values);
  // The sum of `value` over every rank of the job: over tp, dp_cp, then the pipeline's stages.
  StatusOr<double> SumOverWorld(double value, CommCharge charge);
  // The step's schedules: each runs the step's micro-batches through the model's stage-scoped
  // calls, fill(m) first putting micro-batch m's tokens in local_in_/local_tg_/local_pos_ (and
  // its document starts in the model), and adds the loss sum to *loss_sum. Step uses the same
  // fill for both.
  // One stage (pp 1): each micro-batch's forward and backward in turn (ForwardBackward, the
  // whole model as one stage: embedding, every block, head and loss).
  Status OneStageMicroBatches(int micro_batches, const std::function<Status(int)>& fill,
                              double grad_scale, double* loss_sum);
  // Pipeline parallelism (decision 0054): this stage's schedule over the step's micro-batches
  // (engine/train/pipeline.h), activations and their gradients sent stage to stage over pp. The
  // stage's loss sum is the last stage's; 0 elsewhere.
  Status PipelineMicroBatches(int micro_batches, const std::function<Status(int)>& fill,
                              double grad_scale, double* loss_sum);
  // Tied embeddings across the first and last stage: their embedding units' gradient shards are
  // summed between the two, so both copies take the same update (decision 0054).
  Status SyncTiedEmbedding();

  JobSpec spec_;
  TrainOptions options_;
  RankContext ctx_;
  std::optional<ParallelDims> dims_;
  MeshCoords coords_;
  std::unique_ptr<GPT2<float>> model_;
  ModelParallel model_par_;
  std::unique_ptr<ShardedState> shards_;
  std::unique_ptr<Optimizer> optimizer_;  // over shards_'s buffers (train.optimizer)
  std::vector<int32_t> local_in_, local_tg_, local_pos_;
  // Pipeline parallelism: this rank's stage, each in-flight micro-batch's input (received from
  // the previous stage) and the gradient of this stage's output (from the next one).
  int stage_ = 0;
  std::vector<Tensor> pipe_inputs_, pipe_output_grads_;
  // The buffers those come in: taken from this free list when a receive is posted and given back
  // once the backward that reads them ran, so a stage holds only its micro-batches in flight
  // (the memory model counts them: engine/train/memory_model.h).
  std::vector<Tensor> pipe_free_;
  float* TakePipeBuffer(Tensor& t, size_t floats);
  void GivePipeBuffer(Tensor& t);
  // The asynchronous executor's send buffers (PipelineSendBuffers; decision 0064): each output
  // sent is copied into the next of them, reused once its last send was waited for.
  std::vector<Tensor> pipe_send_;
  Tensor pipe_tied_;
  // Seconds this rank spent in the step's pipeline sends and receives (waiting on the stage
  // before or after it included): the measured bubble, StepMetrics::pipeline_bubble_ratio.
  double pipe_wait_seconds_ = 0;
  // The step's operations by kind (forward, backward, weight): seconds and count.
  double pipe_op_seconds_[4] = {0, 0, 0, 0};
  int pipe_ops_[4] = {0, 0, 0, 0};
  // data.attention: document: the end-of-text id that ends a document; -1: causal only.
  int32_t document_end_ = -1;
  // Per token of the current rows (rows·T): where its document starts in its window, from the
  // stream's sample starts where it has flags, else from the end-of-text token (trainer.cc,
  // WindowDocumentStarts); doc_flags_ is its scratch.
  std::vector<int32_t> doc_starts_;
  std::vector<uint8_t> doc_flags_;
  std::vector<std::unique_ptr<TokenStream>> train_data_;  // one per source of data.train
  std::unique_ptr<TokenStream> val_data_;
  std::unique_ptr<MixtureSampler> sampler_;
  // Some target is ignored (train.loss_on completion, or a stream with flags): Step counts
  // and masks the targets of each window.
  bool masked_ = false;
  int64_t step_ = 0;                  // updates done so far
  std::vector<double> loss_history_;  // the loss of every step so far, resumed ones included
  double peak_flops_ = 0;
  std::string last_checkpoint_;
  // The init_from identity (trainer_json "source") of the checkpoint resumed from, kept for the
  // next checkpoints when the folder can no longer be read.
  std::string resumed_source_;
};

// The CPU "peak" of a rank that MFU is measured against (common/mfu.h): the float32 GEMM rate of
// one core (measured once per process) times the current thread count, in FLOP/s.
double MeasureCpuGemmPeakFlops();

// Loads a Hugging Face folder (model.init_from) into this rank's shard after checking its
// config.json against `cfg`; each rank reads only its own slices (engine/model/hf_checkpoint.h).
Status LoadHuggingFaceShard(const std::string& dir, const GPT2Config& cfg, ShardedState* shards);
// The eos_token_id of a Hugging Face folder's config.json (the first of a list); -1: none.
int32_t HuggingFaceEosId(const std::string& dir);

// The resume check every rank runs when it loads a checkpoint, and `meshrun validate`/`train`
// before any rank starts: every model tensor of `spec`'s model is in the checkpoint `step_dir`
// with its shape. INVALID_ARGUMENT naming checkpoint.dir, the tensor and both shapes.
Status CheckResumeFits(const std::string& step_dir, const JobSpec& spec);

}  // namespace meshrun
