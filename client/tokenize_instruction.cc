// `meshrun tokenize` of instruction data (docs/data.md "Making token files with masks"): JSONL
// records rendered with a chat template (or text files, each one sample), encoded in parallel
// over records, laid out in windows, and written as OUT.bin with OUT.mask beside it.
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/command.h"
#include "client/tokenize_shared.h"
#include "engine/data/instruction.h"
#include "engine/data/mapped_tokens.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace meshrun::client {

// Instruction data: every record rendered (JSONL) or every text file as one target document,
// encoded in parallel over records, laid out (back to back, or in windows of --seq-len), and
// written as OUT.bin with OUT.mask beside it (one flag byte per token). Held in memory.
int RunInstructionTokenize(const TokenizeFlags& o, std::shared_ptr<const Tokenizer> tok,
                           int threads) {
  if (o.shard_tokens > 0) {
    return ReportError(InvalidArgumentError(
        "--shard-tokens: not with --template or --masks, which write one token file and its "
        ".mask (hint: split the JSONL inputs over several runs, one -o file each)"));
  }
  if (tok->end_of_text_id() < 0) return ReportError(NoEndOfTextError("samples"));
  if (o.pack && o.seq_len <= 0) {
    return ReportError(InvalidArgumentError(
        "--pack: packs samples into windows of --seq-len tokens (hint: add --seq-len N, "
        "model.seq_len of the job)"));
  }
  std::vector<InputFile> files;
  std::vector<std::string> skipped;
  if (Status s = ListInputs(o.inputs, threads, &files, &skipped); !s.ok()) return ReportError(s);
  StatusOr<ChatTemplate> tmpl = ResolveChatTemplate(o.chat_template, o.tokenizer);
  if (!tmpl.ok() && !o.chat_template.empty() && o.chat_template != "tokenizer") {
    std::string m = tmpl.status().message();
    if (m.rfind("data.template: ", 0) == 0) m = "--template: " + m.substr(15);
    return ReportError(InvalidArgumentError(m));
  }
  // Every record (JSONL line, or text file) with where it came from.
  struct Record {
    std::string where;
    std::string text;  // the JSONL line, or the file's text
    bool jsonl = true;
  };
  std::vector<Record> records;
  for (const InputFile& f : files) {
    std::string bytes;
    if (Status s = ReadTextFile(f.path, &bytes); !s.ok()) return ReportError(s);
    if (!f.jsonl) {
      if (!bytes.empty()) records.push_back({f.path, std::move(bytes), false});
      continue;
    }
    size_t pos = 0;
    int64_t line = 0;
    while (pos < bytes.size()) {
      size_t end = bytes.find('\n', pos);
      if (end == std::string::npos) end = bytes.size();
      std::string rec = bytes.substr(pos, end - pos);
      pos = end + 1;
      ++line;
      if (rec.find_first_not_of(" \t\r") == std::string::npos) continue;
      records.push_back({f.path + ":" + std::to_string(line), std::move(rec), true});
    }
  }
  std::vector<std::vector<int32_t>> ids(records.size());
  std::vector<std::vector<uint8_t>> flags(records.size());
  std::vector<Status> errors(records.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < records.size();) {
      const Record& r = records[i];
      StatusOr<std::vector<TextPart>> parts =
          r.jsonl ? RecordParts(r.text, tmpl.ok() ? &*tmpl : nullptr, r.where)
                  : StatusOr<std::vector<TextPart>>(std::vector<TextPart>{{r.text, true}});
      if (!parts.ok()) {
        errors[i] = parts.status();
        continue;
      }
      if (Status s = EncodeSample(*tok, *parts, &ids[i], &flags[i]); !s.ok()) {
        errors[i] = TokenizerError(s, r.where);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && t < static_cast<int>(records.size()); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < records.size(); ++i) {
    if (errors[i].ok()) continue;
    if (!tmpl.ok() && errors[i].message().find("no chat template") != std::string::npos) {
      return ReportError(InvalidArgumentError(records[i].where + ": " + tmpl.status().message()));
    }
    return ReportError(errors[i]);
  }
  std::vector<int32_t> all_ids;
  std::vector<uint8_t> all_flags;
  int64_t samples = 0;
  if (o.seq_len > 0) {
    WindowPacker packer(o.seq_len, o.pack, tok->end_of_text_id());
    for (size_t i = 0; i < records.size(); ++i) packer.Add(ids[i], flags[i]);
    samples = packer.samples();
    packer.Finish();
    all_ids = std::move(packer.tokens());
    all_flags = std::move(packer.flags());
  } else {
    for (size_t i = 0; i < records.size(); ++i) {
      if (ids[i].empty()) continue;
      all_ids.insert(all_ids.end(), ids[i].begin(), ids[i].end());
      all_flags.insert(all_flags.end(), flags[i].begin(), flags[i].end());
      ++samples;
    }
  }
  if (all_ids.empty()) return ReportError(InvalidArgumentError("no records to tokenize"));
  if (Status s = WriteLlmcTokens(o.output, all_ids, tok->vocab_size()); !s.ok()) {
    return ReportError(s);
  }
  const std::string mask = MaskPathOf(o.output);
  if (Status s = WriteMaskFile(mask, all_flags, o.seq_len); !s.ok()) return ReportError(s);
  int64_t targets = 0;
  for (uint8_t f : all_flags) targets += IsLossTarget(f, LossOn::kCompletion) ? 1 : 0;
  if (!o.quiet) {
    std::fprintf(stderr,
                 "tokenize: %lld samples, %lld tokens (%lld completion targets) into %s and %s\n",
                 static_cast<long long>(samples), static_cast<long long>(all_ids.size()),
                 static_cast<long long>(targets), o.output.c_str(), mask.c_str());
  }
  return kExitOk;
}

}  // namespace meshrun::client
