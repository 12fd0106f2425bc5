// JobSpec <-> meshrun.v1.JobSpec, field for field (see spec_proto.h).
#include "worker/spec_proto.h"

#include <limits>
#include <string>

namespace meshrun {
namespace {

// Narrows an int64 message field to the struct's int, naming the field when it does not fit.
Status Narrow(int64_t value, const char* field, int* out) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return InvalidArgumentError(std::string(field) + ": " + std::to_string(value) +
                                " is out of range (hint: use a value below 2^31)");
  }
  *out = static_cast<int>(value);
  return OkStatus();
}

}  // namespace

v1::JobSpec JobSpecToProto(const JobSpec& spec) {
  v1::JobSpec p;
  p.set_name(spec.name);
  v1::ModelSpec* m = p.mutable_model();
  m->set_arch(spec.model.arch);
  m->set_n_layer(spec.model.n_layer);
  m->set_n_head(spec.model.n_head);
  m->set_d_model(spec.model.d_model);
  m->set_seq_len(spec.model.seq_len);
  m->set_vocab_size(spec.model.vocab_size);
  m->set_init_from(spec.model.init_from);
  v1::ParallelismSpec* par = p.mutable_parallelism();
  par->set_dp_replicate_size(spec.parallelism.dp_replicate_size);
  par->set_dp_shard_size(spec.parallelism.dp_shard_size);
  par->set_cp_size(spec.parallelism.cp_size);
  par->set_tp_size(spec.parallelism.tp_size);
  par->set_cp_comm_strategy(spec.parallelism.cp_comm_strategy);
  v1::TrainSpec* t = p.mutable_train();
  t->set_steps(spec.train.steps);
  t->set_global_batch_size(spec.train.global_batch_size);
  t->set_micro_batch_size(spec.train.micro_batch_size);
  t->set_lr(spec.train.lr);
  t->set_min_lr(spec.train.min_lr);
  t->set_warmup_steps(spec.train.warmup_steps);
  t->set_weight_decay(spec.train.weight_decay);
  t->set_grad_clip(spec.train.grad_clip);
  t->set_beta1(spec.train.beta1);
  t->set_beta2(spec.train.beta2);
  t->set_eps(spec.train.eps);
  t->set_seed(spec.train.seed);
  t->set_precision(spec.train.precision);
  v1::DataSpec* d = p.mutable_data();
  d->set_train(spec.data.train);
  d->set_val(spec.data.val);
  d->set_format(spec.data.format);
  d->set_order(spec.data.order);
  d->set_eval_every(spec.data.eval_every);
  v1::CheckpointSpec* c = p.mutable_checkpoint();
  c->set_dir(spec.checkpoint.dir);
  c->set_every(spec.checkpoint.every);
  c->set_keep(spec.checkpoint.keep);
  c->set_resume(spec.checkpoint.resume);
  p.mutable_resources()->set_device(spec.resources.device);
  p.mutable_resources()->set_threads(spec.resources.threads);
  p.mutable_restart()->set_max_restarts(spec.restart.max_restarts);
  return p;
}

StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& p) {
  JobSpec spec;
  spec.name = p.name();
  const v1::ModelSpec& m = p.model();
  if (!m.arch().empty()) spec.model.arch = m.arch();
  if (m.has_n_layer()) spec.model.n_layer = m.n_layer();
  if (m.has_n_head()) spec.model.n_head = m.n_head();
  if (m.has_d_model()) spec.model.d_model = m.d_model();
  if (m.has_seq_len()) spec.model.seq_len = m.seq_len();
  if (m.has_vocab_size()) spec.model.vocab_size = m.vocab_size();
  spec.model.init_from = m.init_from();
  const v1::ParallelismSpec& par = p.parallelism();
  spec.parallelism.dp_replicate_size = par.dp_replicate_size();
  spec.parallelism.dp_shard_size = par.dp_shard_size();
  spec.parallelism.cp_size = par.cp_size();
  spec.parallelism.tp_size = par.tp_size();
  spec.parallelism.cp_comm_strategy = par.cp_comm_strategy();
  const v1::TrainSpec& t = p.train();
  MESHRUN_RETURN_IF_ERROR(Narrow(t.steps(), "train.steps", &spec.train.steps));
  MESHRUN_RETURN_IF_ERROR(
      Narrow(t.global_batch_size(), "train.global_batch_size", &spec.train.global_batch_size));
  MESHRUN_RETURN_IF_ERROR(
      Narrow(t.micro_batch_size(), "train.micro_batch_size", &spec.train.micro_batch_size));
  spec.train.lr = t.lr();
  spec.train.min_lr = t.min_lr();
  MESHRUN_RETURN_IF_ERROR(Narrow(t.warmup_steps(), "train.warmup_steps", &spec.train.warmup_steps));
  spec.train.weight_decay = t.weight_decay();
  spec.train.grad_clip = t.grad_clip();
  spec.train.beta1 = t.beta1();
  spec.train.beta2 = t.beta2();
  spec.train.eps = t.eps();
  spec.train.seed = t.seed();
  spec.train.precision = t.precision();
  const v1::DataSpec& d = p.data();
  spec.data.train = d.train();
  spec.data.val = d.val();
  spec.data.format = d.format();
  spec.data.order = d.order();
  MESHRUN_RETURN_IF_ERROR(Narrow(d.eval_every(), "data.eval_every", &spec.data.eval_every));
  const v1::CheckpointSpec& c = p.checkpoint();
  spec.checkpoint.dir = c.dir();
  MESHRUN_RETURN_IF_ERROR(Narrow(c.every(), "checkpoint.every", &spec.checkpoint.every));
  spec.checkpoint.keep = c.keep();
  spec.checkpoint.resume = c.resume();
  spec.resources.device = p.resources().device();
  spec.resources.threads = p.resources().threads();
  spec.restart.max_restarts = p.restart().max_restarts();
  return spec;
}

}  // namespace meshrun
