// JobSpec proto <-> struct conversion. Unset fields take common/'s defaults (the YAML ones);
// integer fields are int64 in the proto and int in common/, so every narrowing is checked and
// reported with the field's YAML path.
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

// A field the client set replaces the default already in *out; an unset one keeps it.
template <typename T, typename V>
void SetIfPresent(bool has, const V& value, T* out) {
  if (has) *out = static_cast<T>(value);
}

Status NarrowIfPresent(const std::string& path, bool has, int64_t value, int* out) {
  return has ? Narrow(path, value, out) : OkStatus();
}

}  // namespace

StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& p) {
  // Every field starts at the default of common/job_spec.h, the one table of defaults that the
  // YAML parser uses too: a field the message leaves unset resolves exactly as a field left out
  // of a YAML spec.
  JobSpec s;
  SetIfPresent(p.has_name(), p.name(), &s.name);

  const v1::ModelSpec& m = p.model();
  SetIfPresent(m.has_arch(), m.arch(), &s.model.arch);
  SetIfPresent(m.has_init_from(), m.init_from(), &s.model.init_from);
  SetIfPresent(m.has_n_layer(), m.n_layer(), &s.model.n_layer);
  SetIfPresent(m.has_n_head(), m.n_head(), &s.model.n_head);
  SetIfPresent(m.has_d_model(), m.d_model(), &s.model.d_model);
  SetIfPresent(m.has_seq_len(), m.seq_len(), &s.model.seq_len);
  SetIfPresent(m.has_vocab_size(), m.vocab_size(), &s.model.vocab_size);
  SetIfPresent(m.has_n_kv_head(), m.n_kv_head(), &s.model.n_kv_head);
  SetIfPresent(m.has_d_ff(), m.d_ff(), &s.model.d_ff);
  SetIfPresent(m.has_norm_eps(), m.norm_eps(), &s.model.norm_eps);
  SetIfPresent(m.has_rope_theta(), m.rope_theta(), &s.model.rope_theta);
  SetIfPresent(m.has_rope_scaling_type(), m.rope_scaling_type(), &s.model.rope_scaling_type);
  SetIfPresent(m.has_rope_scaling_factor(), m.rope_scaling_factor(), &s.model.rope_scaling_factor);
  SetIfPresent(m.has_rope_scaling_low_freq_factor(), m.rope_scaling_low_freq_factor(),
               &s.model.rope_scaling_low_freq_factor);
  SetIfPresent(m.has_rope_scaling_high_freq_factor(), m.rope_scaling_high_freq_factor(),
               &s.model.rope_scaling_high_freq_factor);
  SetIfPresent(m.has_rope_scaling_original_max_position_embeddings(),
               m.rope_scaling_original_max_position_embeddings(),
               &s.model.rope_scaling_original_max_position_embeddings);
  // Left out: true for gpt2, false for llama (as in YAML).
  s.model.tie_embeddings =
      m.has_tie_embeddings() ? m.tie_embeddings() : s.model.family().tied_by_default;
  SetIfPresent(m.has_attention_bias(), m.attention_bias(), &s.model.attention_bias);
  SetIfPresent(m.has_sliding_window(), m.sliding_window(), &s.model.sliding_window);
  SetIfPresent(m.has_head_dim(), m.head_dim(), &s.model.head_dim);

  const v1::ParallelismSpec& par = p.parallelism();
  SetIfPresent(par.has_dp_replicate_size(), par.dp_replicate_size(),
               &s.parallelism.dp_replicate_size);
  SetIfPresent(par.has_dp_shard_size(), par.dp_shard_size(), &s.parallelism.dp_shard_size);
  SetIfPresent(par.has_cp_size(), par.cp_size(), &s.parallelism.cp_size);
  SetIfPresent(par.has_tp_size(), par.tp_size(), &s.parallelism.tp_size);
  SetIfPresent(par.has_cp_comm_strategy(), par.cp_comm_strategy(), &s.parallelism.cp_comm_strategy);
  SetIfPresent(par.has_fsdp_reshard_after_forward(), par.fsdp_reshard_after_forward(),
               &s.parallelism.fsdp_reshard_after_forward);
  SetIfPresent(par.has_comm_timeout_seconds(), par.comm_timeout_seconds(),
               &s.parallelism.comm_timeout_seconds);
  SetIfPresent(par.has_auto_(), par.auto_(), &s.parallelism.auto_mesh);
  SetIfPresent(par.has_pp_size(), par.pp_size(), &s.parallelism.pp_size);
  SetIfPresent(par.has_pp_schedule(), par.pp_schedule(), &s.parallelism.pp_schedule);
  SetIfPresent(par.has_pp_virtual_stages(), par.pp_virtual_stages(),
               &s.parallelism.pp_virtual_stages);
  s.parallelism.pp_layers.assign(par.pp_layers().begin(), par.pp_layers().end());

  if (!s.model.init_from.empty()) {
    // Sizes left out are read from init_from's config.json by the rank (rank/spec_intake.h);
    // until then they hold placeholders that satisfy every mesh rule, so that validation here
    // checks the rest of the spec.
    const int tp = s.parallelism.tp_size > 0 ? s.parallelism.tp_size : 1;
    const int cp = s.parallelism.cp_size > 0 ? s.parallelism.cp_size : 1;
    if (!m.has_n_layer()) {
      // One layer per pipeline chunk (or pp_layers' sum) until config.json says.
      int64_t layers = int64_t{std::max(s.parallelism.pp_size, 1)} *
                       std::max(s.parallelism.pp_virtual_stages, 1);
      if (!s.parallelism.pp_layers.empty()) {
        layers = 0;
        for (int n : s.parallelism.pp_layers) layers += n;
      }
      s.model.n_layer = static_cast<int>(std::clamp<int64_t>(layers, 1, 1 << 20));
    }
    if (!m.has_n_head()) s.model.n_head = tp;
    if (!m.has_d_model()) s.model.d_model = s.model.n_head * tp;
    if (!m.has_seq_len()) s.model.seq_len = 2 * cp;
    if (!m.has_vocab_size()) s.model.vocab_size = 256;
  }

  const v1::TrainSpec& t = p.train();
  MESHRUN_RETURN_IF_ERROR(NarrowIfPresent("train.steps", t.has_steps(), t.steps(), &s.train.steps));
  MESHRUN_RETURN_IF_ERROR(NarrowIfPresent("train.global_batch_size", t.has_global_batch_size(),
                                          t.global_batch_size(), &s.train.global_batch_size));
  MESHRUN_RETURN_IF_ERROR(NarrowIfPresent("train.micro_batch_size", t.has_micro_batch_size(),
                                          t.micro_batch_size(), &s.train.micro_batch_size));
  SetIfPresent(t.has_lr(), t.lr(), &s.train.lr);
  SetIfPresent(t.has_min_lr(), t.min_lr(), &s.train.min_lr);
  MESHRUN_RETURN_IF_ERROR(NarrowIfPresent("train.warmup_steps", t.has_warmup_steps(),
                                          t.warmup_steps(), &s.train.warmup_steps));
  SetIfPresent(t.has_weight_decay(), t.weight_decay(), &s.train.weight_decay);
  SetIfPresent(t.has_grad_clip(), t.grad_clip(), &s.train.grad_clip);
  SetIfPresent(t.has_beta1(), t.beta1(), &s.train.beta1);
  SetIfPresent(t.has_beta2(), t.beta2(), &s.train.beta2);
  SetIfPresent(t.has_eps(), t.eps(), &s.train.eps);
  SetIfPresent(t.has_seed(), t.seed(), &s.train.seed);
  SetIfPresent(t.has_precision(), t.precision(), &s.train.precision);
  SetIfPresent(t.has_activation_checkpointing(), t.activation_checkpointing(),
               &s.train.activation_checkpointing);
  SetIfPresent(t.has_optimizer(), t.optimizer(), &s.train.optimizer);
  SetIfPresent(t.has_lion_beta1(), t.lion_beta1(), &s.train.lion_beta1);
  SetIfPresent(t.has_lion_beta2(), t.lion_beta2(), &s.train.lion_beta2);
  SetIfPresent(t.has_loss_on(), t.loss_on(), &s.train.loss_on);

  const v1::DataSpec& d = p.data();
  SetIfPresent(d.has_train(), d.train(), &s.data.train);
  for (const v1::DataSource& source : d.train_sources()) {
    DataSource out;
    out.path = source.path();
    if (source.has_weight()) out.weight = source.weight();
    s.data.train_sources.push_back(std::move(out));
  }
  SetIfPresent(d.has_val(), d.val(), &s.data.val);
  SetIfPresent(d.has_format(), d.format(), &s.data.format);
  SetIfPresent(d.has_order(), d.order(), &s.data.order);
  SetIfPresent(d.has_tokenizer(), d.tokenizer(), &s.data.tokenizer);
  SetIfPresent(d.has_template_(), d.template_(), &s.data.chat_template);
  SetIfPresent(d.has_attention(), d.attention(), &s.data.attention);
  MESHRUN_RETURN_IF_ERROR(
      NarrowIfPresent("data.eval_every", d.has_eval_every(), d.eval_every(), &s.data.eval_every));

  const v1::CheckpointSpec& c = p.checkpoint();
  SetIfPresent(c.has_dir(), c.dir(), &s.checkpoint.dir);
  MESHRUN_RETURN_IF_ERROR(
      NarrowIfPresent("checkpoint.every", c.has_every(), c.every(), &s.checkpoint.every));
  SetIfPresent(c.has_keep(), c.keep(), &s.checkpoint.keep);
  SetIfPresent(c.has_resume(), c.resume(), &s.checkpoint.resume);

  const v1::ResourcesSpec& r = p.resources();
  SetIfPresent(r.has_device(), r.device(), &s.resources.device);
  SetIfPresent(r.has_threads(), r.threads(), &s.resources.threads);
  SetIfPresent(r.has_elastic_min_ranks(), r.elastic_min_ranks(), &s.resources.elastic_min_ranks);
  SetIfPresent(r.has_elastic_max_ranks(), r.elastic_max_ranks(), &s.resources.elastic_max_ranks);
  SetIfPresent(r.has_elastic_wait_seconds(), r.elastic_wait_seconds(),
               &s.resources.elastic_wait_seconds);
  SetIfPresent(p.restart().has_max_restarts(), p.restart().max_restarts(), &s.restart.max_restarts);
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
  m->set_n_kv_head(s.model.n_kv_head);
  m->set_d_ff(s.model.d_ff);
  m->set_norm_eps(s.model.norm_eps);
  m->set_rope_theta(s.model.rope_theta);
  m->set_rope_scaling_type(s.model.rope_scaling_type);
  m->set_rope_scaling_factor(s.model.rope_scaling_factor);
  m->set_rope_scaling_low_freq_factor(s.model.rope_scaling_low_freq_factor);
  m->set_rope_scaling_high_freq_factor(s.model.rope_scaling_high_freq_factor);
  m->set_rope_scaling_original_max_position_embeddings(
      s.model.rope_scaling_original_max_position_embeddings);
  m->set_tie_embeddings(s.model.tie_embeddings);
  m->set_attention_bias(s.model.attention_bias);
  m->set_sliding_window(s.model.sliding_window);
  m->set_head_dim(s.model.head_dim);
  v1::ParallelismSpec* par = p.mutable_parallelism();
  par->set_dp_replicate_size(s.parallelism.dp_replicate_size);
  par->set_dp_shard_size(s.parallelism.dp_shard_size);
  par->set_cp_size(s.parallelism.cp_size);
  par->set_tp_size(s.parallelism.tp_size);
  par->set_cp_comm_strategy(s.parallelism.cp_comm_strategy);
  par->set_fsdp_reshard_after_forward(s.parallelism.fsdp_reshard_after_forward);
  par->set_comm_timeout_seconds(s.parallelism.comm_timeout_seconds);
  par->set_auto_(s.parallelism.auto_mesh);
  par->set_pp_size(s.parallelism.pp_size);
  par->set_pp_schedule(s.parallelism.pp_schedule);
  par->set_pp_virtual_stages(s.parallelism.pp_virtual_stages);
  for (int n : s.parallelism.pp_layers) par->add_pp_layers(n);
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
  t->set_activation_checkpointing(s.train.activation_checkpointing);
  t->set_optimizer(s.train.optimizer);
  t->set_lion_beta1(s.train.lion_beta1);
  t->set_lion_beta2(s.train.lion_beta2);
  t->set_loss_on(s.train.loss_on);
  v1::DataSpec* d = p.mutable_data();
  d->set_train(s.data.train);
  for (const DataSource& source : s.data.train_sources) {
    v1::DataSource* out = d->add_train_sources();
    out->set_path(source.path);
    out->set_weight(source.weight);
  }
  d->set_val(s.data.val);
  d->set_format(s.data.format);
  d->set_order(s.data.order);
  d->set_eval_every(s.data.eval_every);
  d->set_tokenizer(s.data.tokenizer);
  d->set_template_(s.data.chat_template);
  d->set_attention(s.data.attention);
  v1::CheckpointSpec* c = p.mutable_checkpoint();
  c->set_dir(s.checkpoint.dir);
  c->set_every(s.checkpoint.every);
  c->set_keep(s.checkpoint.keep);
  c->set_resume(s.checkpoint.resume);
  p.mutable_resources()->set_device(s.resources.device);
  p.mutable_resources()->set_threads(s.resources.threads);
  if (s.resources.elastic()) {  // a fixed-world spec's message stays as it was
    p.mutable_resources()->set_elastic_min_ranks(s.resources.elastic_min_ranks);
    p.mutable_resources()->set_elastic_max_ranks(s.resources.elastic_max_ranks);
    p.mutable_resources()->set_elastic_wait_seconds(s.resources.elastic_wait_seconds);
  }
  p.mutable_restart()->set_max_restarts(s.restart.max_restarts);
  return p;
}

StatusOr<JobSpec> ValidateProtoJobSpec(const v1::JobSpec& proto) {
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromProto(proto));
  MESHRUN_RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

v1::JobSpec ResolvedJobSpecProto(const v1::JobSpec& submitted, const JobSpec& resolved) {
  v1::JobSpec p = JobSpecToProto(resolved);
  p.set_source_yaml(submitted.source_yaml());
  *p.mutable_set_overrides() = submitted.set_overrides();
  p.set_auto_choice(submitted.auto_choice());
  p.set_predicted_step_seconds(submitted.predicted_step_seconds());
  p.set_predicted_peak_memory_bytes(submitted.predicted_peak_memory_bytes());
  if (!resolved.model.init_from.empty()) {
    // The model fields the client left to config.json stay unset (arch and tie_embeddings
    // included, whose defaults depend on it): each rank reads them (rank/spec_intake.h).
    *p.mutable_model() = submitted.model();
    p.mutable_model()->set_init_from(resolved.model.init_from);
  }
  return p;
}

bool ModelSizesSent(const v1::JobSpec& proto) {
  const v1::ModelSpec& m = proto.model();
  return m.init_from().empty() ||
         (m.has_n_layer() && m.has_d_model() && m.has_vocab_size() && m.has_seq_len());
}

}  // namespace meshrun
