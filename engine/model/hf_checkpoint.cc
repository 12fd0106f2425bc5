// Reading and writing Hugging Face checkpoints of GPT-2 and the Llama family.
#include "engine/model/hf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/confined_file.h"
#include "common/hf_config.h"

namespace meshrun {

namespace fs = std::filesystem;

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<nlohmann::json> ReadJson(const std::string& path, const char* what) {
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path));
  std::ifstream in(name.name());
  if (!in) {
    return InvalidArgumentError(std::string(what) + ": " + path +
                                " cannot be read (hint: point init_from at a Hugging Face folder "
                                "with config.json and model.safetensors)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(std::string(what) + ": " + path + " is not a JSON object");
  }
  return j;
}

// GPT-2's Conv1D weights are stored (in, out); ours are (out, in).
bool IsConv1DWeight(const std::string& name) {
  return EndsWith(name, "attn.c_attn.weight") || EndsWith(name, "attn.c_proj.weight") ||
         EndsWith(name, "mlp.c_fc.weight") || EndsWith(name, "mlp.c_proj.weight");
}

}  // namespace

StatusOr<GPT2Config> ReadHuggingFaceConfig(const std::string& dir) {
  MESHRUN_ASSIGN_OR_RETURN(ModelSpec model, ReadInitFromConfig(dir));
  return GPT2ConfigOf(model);
}

Status CheckConfigMatches(const GPT2Config& model, const GPT2Config& file, const std::string& dir) {
  auto mismatch = [&](const char* field, const char* key, const std::string& spec,
                      const std::string& value) {
    return InvalidArgumentError("model." + std::string(field) + ": the spec says " + spec +
                                " but " + dir + "/config.json has " + key + " = " + value +
                                " (hint: remove model." + field + " from the spec or set it to " +
                                value + ")");
  };
  auto str = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  const bool llama = file.llama();
  if (model.arch != file.arch) {
    return mismatch("arch", "model_type", std::string(model.family().name),
                    "a type of arch " + std::string(file.family().name));
  }
  struct IntField {
    const char* field;
    const char* gpt2_key;
    const char* llama_key;
    int spec, file;
  };
  const IntField ints[] = {
      {"d_model", "n_embd", "hidden_size", model.d_model, file.d_model},
      {"n_layer", "n_layer", "num_hidden_layers", model.n_layer, file.n_layer},
      {"n_head", "n_head", "num_attention_heads", model.n_head, file.n_head},
      {"vocab_size", "vocab_size", "vocab_size", model.vocab_size, file.vocab_size},
      {"n_kv_head", "n_head", "num_key_value_heads", model.kv_heads(), file.kv_heads()},
      {"d_ff", "n_inner", "intermediate_size", model.ff(), file.ff()},
      {"head_dim", "n_embd/n_head", "head_dim", model.head_dim(), file.head_dim()},
  };
  for (const IntField& f : ints) {
    if (f.spec != f.file) {
      return mismatch(f.field, llama ? f.llama_key : f.gpt2_key, std::to_string(f.spec),
                      std::to_string(f.file));
    }
  }
  auto close = [](double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fabs(b); };
  if (!close(model.ln_eps, file.ln_eps)) {
    return mismatch("norm_eps", llama ? "rms_norm_eps" : "layer_norm_epsilon", str(model.ln_eps),
                    str(file.ln_eps));
  }
  if (model.tie_embeddings != file.tie_embeddings) {
    return mismatch("tie_embeddings", "tie_word_embeddings",
                    model.tie_embeddings ? "true" : "false",
                    file.tie_embeddings ? "true" : "false");
  }
  if (!llama) {
    if (model.max_seq_len > file.max_seq_len) {
      return mismatch("seq_len", "n_positions", std::to_string(model.max_seq_len),
                      std::to_string(file.max_seq_len));
    }
    return OkStatus();
  }
  if (!close(model.rope_theta, file.rope_theta)) {
    return mismatch("rope_theta", "rope_theta", str(model.rope_theta), str(file.rope_theta));
  }
  if (!(model.rope_scaling == file.rope_scaling)) {
    return mismatch(
        "rope_scaling", "rope_scaling",
        model.rope_scaling.llama3 ? "llama3 (other factors)" : "none",
        file.rope_scaling.llama3 ? "llama3 with factor " + str(file.rope_scaling.factor) : "none");
  }
  if (model.attention_bias != file.attention_bias) {
    return mismatch("attention_bias", "attention_bias", model.attention_bias ? "true" : "false",
                    file.attention_bias ? "true" : "false");
  }
  if (model.sliding_window != file.sliding_window) {
    auto window = [](int w) { return w > 0 ? std::to_string(w) : std::string("null"); };
    return mismatch("sliding_window", "sliding_window", window(model.sliding_window),
                    window(file.sliding_window));
  }
  return OkStatus();
}

// Internal rows [row_begin, row_begin + rows) of a parameter come from file tensor `name`
// (all of it, or — for wpe — its first rows); transposed: stored (in, out).
struct HuggingFaceWeights::Source {
  std::string name;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool transposed = false;
};

StatusOr<HuggingFaceWeights> HuggingFaceWeights::Open(const std::string& dir,
                                                      const GPT2Config& cfg) {
  HuggingFaceWeights w;
  w.dir_ = dir;
  w.cfg_ = cfg;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  std::vector<std::string> files;
  std::map<std::string, std::string> map;  // tensor → file, from the index
  if (fs::exists(index, ec)) {
    MESHRUN_ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(index.string(), "model.init_from"));
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      return InvalidArgumentError("model.init_from: " + index.string() + " has no weight_map");
    }
    for (const auto& [name, file] : j["weight_map"].items()) {
      const std::string f = file.is_string() ? file.get<std::string>() : "";
      if (f.empty() || f.find('/') != std::string::npos || f == "..") {
        return InvalidArgumentError("model.init_from: " + index.string() + ": tensor " + name +
                                    " maps to '" + f + "', not a file of the folder");
      }
      map[name] = f;
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
  } else {
    files.push_back("model.safetensors");
  }
  for (const std::string& f : files) {
    StatusOr<SafetensorsFile> opened = SafetensorsFile::Open((fs::path(dir) / f).string());
    if (!opened.ok()) {
      // A shard the index lists that is missing, unreadable or truncated: name the field.
      const bool missing = !fs::exists(fs::path(dir) / f, ec);
      return InvalidArgumentError(
          "model.init_from: " + opened.status().message() +
          (missing ? std::string(" (hint: ") +
                         (map.empty() ? "the folder needs model.safetensors"
                                      : "model.safetensors.index.json lists " + f +
                                            "; copy every shard into the folder") +
                         ")"
                   : std::string()));
    }
    SafetensorsFile file = std::move(opened).value();
    const size_t at = w.files_.size();
    for (const std::string& name : file.names()) {
      if (map.empty() || map[name] == f) w.file_of_[name] = at;
    }
    w.files_.push_back(std::make_shared<SafetensorsFile>(std::move(file)));
  }
  if (cfg.llama()) {
    w.prefix_ = "model.";
  } else if (w.file_of_.count("transformer.wte.weight")) {
    w.prefix_ = "transformer.";
  } else if (w.file_of_.count("wte.weight")) {
    w.prefix_ = "";  // the published gpt2 checkpoint: unprefixed names, no lm_head
  } else {
    return InvalidArgumentError("model.init_from: " + dir +
                                " holds neither transformer.wte.weight nor wte.weight (hint: "
                                "point init_from at a GPT2LMHeadModel folder)");
  }
  return w;
}

StatusOr<const SafetensorsFile*> HuggingFaceWeights::FileOf(const std::string& name) const {
  const auto it = file_of_.find(name);
  if (it == file_of_.end()) {
    return InvalidArgumentError("model.init_from: " + dir_ + " has no tensor '" + name +
                                "' (hint: the folder must hold every weight of the config's "
                                "architecture)");
  }
  return files_[it->second].get();
}

std::vector<HuggingFaceWeights::Source> HuggingFaceWeights::SourcesOf(const ParamInfo& p) const {
  const int64_t rows = p.global_shape[0];
  const std::string& n = p.name;
  if (n == "lm_head") return {{"lm_head.weight", 0, rows, false}};
  if (!cfg_.llama()) {
    if (n == "wte" || n == "wpe") return {{prefix_ + n + ".weight", 0, rows, false}};
    return {{prefix_ + n, 0, rows, IsConv1DWeight(n)}};
  }
  if (n == "embed_tokens") return {{"model.embed_tokens.weight", 0, rows, false}};
  const int64_t D = cfg_.head_dim(), Cq = int64_t{cfg_.n_head} * D,
                Ck = int64_t{cfg_.kv_heads()} * D, F = cfg_.ff();
  for (const char* suffix : {"weight", "bias"}) {
    const std::string fused = std::string("self_attn.qkv.") + suffix;
    if (EndsWith(n, fused)) {
      const std::string base = "model." + n.substr(0, n.size() - fused.size()) + "self_attn.";
      return {{base + "q_proj." + suffix, 0, Cq, false},
              {base + "k_proj." + suffix, Cq, Ck, false},
              {base + "v_proj." + suffix, Cq + Ck, Ck, false}};
    }
  }
  if (EndsWith(n, "mlp.gate_up.weight")) {
    const std::string base =
        "model." + n.substr(0, n.size() - std::string("gate_up.weight").size());
    return {{base + "gate_proj.weight", 0, F, false}, {base + "up_proj.weight", F, F, false}};
  }
  return {{"model." + n, 0, rows, false}};
}

StatusOr<const SafetensorsFile*> HuggingFaceWeights::CheckSource(const ParamInfo& p,
                                                                 const Source& s) const {
  const bool one_dim = p.global_shape.size() == 1;
  const int64_t cols = one_dim ? 1 : p.global_shape[1];
  MESHRUN_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(s.name));
  MESHRUN_ASSIGN_OR_RETURN(TensorInfo info, file->Info(s.name));
  // The shape the file must hold: (rows, cols), Conv1D (cols, rows), 1-D (rows); a position
  // table may be longer than seq_len.
  std::vector<int64_t> want = one_dim ? std::vector<int64_t>{s.rows}
                                      : (s.transposed ? std::vector<int64_t>{cols, s.rows}
                                                      : std::vector<int64_t>{s.rows, cols});
  if (p.name == "wpe" && info.shape.size() == 2 && info.shape[1] == cols &&
      info.shape[0] >= s.rows) {
    want[0] = info.shape[0];
  }
  if (info.shape != want) {
    std::string have, expected;
    for (int64_t d : info.shape) have += (have.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : want) expected += (expected.empty() ? "" : ", ") + std::to_string(d);
    return InvalidArgumentError("model.init_from: " + file->path() + ": tensor " + s.name +
                                " has shape (" + have + "), the config needs (" + expected +
                                ") (hint: the weights and config.json must be of one model)");
  }
  return file;
}

Status HuggingFaceWeights::CheckParam(const ParamInfo& p) const {
  for (const Source& s : SourcesOf(p)) MESHRUN_RETURN_IF_ERROR(CheckSource(p, s).status());
  return OkStatus();
}

Status HuggingFaceWeights::ReadBox(const ParamInfo& p, const Box& box, float* out) const {
  const bool one_dim = p.global_shape.size() == 1;
  const int64_t cols = one_dim ? 1 : p.global_shape[1];
  const int64_t r0 = box.offset[0], nr = box.shape[0];
  const int64_t c0 = one_dim ? 0 : box.offset[1], w = one_dim ? 1 : box.shape[1];
  std::vector<float> column;
  for (const Source& s : SourcesOf(p)) {
    const int64_t a = std::max(r0, s.row_begin), b = std::min(r0 + nr, s.row_begin + s.rows);
    if (a >= b) continue;
    MESHRUN_ASSIGN_OR_RETURN(const SafetensorsFile* file, CheckSource(p, s));
    const int64_t first = a - s.row_begin;  // in the source's rows
    if (!s.transposed) {
      if (w == cols) {  // whole rows: one contiguous range
        MESHRUN_RETURN_IF_ERROR(
            file->ReadFloatRange(s.name, first * cols, (b - a) * cols, out + (a - r0) * w));
      } else {
        for (int64_t r = 0; r < b - a; ++r) {
          MESHRUN_RETURN_IF_ERROR(
              file->ReadFloatRange(s.name, (first + r) * cols + c0, w, out + (a - r0 + r) * w));
        }
      }
      continue;
    }
    // Stored (in, out): our column c is the file's row c, our rows a contiguous run in it.
    column.resize(static_cast<size_t>(b - a));
    for (int64_t c = 0; c < w; ++c) {
      MESHRUN_RETURN_IF_ERROR(
          file->ReadFloatRange(s.name, (c0 + c) * s.rows + first, b - a, column.data()));
      for (int64_t r = 0; r < b - a; ++r) out[(a - r0 + r) * w + c] = column[r];
    }
  }
  return OkStatus();
}

Status HuggingFaceWeights::ReadParam(const ParamInfo& p, float* out) const {
  for (const Box& box : p.boxes) {
    MESHRUN_RETURN_IF_ERROR(ReadBox(p, box, out));
    int64_t n = 1;
    for (int64_t d : box.shape) n *= d;
    out += n;
  }
  return OkStatus();
}

StatusOr<HuggingFaceWeights> OpenHuggingFaceChecked(const std::string& dir, const GPT2Config& cfg) {
  MESHRUN_ASSIGN_OR_RETURN(GPT2Config file_cfg, ReadHuggingFaceConfig(dir));
  MESHRUN_RETURN_IF_ERROR(CheckConfigMatches(cfg, file_cfg, dir));
  MESHRUN_ASSIGN_OR_RETURN(HuggingFaceWeights weights, HuggingFaceWeights::Open(dir, cfg));
  // Every tensor of the whole model (tp 1: global shapes), present and of its shape, before any
  // is read: a folder that lacks one fails here, not after the others were loaded.
  GPT2Config whole = cfg;
  whole.tp_size = 1;
  whole.tp_rank = 0;
  for (const ParamInfo& p : GPT2ParamLayout(whole)) MESHRUN_RETURN_IF_ERROR(weights.CheckParam(p));
  return weights;
}

Status LoadHuggingFace(const std::string& dir, GPT2<float>* model) {
  MESHRUN_ASSIGN_OR_RETURN(HuggingFaceWeights weights,
                           OpenHuggingFaceChecked(dir, model->config()));
  for (const ParamInfo& p : model->params()) {
    MESHRUN_RETURN_IF_ERROR(weights.ReadParam(p, model->param(p)));
  }
  return OkStatus();
}

nlohmann::json ReadHuggingFaceIdentity(const std::string& dir) {
  nlohmann::json id = nlohmann::json::object();
  StatusOr<nlohmann::json> config =
      ReadJson((fs::path(dir) / "config.json").string(), "model.init_from");
  if (!config.ok()) return id;
  const nlohmann::json& c = *config;
  if (c.contains("model_type") && c["model_type"].is_string()) id["model_type"] = c["model_type"];
  if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty() &&
      c["architectures"][0].is_string()) {
    id["architectures"] = c["architectures"];
  }
  for (const char* key : {"torch_dtype", "dtype"}) {  // transformers 4 and 5
    if (c.contains(key) && c[key].is_string()) {
      id["dtype"] = c[key];
      id["dtype_key"] = key;
    }
  }
  // Ids as config.json writes them: a number, a list (Llama 3.1's eos) or null.
  auto is_ids = [](const nlohmann::json& v) {
    if (v.is_null() || v.is_number_integer()) return true;
    if (!v.is_array()) return false;
    for (const nlohmann::json& x : v) {
      if (!x.is_number_integer()) return false;
    }
    return true;
  };
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (c.contains(key) && is_ids(c[key])) id[key] = c[key];
  }
  // The context it was made for (a job trains with a shorter model.seq_len).
  if (c.contains("max_position_embeddings") && c["max_position_embeddings"].is_number_integer()) {
    id["max_position_embeddings"] = c["max_position_embeddings"];
  }
  const fs::path generation = fs::path(dir) / "generation_config.json";
  std::error_code ec;
  if (fs::is_regular_file(generation, ec)) {
    StatusOr<nlohmann::json> g = ReadJson(generation.string(), "model.init_from");
    if (g.ok()) id["generation_config"] = *g;
  }
  return id;
}

nlohmann::json CheckpointSourceIdentity(const std::string& trainer_json,
                                        const std::string& init_from) {
  const nlohmann::json t = nlohmann::json::parse(trainer_json, nullptr, /*allow_exceptions=*/false);
  if (t.is_object() && t.contains("source") && t["source"].is_object()) return t["source"];
  if (init_from.empty()) return nlohmann::json::object();
  return ReadHuggingFaceIdentity(init_from);
}

StatusOr<DType> ExportDType(const std::string& requested, const nlohmann::json& identity) {
  std::string name = requested;
  if (name == "source") {
    const auto it = identity.find("dtype");
    name = it != identity.end() && it->is_string() ? it->get<std::string>() : "float32";
  }
  if (name == "float32" || name == "fp32") return DType::kF32;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float16" || name == "fp16") return DType::kF16;
  if (requested == "source") {
    return InvalidArgumentError("--dtype: the source model's dtype '" + name +
                                "' is not one export writes (hint: choose one: --dtype float32, "
                                "bfloat16 or float16)");
  }
  return InvalidArgumentError("--dtype: '" + requested +
                              "' is not a dtype (hint: source, float32, bfloat16 or float16)");
}

namespace {

// A string field of an identity ("" when absent or not a string: the identity may come from a
// checkpoint's metadata, which a person can edit).
std::string IdentityString(const nlohmann::json& identity, const char* key) {
  const auto it = identity.find(key);
  return it != identity.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const char* TorchDTypeName(DType dtype) {
  return dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
}

// One file tensor of an export: `rows` rows of a parameter starting at `data`.
struct ExportTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

std::vector<ExportTensor> ExportTensors(const GPT2Config& cfg, float* params) {
  std::vector<ExportTensor> out;
  const std::vector<ParamInfo> layout = GPT2ParamLayout(cfg);
  const int64_t C = cfg.d_model, D = cfg.head_dim(), Cq = int64_t{cfg.n_head} * D,
                Ck = int64_t{cfg.kv_heads()} * D, F = cfg.ff();
  std::vector<float> tr;  // one tensor's transpose at a time
  for (const ParamInfo& p : layout) {
    float* data = params + p.offset;
    if (p.name == "lm_head") {
      out.push_back({"lm_head.weight", p.shape, data});
    } else if (!cfg.llama()) {
      const std::string name = p.name == "wte" || p.name == "wpe"
                                   ? "transformer." + p.name + ".weight"
                                   : "transformer." + p.name;
      std::vector<int64_t> shape = p.shape;
      if (IsConv1DWeight(p.name)) {  // to (in, out), in place
        const int64_t rows = p.shape[0], cols = p.shape[1];
        tr.resize(static_cast<size_t>(p.numel));
        for (int64_t o = 0; o < rows; ++o) {
          for (int64_t i = 0; i < cols; ++i) tr[i * rows + o] = data[o * cols + i];
        }
        std::copy(tr.begin(), tr.end(), data);
        shape = {cols, rows};
      }
      out.push_back({name, shape, data});
    } else if (EndsWith(p.name, "self_attn.qkv.weight") || EndsWith(p.name, "self_attn.qkv.bias")) {
      const bool bias = EndsWith(p.name, ".bias");
      const std::string base =
          "model." + p.name.substr(0, p.name.find("self_attn.qkv.")) + "self_attn.";
      const std::string suffix = bias ? ".bias" : ".weight";
      const int64_t width = bias ? 1 : C;
      auto shape = [&](int64_t rows) {
        return bias ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, C};
      };
      out.push_back({base + "q_proj" + suffix, shape(Cq), data});
      out.push_back({base + "k_proj" + suffix, shape(Ck), data + Cq * width});
      out.push_back({base + "v_proj" + suffix, shape(Ck), data + (Cq + Ck) * width});
    } else if (EndsWith(p.name, "mlp.gate_up.weight")) {
      const std::string base = "model." + p.name.substr(0, p.name.find("gate_up.weight"));
      out.push_back({base + "gate_proj.weight", {F, C}, data});
      out.push_back({base + "up_proj.weight", {F, C}, data + F * C});
    } else {
      out.push_back(
          {"model." + (p.name == "embed_tokens" ? std::string("embed_tokens.weight") : p.name),
           p.shape, data});
    }
  }
  return out;
}

// config.json's special token ids: the source's (as it wrote them), else eos (and GPT-2's
// bos) from the job's tokenizer or vocab_size − 1, and Llama's bos 0.
void SetTokenIds(const GPT2Config& cfg, const HuggingFaceExportOptions& o, nlohmann::json* j) {
  const int64_t eos = o.end_of_text_id >= 0 ? o.end_of_text_id : int64_t{cfg.vocab_size} - 1;
  (*j)["bos_token_id"] = cfg.llama() ? 0 : eos;
  (*j)["eos_token_id"] = eos;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (o.identity.contains(key)) (*j)[key] = o.identity[key];
  }
}

nlohmann::json ExportConfig(const GPT2Config& cfg, const HuggingFaceExportOptions& o) {
  // The source's key for the dtype: torch_dtype (transformers 4, and ours) or dtype (5).
  const std::string dtype_key =
      IdentityString(o.identity, "dtype_key") == "dtype" ? "dtype" : "torch_dtype";
  if (!cfg.llama()) {
    nlohmann::json j = {
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
        {"tie_word_embeddings", cfg.tie_embeddings},
    };
    j[dtype_key] = TorchDTypeName(o.dtype);
    SetTokenIds(cfg, o, &j);
    return j;
  }
  // q/k/v biases without an o_proj bias are Qwen2's layout; LlamaForCausalLM's attention_bias
  // would add one to o_proj too. Of the family the source's type is kept (Mistral stays
  // MistralForCausalLM) when it has that layout.
  const bool llama_family = cfg.arch == Arch::kLlama;
  const bool qwen2 = llama_family && cfg.attention_bias;
  std::string type = qwen2 ? "qwen2" : std::string(cfg.family().hf_model_types[0]);
  nlohmann::json architectures = {qwen2 ? "Qwen2ForCausalLM" : std::string(cfg.family().hf_class)};
  const std::string source_type = IdentityString(o.identity, "model_type");
  if (!llama_family            ? source_type == type
      : source_type == "qwen2" ? qwen2
                               : (source_type == "mistral" || source_type == "llama") && !qwen2) {
    type = source_type;
    if (type == "mistral") architectures = {"MistralForCausalLM"};
    // The source's own class name (e.g. a subclass's), when it is a causal LM.
    const auto it = o.identity.find("architectures");
    if (it != o.identity.end() && it->is_array() && it->size() == 1 && (*it)[0].is_string() &&
        EndsWith((*it)[0].get<std::string>(), "ForCausalLM")) {
      architectures = *it;
    }
  }
  nlohmann::json rope = nullptr;
  if (cfg.rope_scaling.llama3) {
    rope = {
        {"rope_type", "llama3"},
        {"factor", cfg.rope_scaling.factor},
        {"low_freq_factor", cfg.rope_scaling.low_freq_factor},
        {"high_freq_factor", cfg.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", cfg.rope_scaling.original_max_position_embeddings}};
  }
  nlohmann::json j = {
      {"architectures", architectures},
      {"model_type", type},
      {"hidden_size", cfg.d_model},
      {"intermediate_size", cfg.ff()},
      {"num_hidden_layers", cfg.n_layer},
      {"num_attention_heads", cfg.n_head},
      {"num_key_value_heads", cfg.kv_heads()},
      {"head_dim", cfg.head_dim()},
      {"hidden_act", cfg.family().mlp == MlpKind::kGeGLU ? "gelu_pytorch_tanh" : "silu"},
      {"max_position_embeddings",
       std::max(cfg.max_seq_len,
                cfg.rope_scaling.llama3
                    ? static_cast<int>(cfg.rope_scaling.factor *
                                       cfg.rope_scaling.original_max_position_embeddings)
                    : cfg.max_seq_len)},
      {"rms_norm_eps", cfg.ln_eps},
      {"rope_theta", cfg.rope_theta},
      {"rope_scaling", rope},
      {"tie_word_embeddings", cfg.tie_embeddings},
      {"vocab_size", cfg.vocab_size},
      {"initializer_range", 0.02},
      {"attention_dropout", 0.0},
      {dtype_key, TorchDTypeName(o.dtype)},
  };
  SetTokenIds(cfg, o, &j);
  if (const auto it = o.identity.find("max_position_embeddings");
      it != o.identity.end() && it->is_number_integer() &&
      it->get<int64_t>() > j["max_position_embeddings"].get<int64_t>()) {
    j["max_position_embeddings"] = *it;
  }
  // A sliding window needs a class that has one: Mistral's (or Qwen2's, on every layer).
  if (cfg.sliding_window > 0 && type == "llama") {
    type = "mistral";
    j["model_type"] = type;
    j["architectures"] = {"MistralForCausalLM"};
  }
  const nlohmann::json window =
      cfg.sliding_window > 0 ? nlohmann::json(cfg.sliding_window) : nlohmann::json(nullptr);
  if (type == "qwen2") {
    j["use_sliding_window"] = cfg.sliding_window > 0;
    j["sliding_window"] = window;
    if (cfg.sliding_window > 0) j["max_window_layers"] = 0;
  } else if (type == "mistral") {
    j["sliding_window"] = window;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  return j;
}

// generation_config.json: the source's (its sampling defaults too), with the special token ids
// of config.json where it names none; without a source, those ids.
nlohmann::json ExportGenerationConfig(const nlohmann::json& config,
                                      const HuggingFaceExportOptions& o) {
  nlohmann::json g =
      o.identity.contains("generation_config") && o.identity["generation_config"].is_object()
          ? o.identity["generation_config"]
          : nlohmann::json{{"_from_model_config", true}};
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (!g.contains(key) && config.contains(key) && !config[key].is_null()) g[key] = config[key];
  }
  return g;
}

}  // namespace

Status ExportHuggingFace(const GPT2Config& cfg, float* params, const std::string& dir,
                         const HuggingFaceExportOptions& options) {
  const int64_t max_shard_bytes = options.max_shard_bytes;
  const DType dtype = options.dtype;
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return InvalidArgumentError(std::string("--dtype: ") + DTypeName(dtype) +
                                " is not one export writes (hint: float32, bfloat16 or float16)");
  }
  const int64_t element = static_cast<int64_t>(DTypeSize(dtype));
  std::error_code made;
  fs::create_directories(dir, made);
  if (made)
    return InvalidArgumentError("--output-dir: cannot create " + dir + ": " + made.message());
  const std::vector<ExportTensor> tensors = ExportTensors(cfg, params);
  // Shards of at most max_shard_bytes (a tensor larger than that alone in its shard).
  std::vector<std::vector<const ExportTensor*>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const ExportTensor& t : tensors) {
    const int64_t bytes = t.numel() * element;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes;
    total += bytes;
  }
  const fs::path out(dir);
  std::error_code ec;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    if (shards.size() == 1) {
      std::snprintf(name, sizeof(name), "model.safetensors");
    } else {
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    }
    std::vector<TensorToWrite> files;
    std::vector<std::vector<uint16_t>> narrow;  // this shard's 16-bit copies
    narrow.reserve(shards[k].size());
    for (const ExportTensor* t : shards[k]) {
      const void* data = t->data;
      if (dtype != DType::kF32) {
        std::vector<uint16_t>& h = narrow.emplace_back(static_cast<size_t>(t->numel()));
        for (size_t i = 0; i < h.size(); ++i) {
          h[i] = dtype == DType::kBF16 ? FloatToBf16(t->data[i]) : FloatToHalf(t->data[i]);
        }
        data = h.data();
      }
      files.push_back({t->name, dtype, t->shape, data});
      weight_map[t->name] = name;
    }
    MESHRUN_RETURN_IF_ERROR(WriteSafetensors((out / name).string(), files, {{"format", "pt"}}));
  }
  // A single file and an index never stand side by side: transformers prefers the index.
  if (shards.size() == 1) {
    fs::remove(out / "model.safetensors.index.json", ec);
  } else {
    fs::remove(out / "model.safetensors", ec);
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    MESHRUN_RETURN_IF_ERROR(
        WriteFileAtomic((out / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  const nlohmann::json config = ExportConfig(cfg, options);
  MESHRUN_RETURN_IF_ERROR(WriteFileAtomic((out / "generation_config.json").string(),
                                          ExportGenerationConfig(config, options).dump(2) + "\n"));
  return WriteFileAtomic((out / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace meshrun
