// Checks the generated control-plane API against the contract: JobSpec mirrors docs/job-spec.md
// field for field and round-trips, the event and session oneofs behave, and CoordinatorService
// declares exactly the RPCs of docs/api.md with XxxRequest/XxxResponse types.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cctype>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/coordinator.pb.h"
#include "meshrun/v1/job_spec.pb.h"
#include "meshrun/v1/rank.pb.h"
#include "meshrun/v1/store.pb.h"
#include "meshrun/v1/types.pb.h"
#include "meshrun/v1/worker.pb.h"
#include "proto/duration.h"
#include "proto/mesh_axis.h"

namespace meshrun::v1 {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;
using google::protobuf::MethodDescriptor;
using google::protobuf::ServiceDescriptor;
using google::protobuf::util::MessageDifferencer;

// A complete spec, tp=2 × dp_shard=2.
JobSpec TinyDemoSpec() {
  JobSpec spec;
  spec.set_name("tiny-demo");
  ModelSpec* model = spec.mutable_model();
  model->set_arch("gpt2");
  model->set_n_layer(2);
  model->set_n_head(4);
  model->set_d_model(64);
  model->set_seq_len(64);
  model->set_vocab_size(256);
  ParallelismSpec* par = spec.mutable_parallelism();
  par->set_dp_replicate_size(1);
  par->set_dp_shard_size(2);
  par->set_cp_size(1);
  par->set_tp_size(2);
  par->set_cp_comm_strategy("allgather");
  TrainSpec* train = spec.mutable_train();
  train->set_steps(20);
  train->set_global_batch_size(8);
  train->set_micro_batch_size(2);
  train->set_lr(3.0e-4);
  train->set_min_lr(3.0e-5);
  train->set_warmup_steps(2);
  train->set_weight_decay(0.1);
  train->set_grad_clip(1.0);
  train->set_beta1(0.9);
  train->set_beta2(0.95);
  train->set_eps(1.0e-8);
  train->set_seed(1337);
  train->set_precision("fp32");
  DataSpec* data = spec.mutable_data();
  data->set_train("examples/data/tiny.txt");
  data->set_val("examples/data/tiny-val.txt");
  data->set_format("auto");
  data->set_order("sequential");
  data->set_eval_every(0);
  CheckpointSpec* ckpt = spec.mutable_checkpoint();
  ckpt->set_dir("/tmp/ckpt");
  ckpt->set_every(0);
  ckpt->set_keep(2);
  ckpt->set_resume("auto");
  spec.mutable_resources()->set_device("cpu");
  spec.mutable_resources()->set_threads(0);
  spec.mutable_restart()->set_max_restarts(0);
  spec.set_source_yaml("name: tiny-demo\nparallelism: {tp_size: 1}\n");
  spec.add_set_overrides("parallelism.tp_size=2");
  return spec;
}

TEST(JobSpecTest, RoundTripsThroughTheWireFormat) {
  const JobSpec spec = TinyDemoSpec();
  std::string wire;
  ASSERT_TRUE(spec.SerializeToString(&wire));

  JobSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_TRUE(MessageDifferencer::Equals(spec, parsed));
  EXPECT_EQ(parsed.name(), "tiny-demo");
  EXPECT_EQ(parsed.parallelism().tp_size(), 2);
  EXPECT_EQ(parsed.parallelism().dp_shard_size(), 2);
  EXPECT_DOUBLE_EQ(parsed.train().lr(), 3.0e-4);
  EXPECT_EQ(parsed.train().seed(), 1337);
  EXPECT_EQ(parsed.checkpoint().resume(), "auto");
  EXPECT_EQ(parsed.source_yaml(), spec.source_yaml());
  ASSERT_EQ(parsed.set_overrides_size(), 1);
  EXPECT_EQ(parsed.set_overrides(0), "parallelism.tp_size=2");
}

TEST(JobSpecTest, ModelSizesKeepPresenceForInitFrom) {
  // With init_from, a size left out must stay distinguishable from a size of 0.
  JobSpec spec;
  spec.mutable_model()->set_init_from("/models/gpt2");
  spec.mutable_model()->set_seq_len(128);
  JobSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(spec.SerializeAsString()));
  EXPECT_FALSE(parsed.model().has_n_layer());
  EXPECT_FALSE(parsed.model().has_d_model());
  EXPECT_TRUE(parsed.model().has_seq_len());
  EXPECT_EQ(parsed.model().seq_len(), 128);
}

// Field names of a message, in declaration order.
std::vector<std::string> FieldNames(const Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return names;
}

TEST(JobSpecTest, MirrorsConventionsSectionFiveFieldForField) {
  using Names = std::vector<std::string>;
  const Descriptor* job = JobSpec::descriptor();
  EXPECT_EQ(FieldNames(job),
            (Names{"name", "model", "parallelism", "train", "data", "checkpoint", "resources",
                   "restart", "source_yaml", "set_overrides", "auto_choice",
                   "predicted_step_seconds", "predicted_peak_memory_bytes"}));
  const std::map<std::string, Names> sections = {
      {"model",
       {"arch",
        "n_layer",
        "n_head",
        "d_model",
        "seq_len",
        "vocab_size",
        "init_from",
        "n_kv_head",
        "d_ff",
        "norm_eps",
        "rope_theta",
        "rope_scaling_type",
        "rope_scaling_factor",
        "rope_scaling_low_freq_factor",
        "rope_scaling_high_freq_factor",
        "rope_scaling_original_max_position_embeddings",
        "tie_embeddings",
        "attention_bias",
        "sliding_window",
        "head_dim"}},
      {"parallelism",
       {"dp_replicate_size", "dp_shard_size", "cp_size", "tp_size", "cp_comm_strategy",
        "fsdp_reshard_after_forward", "comm_timeout_seconds", "auto", "pp_size", "pp_schedule",
        "pp_virtual_stages", "pp_layers"}},
      {"train",
       {"steps", "global_batch_size", "micro_batch_size", "lr", "min_lr", "warmup_steps",
        "weight_decay", "grad_clip", "beta1", "beta2", "eps", "seed", "precision",
        "activation_checkpointing", "optimizer", "lion_beta1", "lion_beta2", "loss_on"}},
      // train_sources: data.train's list form (a weighted mixture), train its one-path form.
      {"data",
       {"train", "val", "format", "order", "eval_every", "tokenizer", "train_sources", "template",
        "attention"}},
      {"checkpoint", {"dir", "every", "keep", "resume"}},
      {"resources",
       {"device", "threads", "elastic_min_ranks", "elastic_max_ranks", "elastic_wait_seconds"}},
      {"restart", {"max_restarts"}},
  };
  for (const auto& [section, keys] : sections) {
    const FieldDescriptor* field = job->FindFieldByName(section);
    ASSERT_NE(field, nullptr) << section;
    ASSERT_EQ(field->type(), FieldDescriptor::TYPE_MESSAGE) << section;
    EXPECT_EQ(FieldNames(field->message_type()), keys) << section;
  }
}

TEST(WatchJobTest, EventOneofHoldsOneKindAtATime) {
  WatchJobResponse response;
  JobEvent* event = response.mutable_event();
  event->set_sequence(42);
  event->set_job_id("job-1");
  EXPECT_EQ(event->kind_case(), JobEvent::KIND_NOT_SET);

  MetricsSample* sample = event->mutable_metrics();
  sample->set_job_id("job-1");
  sample->set_attempt(1);
  sample->set_step(7);
  sample->set_loss(3.25);
  sample->set_memory_peak_bytes(1 << 20);
  CommStats* comm = sample->add_comm();
  comm->set_axis(MESH_AXIS_TP);
  comm->set_op(COMM_OP_ALL_REDUCE);
  comm->set_bytes(4096);
  EXPECT_EQ(event->kind_case(), JobEvent::kMetrics);
  EXPECT_FALSE(sample->has_rank());  // job-level aggregate

  WatchJobResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(response.SerializeAsString()));
  ASSERT_EQ(parsed.event().kind_case(), JobEvent::kMetrics);
  EXPECT_EQ(parsed.event().sequence(), 42u);
  EXPECT_EQ(parsed.event().metrics().step(), 7);
  EXPECT_DOUBLE_EQ(parsed.event().metrics().loss(), 3.25);
  ASSERT_EQ(parsed.event().metrics().comm_size(), 1);
  EXPECT_EQ(parsed.event().metrics().comm(0).axis(), MESH_AXIS_TP);

  // Setting another member replaces the first.
  event->mutable_log()->set_text("step 7 loss 3.25");
  EXPECT_EQ(event->kind_case(), JobEvent::kLog);
  EXPECT_FALSE(event->has_metrics());

  event->mutable_state_changed()->set_state(JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(parsed.ParseFromString(response.SerializeAsString()));
  EXPECT_EQ(parsed.event().kind_case(), JobEvent::kStateChanged);
  EXPECT_EQ(parsed.event().state_changed().state(), JOB_STATE_SUCCEEDED);
}

TEST(WorkerSessionTest, UpAndDownMessagesCarryTheContractFields) {
  WorkerSessionRequest up;
  RankExited* exited = up.mutable_rank_exited();
  exited->set_job_id("job-1");
  exited->set_attempt(2);
  exited->set_rank(3);
  exited->set_exit_code(-1);
  exited->set_signal(9);
  exited->set_error("killed by SIGKILL");
  EXPECT_EQ(up.kind_case(), WorkerSessionRequest::kRankExited);

  WorkerSessionResponse down;
  RankAssignment* assign = down.mutable_assign();
  assign->set_job_id("job-1");
  assign->set_attempt(2);
  assign->set_rank(3);
  assign->set_world_size(4);
  assign->mutable_coords()->set_dp_shard(1);
  assign->mutable_coords()->set_tp(1);
  assign->mutable_mesh()->set_dp_replicate_size(1);
  assign->mutable_mesh()->set_dp_shard_size(2);
  assign->mutable_mesh()->set_cp_size(1);
  assign->mutable_mesh()->set_tp_size(2);
  *assign->mutable_spec() = TinyDemoSpec();
  assign->mutable_store()->set_address("127.0.0.1:7070");
  assign->mutable_store()->set_prefix("job-1/2/");

  WorkerSessionResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(down.SerializeAsString()));
  ASSERT_EQ(parsed.kind_case(), WorkerSessionResponse::kAssign);
  const MeshCoords& c = parsed.assign().coords();
  const MeshShape& m = parsed.assign().mesh();
  // Global rank g = ((r·S + s)·C + c)·T + t.
  const int g =
      ((c.dp_replicate() * m.dp_shard_size() + c.dp_shard()) * m.cp_size() + c.cp()) * m.tp_size() +
      c.tp();
  EXPECT_EQ(g, parsed.assign().rank());
  EXPECT_EQ(parsed.assign().spec().name(), "tiny-demo");

  down.mutable_stop()->set_reason(STOP_REASON_CANCELLED);
  EXPECT_EQ(down.kind_case(), WorkerSessionResponse::kStop);
  EXPECT_FALSE(down.has_assign());
}

// Every RPC of the contract, with its streaming shape.
struct Rpc {
  std::string name;
  bool client_streaming;
  bool server_streaming;
};

const std::vector<Rpc>& ContractRpcs() {
  static const std::vector<Rpc> rpcs = {
      {"SubmitJob", false, false},  {"GetJob", false, false},         {"ListJobs", false, false},
      {"CancelJob", false, false},  {"WatchJob", false, true},        {"ListWorkers", false, false},
      {"GetJobLogs", false, false}, {"RegisterWorker", false, false}, {"WorkerSession", true, true},
      {"StoreSet", false, false},   {"StoreGet", false, false},       {"StoreAdd", false, false},
      {"ListRanks", false, false},  {"DrainWorker", false, false},
  };
  return rpcs;
}

TEST(CoordinatorServiceTest, DescriptorListsEveryRpcOfTheContract) {
  EXPECT_STREQ(CoordinatorService::service_full_name(), "meshrun.v1.CoordinatorService");
  const ServiceDescriptor* service =
      DescriptorPool::generated_pool()->FindServiceByName(CoordinatorService::service_full_name());
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->method_count(), static_cast<int>(ContractRpcs().size()))
      << "an RPC was added or removed: update the contract list here and docs/api.md";

  for (const Rpc& rpc : ContractRpcs()) {
    const MethodDescriptor* method = service->FindMethodByName(rpc.name);
    ASSERT_NE(method, nullptr) << rpc.name;
    EXPECT_EQ(method->input_type()->full_name(), "meshrun.v1." + rpc.name + "Request");
    EXPECT_EQ(method->output_type()->full_name(), "meshrun.v1." + rpc.name + "Response");
    EXPECT_EQ(method->client_streaming(), rpc.client_streaming) << rpc.name;
    EXPECT_EQ(method->server_streaming(), rpc.server_streaming) << rpc.name;
  }
}

TEST(CoordinatorServiceTest, StoreRequestsAreScopedToOneAttempt) {
  for (const Descriptor* d : {StoreSetRequest::descriptor(), StoreGetRequest::descriptor(),
                              StoreAddRequest::descriptor()}) {
    EXPECT_NE(d->FindFieldByName("job_id"), nullptr) << d->full_name();
    EXPECT_NE(d->FindFieldByName("attempt"), nullptr) << d->full_name();
    EXPECT_NE(d->FindFieldByName("key"), nullptr) << d->full_name();
  }
  EXPECT_NE(StoreGetRequest::descriptor()->FindFieldByName("wait"), nullptr);
  EXPECT_NE(StoreGetRequest::descriptor()->FindFieldByName("timeout"), nullptr);
}

// JobState and WorkerState names, without their prefix, are the spellings of docs/cli.md.
std::set<std::string> UnprefixedValues(const google::protobuf::EnumDescriptor* e,
                                       const std::string& prefix) {
  std::set<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    const std::string& name = e->value(i)->name();
    EXPECT_EQ(name.rfind(prefix, 0), 0u) << name;
    names.insert(name.substr(prefix.size()));
  }
  names.erase("UNSPECIFIED");
  return names;
}

TEST(TypesTest, StateNamesMatchTheConventions) {
  EXPECT_EQ(UnprefixedValues(JobState_descriptor(), "JOB_STATE_"),
            (std::set<std::string>{"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}));
  EXPECT_EQ(UnprefixedValues(WorkerState_descriptor(), "WORKER_STATE_"),
            (std::set<std::string>{"READY", "BUSY", "LOST"}));
  EXPECT_EQ(UnprefixedValues(MeshAxis_descriptor(), "MESH_AXIS_"),
            (std::set<std::string>{"DP_REPLICATE", "DP_SHARD", "CP", "TP", "DP", "DP_SHARD_CP",
                                   "DP_CP", "PP"}));
}

// A peer's Duration of any size converts without overflow (StopOrder grace, StoreGet timeout,
// heartbeat interval).
TEST(TypesTest, MeshAxisCrossesTheWireAtOneBoundary) {
  // Each axis (the four and the flattened three) round-trips, and its proto name lower-cased
  // without the prefix is MeshAxisName (the one spelling of labels and logs).
  for (meshrun::MeshAxis axis : meshrun::kAllMeshAxes) {
    const v1::MeshAxis wire = MeshAxisToProto(axis);
    ASSERT_NE(wire, v1::MESH_AXIS_UNSPECIFIED) << MeshAxisName(axis);
    EXPECT_EQ(MeshAxisFromProto(wire), axis);
    std::string name = v1::MeshAxis_Name(wire).substr(std::string("MESH_AXIS_").size());
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    EXPECT_EQ(name, MeshAxisName(axis));
  }
  EXPECT_FALSE(MeshAxisFromProto(v1::MESH_AXIS_UNSPECIFIED));
  EXPECT_FALSE(MeshAxisFromProto(static_cast<v1::MeshAxis>(99)));
  // Every value of the proto enum is one of them.
  const google::protobuf::EnumDescriptor* e = v1::MeshAxis_descriptor();
  for (int i = 0; i < e->value_count(); ++i) {
    const auto wire = static_cast<v1::MeshAxis>(e->value(i)->number());
    if (wire != v1::MESH_AXIS_UNSPECIFIED) {
      EXPECT_TRUE(MeshAxisFromProto(wire)) << e->value(i)->name();
    }
  }
}

// The mesh on the wire (decision 0055): the five coordinates and sizes (pp's fields numbered
// after the four older ones, which keep theirs), and the ordered list of axes a rank's
// assignment and its RankInfo carry; the measured pipeline bubble of a step.
TEST(TypesTest, TheMeshTravelsAsCoordinatesAndAsAnOrderedListOfAxes) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(FieldNames(MeshCoords::descriptor()),
            (Names{"dp_replicate", "dp_shard", "cp", "tp", "pp"}));
  EXPECT_EQ(FieldNames(MeshShape::descriptor()),
            (Names{"dp_replicate_size", "dp_shard_size", "cp_size", "tp_size", "pp_size"}));
  EXPECT_EQ(MeshCoords::descriptor()->FindFieldByName("pp")->number(), 5);
  EXPECT_EQ(FieldNames(MeshAxisCoord::descriptor()), (Names{"axis", "size", "index"}));
  for (const Descriptor* d : {RankInfo::descriptor(), RankAssignment::descriptor()}) {
    const FieldDescriptor* axes = d->FindFieldByName("axes");
    ASSERT_NE(axes, nullptr) << d->full_name();
    EXPECT_TRUE(axes->is_repeated()) << d->full_name();
    EXPECT_EQ(axes->message_type(), MeshAxisCoord::descriptor()) << d->full_name();
  }
  EXPECT_NE(
      ListRanksRequest::descriptor()->FindFieldByName("coords")->message_type()->FindFieldByName(
          "pp"),
      nullptr);
  for (const Descriptor* d : {MetricsSample::descriptor(), RankStep::descriptor()}) {
    const FieldDescriptor* bubble = d->FindFieldByName("pipeline_bubble_ratio");
    ASSERT_NE(bubble, nullptr) << d->full_name();
    EXPECT_TRUE(bubble->has_presence()) << d->full_name() << ": unset must read as not measured";
    // Beside it, the schedule's theory (decision 0060), appended after it.
    const FieldDescriptor* theory = d->FindFieldByName("pipeline_bubble_theory");
    ASSERT_NE(theory, nullptr) << d->full_name();
    EXPECT_TRUE(theory->has_presence()) << d->full_name() << ": unset must read as no pipeline";
    EXPECT_EQ(theory->number(), bubble->number() + 1) << d->full_name();
  }
}

TEST(WorkerSessionTest, APipelinedRanksAssignmentNamesItsStage) {
  // pp 2 × dp_shard 2 × tp 2: rank 5 is (p 1, s 0, t 1).
  RankAssignment a;
  a.set_rank(5);
  a.mutable_coords()->set_pp(1);
  a.mutable_coords()->set_tp(1);
  a.mutable_mesh()->set_pp_size(2);
  a.mutable_mesh()->set_dp_replicate_size(1);
  a.mutable_mesh()->set_dp_shard_size(2);
  a.mutable_mesh()->set_cp_size(1);
  a.mutable_mesh()->set_tp_size(2);
  RankAssignment parsed;
  ASSERT_TRUE(parsed.ParseFromString(a.SerializeAsString()));
  const MeshCoords& c = parsed.coords();
  const MeshShape& m = parsed.mesh();
  const int g =
      (((c.pp() * m.dp_replicate_size() + c.dp_replicate()) * m.dp_shard_size() + c.dp_shard()) *
           m.cp_size() +
       c.cp()) *
          m.tp_size() +
      c.tp();
  EXPECT_EQ(g, parsed.rank());
}

TEST(DurationTest, HugeDurationsSaturateInsteadOfOverflowing) {
  google::protobuf::Duration d;
  d.set_seconds(1);
  d.set_nanos(500'000'000);
  EXPECT_EQ(meshrun::DurationToMillis(d).count(), 1500);
  d.set_seconds(std::numeric_limits<int64_t>::max());
  d.set_nanos(999'999'999);
  EXPECT_EQ(meshrun::DurationToMillis(d).count(), meshrun::kMaxDurationMillis);
  d.set_seconds(std::numeric_limits<int64_t>::min());
  d.set_nanos(std::numeric_limits<int32_t>::min());
  EXPECT_EQ(meshrun::DurationToMillis(d).count(), -meshrun::kMaxDurationMillis);
  d.set_seconds(0);
  d.set_nanos(std::numeric_limits<int32_t>::max());  // not a valid Duration: clamped
  EXPECT_EQ(meshrun::DurationToMillis(d).count(), 999);
}

// What every table, line and JSON object of a rank's coordinates is made from: the list of
// axes as sent, or the per-axis fields of a coordinator that sent no list; pp shown only on a
// pipelined mesh.
TEST(TypesTest, ARanksAxesComeFromItsListOrFromTheFieldsOfAnOlderPeer) {
  RankInfo listed;
  const std::pair<MeshAxis, int> sizes[] = {{MESH_AXIS_PP, 2},
                                            {MESH_AXIS_DP_REPLICATE, 1},
                                            {MESH_AXIS_DP_SHARD, 2},
                                            {MESH_AXIS_CP, 1},
                                            {MESH_AXIS_TP, 2}};
  int index = 0;
  for (auto [axis, size] : sizes) {
    MeshAxisCoord* a = listed.add_axes();
    a->set_axis(axis);
    a->set_size(size);
    a->set_index(size > 1 ? (index++ % 2) : 0);
  }
  const std::vector<meshrun::AxisPlace> places = meshrun::RankAxes(listed);
  ASSERT_EQ(places.size(), 5u);
  EXPECT_EQ(places[0].axis, meshrun::MeshAxis::kPp);
  EXPECT_EQ(places[0].size, 2);
  EXPECT_EQ(places[2].index, 1);  // dp_shard
  EXPECT_TRUE(meshrun::RankPipelined(listed));

  RankInfo older;  // no list: the fields, sizes unknown
  older.mutable_coords()->set_dp_shard(3);
  older.mutable_coords()->set_tp(1);
  const std::vector<meshrun::AxisPlace> fields = meshrun::RankAxes(older);
  ASSERT_EQ(fields.size(), 5u);
  EXPECT_EQ(fields[0].axis, meshrun::MeshAxis::kPp);
  EXPECT_EQ(fields[2].index, 3);
  EXPECT_EQ(fields[4].index, 1);
  EXPECT_EQ(fields[4].size, 0);
  EXPECT_FALSE(meshrun::RankPipelined(older));
  EXPECT_FALSE(meshrun::AxisShown(meshrun::MeshAxis::kPp, false));
  EXPECT_TRUE(meshrun::AxisShown(meshrun::MeshAxis::kPp, true));
  EXPECT_TRUE(meshrun::AxisShown(meshrun::MeshAxis::kTp, false));
}

}  // namespace
}  // namespace meshrun::v1
