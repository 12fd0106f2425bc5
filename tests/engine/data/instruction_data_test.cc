// Instruction data without a tokenizer: chat templates recognised in tokenizer_config.json (and
// refused with the fix), the parts each family renders, samples laid out in windows (one per
// window, or packed; a long one runs on), the .mask file beside a token file read back mapped
// (round trip through LoadTokens), and the loss mask of a window's targets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/data/instruction.h"
#include "engine/data/mapped_tokens.h"
#include "engine/data/token_stream.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

std::string InstrConfig(const std::string& tmpl, const std::string& eos = "</s>") {
  return nlohmann::json{{"chat_template", tmpl}, {"eos_token", eos}, {"bos_token", "<s>"}}.dump();
}

std::string InstrJoined(const std::vector<TextPart>& parts, bool target) {
  std::string s;
  for (const TextPart& p : parts) {
    if (p.target == target) s += "[" + p.text + "]";
  }
  return s;
}

TEST(InstructionTemplates, FamiliesAreRecognisedOrRefusedWithTheFix) {
  const std::string qwen =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_"
      "start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor "
      "%}";
  StatusOr<ChatTemplate> t =
      ChatTemplateFromConfig("", InstrConfig(qwen), "tok/tokenizer_config.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->family, TemplateFamily::kChatml);
  EXPECT_EQ(t->default_system, "You are a helpful assistant.");
  t = ChatTemplateFromConfig("", InstrConfig("{{ bos_token }}[INST] <<SYS>> [/INST]"), "c");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->family, TemplateFamily::kLlama2);
  t = ChatTemplateFromConfig("", InstrConfig("{{ bos_token }}[INST] x [/INST]"), "c");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->family, TemplateFamily::kMistral);
  t = ChatTemplateFromConfig("", InstrConfig("<|start_header_id|>…<|eot_id|>"), "c");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->family, TemplateFamily::kLlama3);
  EXPECT_EQ(t->bos, "<s>");  // the config's bos_token

  t = ChatTemplateFromConfig("", InstrConfig("{% for m in messages %}{{ m.content }}{% endfor %}"),
                             "tok/tokenizer_config.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("data.template: the chat_template of "
                                      "tok/tokenizer_config.json is none of the families"),
            std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("(hint: set data.template to chatml"), std::string::npos);
  t = ChatTemplateFromConfig("", InstrConfig("<|start_header_id|>Cutting Knowledge Date<|eot_id|>"),
                             "c");
  EXPECT_FALSE(t.ok());
  t = ChatTemplateFromConfig("", "{}", "c");
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("has no chat_template"), std::string::npos);
  t = ChatTemplateFromConfig("{completion} then {prompt}", "", "");
  EXPECT_FALSE(t.ok());
  t = ChatTemplateFromConfig("Q: {prompt}\nA: {completion}\n", "", "");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->family, TemplateFamily::kCustom);
  EXPECT_EQ(t->before_completion, "Q: {prompt}\nA: ");
  EXPECT_EQ(t->after_completion, "\n");
}

TEST(InstructionTemplates, EachFamilyMarksOnlyTheAssistantParts) {
  const std::vector<ChatMessage> chat = {{"system", "S"},
                                         {"user", " u1 "},
                                         {"assistant", " a1 "},
                                         {"user", "u2"},
                                         {"assistant", "a2"}};
  ChatTemplate t;
  t.family = TemplateFamily::kChatml;
  StatusOr<std::vector<TextPart>> p = RenderChat(chat, t);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(InstrJoined(*p, true), "[ a1 <|im_end|>][a2<|im_end|>]");
  t.family = TemplateFamily::kLlama3;
  t.bos = "<|begin_of_text|>";
  p = RenderChat(chat, t);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(InstrJoined(*p, true), "[a1<|eot_id|>][a2<|eot_id|>]");
  EXPECT_EQ(p->front().text.rfind(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>", 0),
            0u);
  t.family = TemplateFamily::kLlama2;
  t.bos = "<s>";
  t.eos = "</s>";
  p = RenderChat(chat, t);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(InstrJoined(*p, false),
            "[<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n u1 [/INST]][<s>[INST] u2 [/INST]]");
  EXPECT_EQ(InstrJoined(*p, true), "[ a1 </s>][ a2 </s>]");
  t.family = TemplateFamily::kMistral;
  EXPECT_FALSE(RenderChat(chat, t).ok());  // no system turn
  p = RenderChat({chat.begin() + 1, chat.end()}, t);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(InstrJoined(*p, true), "[ a1 </s>][a2</s>]");
  EXPECT_FALSE(RenderChat({{"assistant", "a"}, {"user", "u"}}, t).ok());  // must alternate

  StatusOr<std::vector<TextPart>> r =
      RecordParts(R"({"prompt": "p", "completion": "c"})", &t, "f.jsonl:3");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(InstrJoined(*r, true), "[c</s>]");
  r = RecordParts(R"({"text": "all of it"})", nullptr, "f.jsonl:4");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(InstrJoined(*r, true), "[all of it]");
  r = RecordParts(R"({"prompt": "p"})", &t, "f.jsonl:5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("f.jsonl:5: the record has \"prompt\" without"),
            std::string::npos);
  r = RecordParts(R"({"messages": [{"role": "tool", "content": "x"}]})", &t, "f.jsonl:6");
  EXPECT_FALSE(r.ok());
  r = RecordParts(R"({"messages": [{"role": "user", "content": "x"}]})", nullptr, "f.jsonl:7");
  EXPECT_FALSE(r.ok());
}

TEST(InstructionSpec, LossOnIsParsedOnceIntoAnEnum) {
  EXPECT_EQ(*ParseLossOn("all"), LossOn::kAll);
  EXPECT_EQ(*ParseLossOn("completion"), LossOn::kCompletion);
  JobSpec spec;
  spec.data.train = "x";
  EXPECT_EQ(spec.train.loss_on_mode(), LossOn::kAll);
  spec.train.loss_on = "completion";
  EXPECT_EQ(spec.train.loss_on_mode(), LossOn::kCompletion);
  spec.train.loss_on = "prompt";
  const Status s = ValidateJobSpec(spec);
  EXPECT_NE(s.message().find("train.loss_on: 'prompt' is not one of 'all' or 'completion'"),
            std::string::npos)
      << s.message();
  spec.train.loss_on = "all";
  spec.data.chat_template = "### Q:\n{prompt}\n### A:\n{completion}\n";  // newlines allowed
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
}

TEST(InstructionWindows, OnePerWindowOrPackedALongOneRunsOn) {
  const int T = 4, pad = 9;
  auto sample = [](int n, int32_t v) {
    std::vector<uint8_t> f(n, kTokenTarget);
    f[0] |= kTokenDocStart;
    return std::make_pair(std::vector<int32_t>(n, v), f);
  };
  for (bool pack : {false, true}) {
    WindowPacker w(T, pack, pad);
    for (auto [n, v] :
         std::vector<std::pair<int, int32_t>>{{2, 1}, {2, 2}, {3, 3}, {6, 4}, {1, 5}}) {
      auto [ids, flags] = sample(n, v);
      w.Add(ids, flags);
    }
    w.Finish();
    const std::vector<int32_t> want =
        pack ? std::vector<int32_t>{1, 1, 2, 2, 3, 3, 3, pad, 4, 4, 4, 4, 4, 4, 5, pad, pad}
             : std::vector<int32_t>{1, 1, pad, pad, 2, 2,   pad, pad, 3,   3,   3,   pad, 4,
                                    4, 4, 4,   4,   4, pad, pad, 5,   pad, pad, pad, pad};
    EXPECT_EQ(w.tokens(), want) << "pack " << pack;
    ASSERT_EQ(w.flags().size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ((w.flags()[i] & kTokenPad) != 0, want[i] == pad) << i;
    }
    EXPECT_EQ(w.samples(), 5);
  }
}

TEST(InstructionMasks, MaskFileRoundTripsThroughLoadTokensAndMasksTargets) {
  const fs::path dir = fs::temp_directory_path() / ("meshrun_mask_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<int32_t> ids = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  const std::vector<uint8_t> flags = {kTokenDocStart, 0,         kTokenTarget,
                                      kTokenTarget,   kTokenPad, kTokenDocStart | kTokenTarget,
                                      kTokenTarget,   0,         kTokenPad};
  const std::string bin = (dir / "sft.bin").string();
  ASSERT_TRUE(WriteLlmcTokens(bin, ids, 300).ok());
  ASSERT_TRUE(WriteMaskFile(MaskPathOf(bin), flags, 4).ok());
  EXPECT_EQ(MaskPathOf(bin), (dir / "sft.mask").string());
  StatusOr<TokenStream> s = LoadTokens(bin, "auto");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->has_flags());
  EXPECT_EQ(s->window_seq_len, 4);
  std::vector<uint8_t> got(flags.size());
  ASSERT_TRUE(s->ReadFlags(0, static_cast<int64_t>(got.size()), got.data()).ok());
  EXPECT_EQ(got, flags);
  EXPECT_FALSE(s->ReadFlags(5, 5, got.data()).ok());

  // Window 1 of T = 4: targets are tokens 5..8.
  std::vector<int32_t> targets = {10, 11, 12, 13};
  StatusOr<int64_t> n = MaskTargets(*s, 5, 4, LossOn::kCompletion, targets.data());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);  // token 5 starts a sample, 7 is prompt, 8 padding
  EXPECT_EQ(targets, (std::vector<int32_t>{kIgnoreTarget, 11, kIgnoreTarget, kIgnoreTarget}));
  EXPECT_EQ(*CountTargets(*s, 5, 4, LossOn::kAll), 2);
  EXPECT_EQ(*CountTargets(*s, 1, 4, LossOn::kCompletion), 2);

  JobSpec spec;
  spec.model.seq_len = 8;
  Status st = CheckStreamLossMask(*s, spec, "data.train");
  EXPECT_NE(st.message().find("laid out in windows of seq_len 4, but model.seq_len is 8"),
            std::string::npos)
      << st.message();
  spec.model.seq_len = 4;
  EXPECT_TRUE(CheckStreamLossMask(*s, spec, "data.train").ok());

  // A mask of the wrong length, and one for only some shards of a folder, are refused.
  ASSERT_TRUE(WriteMaskFile(MaskPathOf(bin), {1, 1}, 0).ok());
  s = LoadTokens(bin, "auto");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("holds 2 flags after its header but its token file has 9"),
            std::string::npos)
      << s.status().message();
  fs::remove(MaskPathOf(bin));
  s = LoadTokens(bin, "auto");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->has_flags());
  spec.train.loss_on = "completion";
  st = CheckStreamLossMask(*s, spec, "data.train");
  EXPECT_NE(st.message().find("train.loss_on: completion, but data.train"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshrun
