// JobSpec proto <-> struct conversion. Integer fields are int64 in the proto and int in
// common/, so every narrowing is checked and reported with the field's YAML path.
#include "proto/spec_convert.h"

#include <climits>
#include <string>

namespace meshrun {
namespace {

Status Invalid(const std::string& path, const std::string& what, const std::string& hint) {
  return InvalidArgumentError(path + ": " + what + " (hint: " + hint + ")");
}

Status Narrow(const std::string& path, int64_t value, int* out) {
  if (value > INT_MAX || value < INT_MIN) {
    return Invalid(path, std::to_string(value) + " is out of range",
                   "use a value below " + std::to_string(INT_MAX));
  }
  *out = static_cast<int>(value);
  return OkStatus();
}

// A model size the client may leave out only when init_from names a config.json to read it.
Status ModelSize(const std::string& key, bool has, int32_t value, bool from_init, int placeholder,
                 int* out) {
  if (has) {
    *out = value;
    return OkStatus();
  }
  if (!from_init) {
    return Invalid("model." + key, "required field is missing",
                   "set model." + key + ", or model.init_from to read it from a config.json");
  }
  *out = placeholder;
  return OkStatus();
}

}  // namespace

StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& p) {
  JobSpec s;
  s.name = p.name();

  const v1::ModelSpec& m = p.model();
  s.model.arch = m.arch();
  s.model.init_from = m.init_from();
  const bool from_init = !m.init_from().empty();
  const int tp = p.parallelism().tp_size() > 0 ? p.parallelism().tp_size() : 1;
  const int cp = p.parallelism().cp_size() > 0 ? p.parallelism().cp_size() : 1;
  MESHRUN_RETURN_IF_ERROR(
      ModelSize("n_layer", m.has_n_layer(), m.n_layer(), from_init, 1, &s.model.n_layer));
  MESHRUN_RETURN_IF_ERROR(
      ModelSize("n_head", m.has_n_head(), m.n_head(), from_init, tp, &s.model.n_head));
  MESHRUN_RETURN_IF_ERROR(ModelSize("d_model", m.has_d_model(), m.d_model(), from_init,
                                    s.model.n_head * tp, &s.model.d_model));
  MESHRUN_RETURN_IF_ERROR(
      ModelSize("seq_len", m.has_seq_len(), m.seq_len(), from_init, 2 * cp, &s.model.seq_len));
  MESHRUN_RETURN_IF_ERROR(ModelSize("vocab_size", m.has_vocab_size(), m.vocab_size(), from_init,
                                    256, &s.model.vocab_size));

  const v1::ParallelismSpec& par = p.parallelism();
  s.parallelism.dp_replicate_size = par.dp_replicate_size();
  s.parallelism.dp_shard_size = par.dp_shard_size();
  s.parallelism.cp_size = par.cp_size();
  s.parallelism.tp_size = par.tp_size();
  s.parallelism.cp_comm_strategy = par.cp_comm_strategy();

  const v1::TrainSpec& t = p.train();
  MESHRUN_RETURN_IF_ERROR(Narrow("train.steps", t.steps(), &s.train.steps));
  MESHRUN_RETURN_IF_ERROR(
      Narrow("train.global_batch_size", t.global_batch_size(), &s.train.global_batch_size));
  MESHRUN_RETURN_IF_ERROR(
      Narrow("train.micro_batch_size", t.micro_batch_size(), &s.train.micro_batch_size));
  s.train.lr = t.lr();
  s.train.min_lr = t.min_lr();
  MESHRUN_RETURN_IF_ERROR(Narrow("train.warmup_steps", t.warmup_steps(), &s.train.warmup_steps));
  s.train.weight_decay = t.weight_decay();
  s.train.grad_clip = t.grad_clip();
  s.train.beta1 = t.beta1();
  s.train.beta2 = t.beta2();
  s.train.eps = t.eps();
  s.train.seed = t.seed();
  s.train.precision = t.precision();

  const v1::DataSpec& d = p.data();
  s.data.train = d.train();
  s.data.val = d.val();
  s.data.format = d.format();
  s.data.order = d.order();
  MESHRUN_RETURN_IF_ERROR(Narrow("data.eval_every", d.eval_every(), &s.data.eval_every));

  const v1::CheckpointSpec& c = p.checkpoint();
  s.checkpoint.dir = c.dir();
  MESHRUN_RETURN_IF_ERROR(Narrow("checkpoint.every", c.every(), &s.checkpoint.every));
  s.checkpoint.keep = c.keep();
  s.checkpoint.resume = c.resume();

  s.resources.device = p.resources().device();
  s.resources.threads = p.resources().threads();
  s.restart.max_restarts = p.restart().max_restarts();
  return s;
}

v1::JobSpec JobSpecToProto(const JobSpec& s) {
  v1::JobSpec p;
  p.set_name(s.name);
  v1::ModelSpec* m = p.mutable_model();
  m->set_arch(s.model.arch);
  m->set_n_layer(s.model.n_layer);
  m->set_n_head(s.model.n_head);
  m->set_d_model(s.model.d_model);
  m->set_seq_len(s.model.seq_len);
  m->set_vocab_size(s.model.vocab_size);
  m->set_init_from(s.model.init_from);
  v1::ParallelismSpec* par = p.mutable_parallelism();
  par->set_dp_replicate_size(s.parallelism.dp_replicate_size);
  par->set_dp_shard_size(s.parallelism.dp_shard_size);
  par->set_cp_size(s.parallelism.cp_size);
  par->set_tp_size(s.parallelism.tp_size);
  par->set_cp_comm_strategy(s.parallelism.cp_comm_strategy);
  v1::TrainSpec* t = p.mutable_train();
  t->set_steps(s.train.steps);
  t->set_global_batch_size(s.train.global_batch_size);
  t->set_micro_batch_size(s.train.micro_batch_size);
  t->set_lr(s.train.lr);
  t->set_min_lr(s.train.min_lr);
  t->set_warmup_steps(s.train.warmup_steps);
  t->set_weight_decay(s.train.weight_decay);
  t->set_grad_clip(s.train.grad_clip);
  t->set_beta1(s.train.beta1);
  t->set_beta2(s.train.beta2);
  t->set_eps(s.train.eps);
  t->set_seed(s.train.seed);
  t->set_precision(s.train.precision);
  v1::DataSpec* d = p.mutable_data();
  d->set_train(s.data.train);
  d->set_val(s.data.val);
  d->set_format(s.data.format);
  d->set_order(s.data.order);
  d->set_eval_every(s.data.eval_every);
  v1::CheckpointSpec* c = p.mutable_checkpoint();
  c->set_dir(s.checkpoint.dir);
  c->set_every(s.checkpoint.every);
  c->set_keep(s.checkpoint.keep);
  c->set_resume(s.checkpoint.resume);
  p.mutable_resources()->set_device(s.resources.device);
  p.mutable_resources()->set_threads(s.resources.threads);
  p.mutable_restart()->set_max_restarts(s.restart.max_restarts);
  return p;
}

StatusOr<JobSpec> ValidateProtoJobSpec(const v1::JobSpec& proto) {
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromProto(proto));
  MESHRUN_RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

}  // namespace meshrun
