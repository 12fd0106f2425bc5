// Reading and writing the Hugging Face GPT-2 layout.
#include "engine/model/hf_gpt2.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/confined_file.h"
#include "engine/io/safetensors.h"

namespace meshrun {

namespace fs = std::filesystem;

std::string HuggingFaceName(const std::string& name) {
  if (name == "wte" || name == "wpe") return "transformer." + name + ".weight";
  return "transformer." + name;
}

bool IsConv1DWeight(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("attn.c_attn.weight") || ends_with("attn.c_proj.weight") ||
         ends_with("mlp.c_fc.weight") || ends_with("mlp.c_proj.weight");
}

StatusOr<GPT2Config> ReadHuggingFaceConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path));
  std::ifstream in(name.name());
  if (!in) {
    return InvalidArgumentError("model.init_from: " + path +
                                " cannot be read (hint: point init_from at a folder with "
                                "config.json and model.safetensors)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("model.init_from: " + path + " is not a JSON object");
  }
  GPT2Config cfg;
  auto get = [&](const char* key, auto* out, bool required) -> Status {
    if (!j.contains(key)) {
      if (!required) return OkStatus();
      return InvalidArgumentError("model.init_from: " + path + " has no '" + key + "'");
    }
    if (!j[key].is_number()) {
      return InvalidArgumentError("model.init_from: " + path + ": '" + key + "' is not a number");
    }
    *out = j[key].get<std::remove_pointer_t<decltype(out)>>();
    return OkStatus();
  };
  MESHRUN_RETURN_IF_ERROR(get("n_embd", &cfg.d_model, true));
  MESHRUN_RETURN_IF_ERROR(get("n_layer", &cfg.n_layer, true));
  MESHRUN_RETURN_IF_ERROR(get("n_head", &cfg.n_head, true));
  MESHRUN_RETURN_IF_ERROR(get("n_positions", &cfg.max_seq_len, true));
  MESHRUN_RETURN_IF_ERROR(get("vocab_size", &cfg.vocab_size, true));
  MESHRUN_RETURN_IF_ERROR(get("layer_norm_epsilon", &cfg.ln_eps, false));
  return cfg;
}

Status LoadHuggingFaceGPT2(const std::string& dir, GPT2<float>* model) {
  MESHRUN_ASSIGN_OR_RETURN(GPT2Config file_cfg, ReadHuggingFaceConfig(dir));
  const GPT2Config& cfg = model->config();
  auto mismatch = [&](const char* field, const char* key, double spec, double file) {
    std::ostringstream m;
    m << "model." << field << ": the spec says " << spec << " but " << dir << "/config.json has "
      << key << " = " << file << " (hint: remove model." << field << " from the spec or set it to "
      << file << ")";
    return InvalidArgumentError(m.str());
  };
  if (cfg.d_model != file_cfg.d_model)
    return mismatch("d_model", "n_embd", cfg.d_model, file_cfg.d_model);
  if (cfg.n_layer != file_cfg.n_layer)
    return mismatch("n_layer", "n_layer", cfg.n_layer, file_cfg.n_layer);
  if (cfg.n_head != file_cfg.n_head)
    return mismatch("n_head", "n_head", cfg.n_head, file_cfg.n_head);
  if (cfg.vocab_size != file_cfg.vocab_size) {
    return mismatch("vocab_size", "vocab_size", cfg.vocab_size, file_cfg.vocab_size);
  }
  if (cfg.max_seq_len > file_cfg.max_seq_len) {
    return mismatch("seq_len", "n_positions", cfg.max_seq_len, file_cfg.max_seq_len);
  }
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  MESHRUN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  std::vector<float> buf;
  for (const ParamInfo& p : model->params()) {
    const std::string hf = HuggingFaceName(p.name);
    MESHRUN_ASSIGN_OR_RETURN(TensorInfo info, file.Info(hf));
    std::vector<int64_t> want = p.shape;
    if (IsConv1DWeight(p.name)) std::swap(want[0], want[1]);
    // The position table may be longer than seq_len: take its first rows.
    if (p.name == "wpe" && info.shape.size() == 2 && info.shape[1] == want[1])
      want[0] = info.shape[0];
    if (info.shape != want) {
      return InvalidArgumentError("model.init_from: " + path + ": tensor " + hf +
                                  " has an unexpected shape for this config");
    }
    buf.resize(static_cast<size_t>(info.num_elements()));
    MESHRUN_RETURN_IF_ERROR(file.ReadFloat(hf, buf.data()));
    float* dst = model->param(p);
    if (IsConv1DWeight(p.name)) {
      const int64_t in = want[0], out = want[1];  // stored (in, out); ours is (out, in)
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o) dst[o * in + i] = buf[i * out + o];
      }
    } else {
      std::copy(buf.begin(), buf.begin() + p.numel, dst);
    }
  }
  return OkStatus();
}

Status ExportHuggingFaceGPT2(const GPT2Config& cfg, float* params, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgumentError("-o: cannot create " + dir + ": " + ec.message());
  const std::vector<ParamInfo> layout = GPT2ParamLayout(cfg);
  std::vector<float> tr;  // one tensor's transpose at a time
  std::vector<TensorToWrite> tensors;
  for (const ParamInfo& p : layout) {
    TensorToWrite t;
    t.name = HuggingFaceName(p.name);
    t.dtype = DType::kF32;
    t.shape = p.shape;
    t.data = params + p.offset;
    if (IsConv1DWeight(p.name)) {
      const int64_t out = p.shape[0], in = p.shape[1];
      tr.resize(static_cast<size_t>(p.numel));
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) tr[i * out + o] = params[p.offset + o * in + i];
      }
      std::copy(tr.begin(), tr.end(), params + p.offset);
      t.shape = {in, out};
    }
    tensors.push_back(std::move(t));
  }
  MESHRUN_RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors,
                                           {{"format", "pt"}}));
  nlohmann::json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"n_embd", cfg.d_model},
      {"n_layer", cfg.n_layer},
      {"n_head", cfg.n_head},
      {"n_positions", cfg.max_seq_len},
      {"n_ctx", cfg.max_seq_len},
      {"vocab_size", cfg.vocab_size},
      {"layer_norm_epsilon", cfg.ln_eps},
      {"activation_function", "gelu_new"},
      {"n_inner", nullptr},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", true},
      {"bos_token_id", cfg.vocab_size - 1},
      {"eos_token_id", cfg.vocab_size - 1},
  };
  return WriteFileAtomic((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace meshrun
