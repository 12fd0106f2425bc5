// Checks run before any training starts, so that a spec that would fail later fails now with
// exit 2 and the field: `meshrun validate`, the start of `meshrun train` and `meshrun submit`
// (docs/cli.md "Checks before training"). Each reads the spec's paths on this host.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "common/status.h"

namespace meshrun::client {

struct PreflightOptions {
  // Ranks of the job this host runs at once (train --nproc N: N). The memory check asks
  // whether that many ranks fit in this host's memory.
  int ranks_on_host = 1;
  // This host's memory in bytes; 0: HostMemoryBytes(); negative: no memory check.
  double host_memory_bytes = 0;
  // Whether data.train, data.val and checkpoint.dir are checked on this host (off for
  // `submit --no-local-checks`, where they exist only on the workers).
  bool check_paths = true;
  // Whether resources.device must be usable in this process (standalone `train`; a cluster's
  // device is the workers').
  bool check_device = false;
  // Text read with data.tokenizer is tokenized now, whatever its size, into the cache under
  // checkpoint.dir (`meshrun train`: its ranks then read the cache); `note` hears where from.
  bool fill_token_cache = false;
  std::function<void(const std::string&)> note;
};

// The first problem found, as INVALID_ARGUMENT naming the field (exit 2), in this order (the
// quick model checks before any data is read or tokenized). Each is the check the ranks make
// themselves, calling the same engine function, so what passes here passes there:
//  - resources.device (check_device): engine/train/device.h's CheckTrainingDevice.
//  - model.init_from: OpenHuggingFaceChecked (engine/model/hf_checkpoint.h): config.json of a
//    model_type meshrun builds with every key it needs, agreeing with the spec's model, and
//    model.safetensors or every shard of its index present, complete and holding every tensor.
//  - checkpoint.dir: a folder, or one that can be created, in which this process can create
//    entries (probed with a temporary folder that is removed again); with checkpoint.resume
//    auto, the newest complete checkpoint there fits the model (CheckResumeFits).
//  - data.train / data.val: the stream loads as the ranks will load it (missing file, binary
//    bytes for format text, a bad llm.c header, an empty folder…), its vocabulary is the
//    model's (CheckStreamVocab; a model larger than data.tokenizer's vocabulary is padded,
//    and `note` hears PaddedVocabNote's line once) and it holds one window of seq_len + 1 tokens
//    (CheckStreamWindow). Token files (llm.c, nanoGPT; one, a folder or a glob of shards) are
//    mapped as a rank maps them: only headers and sizes are read, and their ids (for the
//    vocabulary) only up to 64 MiB. Text over 64 MiB in all is only checked to exist and be
//    readable (and its vocabulary), unless fill_token_cache tokenizes it.
//  - the memory estimate (CheckJobFitsHost of common/memory_estimate.h).
// Nothing is left behind on disk.
Status CheckBeforeTraining(const JobSpec& spec, const ParallelDims& mesh,
                           const PreflightOptions& options = {});

// What a valid spec does that its author may not expect, one line each for stderr (`validate`
// and `train` print them): "note: ..." when checkpoint.dir is unset (nothing is saved),
// "warning: ..." for train.lr 0 (the weights never change). Empty when there is nothing to say.
std::vector<std::string> SpecNotes(const JobSpec& spec);

// Physical memory of this host, or the cgroup's limit when that is lower.
double HostMemoryBytes();

}  // namespace meshrun::client
