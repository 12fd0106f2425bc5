// The parameter layout follows tensor parallelism's plan (TpSplitOf): for every architecture and
// tp size, a parameter is sharded over tp exactly when its role's split says so, the tp ranks'
// boxes tile each global tensor with every element held once, and every block resolves the
// roles its architecture has.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "engine/model/gpt2.h"

namespace meshrun {
namespace {

JobSpec Model(const std::string& arch) {
  JobSpec spec;
  spec.model.arch = arch;
  spec.model.n_layer = 2;
  spec.model.n_head = 4;
  spec.model.d_model = 32;
  spec.model.vocab_size = 103;  // not a multiple of 2 or 4: the last rank's vocabulary is short
  spec.model.seq_len = 16;
  if (arch != "gpt2") {
    spec.model.n_kv_head = 2;
    spec.model.d_ff = 48;
    spec.model.tie_embeddings = false;
  }
  if (arch == "llama") spec.model.attention_bias = true;
  if (arch == "gemma") spec.model.head_dim = 16;  // q is 64 wide over a d_model of 32
  return spec;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TEST(Gpt2LayoutTest, TheTpRanksBoxesTileEachTensorAsThePlanSplitsIt) {
  for (const std::string arch : {"gpt2", "llama", "gemma"}) {
    for (int tp : {2, 4}) {
      SCOPED_TRACE(arch + " tp " + std::to_string(tp));
      // Per parameter name: how many ranks hold each global element.
      std::map<std::string, std::vector<int>> held;
      std::map<std::string, ParamRole> roles;
      for (int t = 0; t < tp; ++t) {
        GPT2Config cfg = GPT2ConfigOf(Model(arch).model);
        cfg.tp_size = tp;
        cfg.tp_rank = t;
        for (const ParamInfo& p : GPT2ParamLayout(cfg)) {
          SCOPED_TRACE(p.name);
          const TpSplit split = TpSplitOf(p.role);
          EXPECT_EQ(p.tp_sharded, split != TpSplit::kReplicated);
          roles[p.name] = p.role;
          std::vector<int>& count = held[p.name];
          count.resize(static_cast<size_t>(Numel(p.global_shape)), 0);
          int64_t rows = 0;
          for (const Box& b : p.boxes) {
            ASSERT_EQ(b.offset.size(), p.global_shape.size());
            rows += b.shape[0];
            // Every element of the box, as a global row-major index.
            const int64_t cols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
            const int64_t box_cols = b.shape.size() > 1 ? b.shape[1] : 1;
            const int64_t first_col = b.offset.size() > 1 ? b.offset[1] : 0;
            for (int64_t r = 0; r < b.shape[0]; ++r) {
              for (int64_t c = 0; c < box_cols; ++c) {
                ++count[static_cast<size_t>((b.offset[0] + r) * cols + first_col + c)];
              }
            }
          }
          EXPECT_EQ(rows, p.shape[0]);
        }
      }
      for (const auto& [name, count] : held) {
        SCOPED_TRACE(name);
        // Sharded tensors are held once over the tp ranks, replicated ones by every rank.
        const int want = TpSplitOf(roles[name]) == TpSplit::kReplicated ? tp : 1;
        for (size_t i = 0; i < count.size(); ++i) {
          if (count[i] != want) {
            ADD_FAILURE() << "element " << i << " held by " << count[i] << " ranks, want " << want;
            break;
          }
        }
      }
    }
  }
}

TEST(Gpt2LayoutTest, EveryBlockResolvesTheRolesItsArchitectureHas) {
  for (const std::string arch : {"gpt2", "llama", "gemma"}) {
    SCOPED_TRACE(arch);
    const GPT2Config cfg = GPT2ConfigOf(Model(arch).model);
    std::map<int, std::map<ParamRole, int>> per_layer;
    for (const ParamInfo& p : GPT2ParamLayout(cfg)) ++per_layer[p.layer][p.role];
    ASSERT_EQ(per_layer.size(), 3u);  // the embedding and final units (-1), layers 0 and 1
    for (int l = 0; l < 2; ++l) {
      for (ParamRole r : {ParamRole::kNorm1Weight, ParamRole::kQkvWeight, ParamRole::kOutWeight,
                          ParamRole::kNorm2Weight, ParamRole::kUpWeight, ParamRole::kDownWeight}) {
        EXPECT_EQ(per_layer[l][r], 1) << "layer " << l << " role " << static_cast<int>(r);
      }
      // Biases where the architecture has them: every linear's for GPT-2, q|k|v's for this
      // Llama (attention_bias), none for Gemma.
      EXPECT_EQ(per_layer[l][ParamRole::kQkvBias], arch == "gemma" ? 0 : 1);
      EXPECT_EQ(per_layer[l][ParamRole::kDownBias], arch == "gpt2" ? 1 : 0);
    }
    EXPECT_EQ(per_layer[-1][ParamRole::kTokenEmbedding], 1);
    EXPECT_EQ(per_layer[-1][ParamRole::kFinalNormWeight], 1);
    EXPECT_EQ(per_layer[-1][ParamRole::kHead], arch == "gpt2" ? 0 : 1);  // GPT-2 ties its head
  }
}

}  // namespace
}  // namespace meshrun
