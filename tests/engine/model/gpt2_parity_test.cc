// Parity with PyTorch: tests/reference/gpt2_reference.py wrote logits, loss, every gradient and
// the parameters after three AdamW steps (clipping and the schedule on) for a tiny GPT-2, in
// float64; the float32 engine must match each tensor within 1e-5 relative (norm-wise:
// ‖ours − ref‖ / ‖ref‖, see tests/reference/README.md for why not element-wise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "engine/io/safetensors.h"
#include "engine/model/gpt2.h"
#include "engine/train/optimizer.h"
#include "engine/train/sharding.h"
#include "engine/train/update.h"

namespace meshrun {
namespace {

constexpr double kTolerance = 1e-5;

std::string FixturePath() {
  const char* src = std::getenv("MESHRUN_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/reference/fixtures/gpt2_tiny.safetensors";
}

std::vector<float> Read(const SafetensorsFile& f, const std::string& name) {
  StatusOr<TensorInfo> info = f.Info(name);
  EXPECT_TRUE(info.ok()) << name << ": " << info.status().ToString();
  if (!info.ok()) return {};
  std::vector<float> out(static_cast<size_t>(info->num_elements()));
  Status s = f.ReadFloat(name, out.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

double RelativeError(const float* ours, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (static_cast<double>(ours[i]) - ref[i]) * (static_cast<double>(ours[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

class ParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<SafetensorsFile> f = SafetensorsFile::Open(FixturePath());
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = std::make_unique<SafetensorsFile>(std::move(f).value());
    cfg_.vocab_size = 96;
    cfg_.n_layer = 2;
    cfg_.n_head = 4;
    cfg_.d_model = 32;
    cfg_.max_seq_len = 16;
    model_ = std::make_unique<GPT2<float>>(cfg_);
    for (const ParamInfo& p : model_->params()) {
      std::vector<float> w = Read(*file_, "param." + p.name);
      ASSERT_EQ(static_cast<int64_t>(w.size()), p.numel) << p.name;
      std::copy(w.begin(), w.end(), model_->param(p));
    }
    StatusOr<TensorInfo> tok = file_->Info("tokens");
    ASSERT_TRUE(tok.ok());
    tokens_.resize(static_cast<size_t>(tok->num_elements()));
    ASSERT_TRUE(file_->ReadRaw("tokens", tokens_.data(), tokens_.size() * 4).ok());
  }

  // Inputs and targets of step k's batch (B=4 sequences of 17 tokens each).
  void Batch(int k, std::vector<int32_t>* in, std::vector<int32_t>* tg) const {
    in->clear();
    tg->clear();
    for (int b = 0; b < 4; ++b) {
      const int32_t* seq = tokens_.data() + (k * 4 + b) * 17;
      in->insert(in->end(), seq, seq + 16);
      tg->insert(tg->end(), seq + 1, seq + 17);
    }
  }

  GPT2Config cfg_;
  std::unique_ptr<SafetensorsFile> file_;
  std::unique_ptr<GPT2<float>> model_;
  std::vector<int32_t> tokens_;
};

TEST_F(ParityTest, LogitsLossAndGradientsMatchPyTorch) {
  std::vector<int32_t> in, tg;
  Batch(0, &in, &tg);
  ASSERT_TRUE(model_->Forward(in.data(), 4, 16).ok());
  EXPECT_LT(RelativeError(model_->logits(), Read(*file_, "logits")), kTolerance);

  model_->ZeroGrad();
  const double loss = *model_->ForwardBackward(in.data(), tg.data(), 4, 16, 1.0 / 64) / 64;
  const double ref_loss = Read(*file_, "loss")[0];
  EXPECT_NEAR(loss, ref_loss, kTolerance * ref_loss);
  for (const ParamInfo& p : model_->params()) {
    EXPECT_LT(RelativeError(model_->grad(p), Read(*file_, "grad." + p.name)), kTolerance) << p.name;
  }
}

TEST_F(ParityTest, ThreeAdamWStepsWithClippingAndScheduleMatchPyTorch) {
  TrainSpec tr;
  tr.steps = 3;
  tr.global_batch_size = 4;
  tr.micro_batch_size = 2;
  tr.lr = 1e-3;
  tr.min_lr = 1e-4;
  tr.warmup_steps = 1;
  tr.weight_decay = 0.1;
  tr.beta1 = 0.9;
  tr.beta2 = 0.95;
  tr.eps = 1e-8;
  tr.grad_clip = 0.5;
  // The trainer's own update path: ShardedState on one rank (no communicators) and AdamW.
  ShardedState state(model_.get(), nullptr, nullptr, nullptr);
  std::unique_ptr<Optimizer> adamw = MakeOptimizer(OptimizerOf(tr), state.size(), state.device());
  const std::vector<float> ref_losses = Read(*file_, "losses");
  const std::vector<float> ref_norms = Read(*file_, "grad_norm");
  const std::vector<double> ref_lrs = {1e-3, 1e-3, 5.5e-4};
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> in, tg;
    Batch(k, &in, &tg);
    state.ZeroGrad();
    double loss = 0;
    for (int mb = 0; mb < 2; ++mb) {  // two micro-batches of two sequences
      loss += *model_->ForwardBackward(in.data() + mb * 32, tg.data() + mb * 32, 2, 16, 1.0 / 64);
    }
    loss /= 64;
    EXPECT_NEAR(loss, ref_losses[k], kTolerance * ref_losses[k]) << "step " << k;
    StatusOr<UpdateResult> update = ClipAndStep(state, *adamw, tr, k);
    ASSERT_TRUE(update.ok()) << update.status().ToString();
    const UpdateResult& r = *update;
    EXPECT_NEAR(r.grad_norm, ref_norms[k], kTolerance * ref_norms[k]) << "step " << k;
    EXPECT_NEAR(r.lr, ref_lrs[k], 1e-12) << "step " << k;
  }
  for (const ParamInfo& p : model_->params()) {
    EXPECT_LT(RelativeError(model_->param(p), Read(*file_, "after3." + p.name)), kTolerance)
        << p.name;
  }
}

}  // namespace
}  // namespace meshrun
