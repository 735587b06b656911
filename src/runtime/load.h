// The one way to load: a LoadRequest (what a front end was asked for) in, a LoadedEngine (the
// model, its tokenizer, its drafter and the memory plan that counted all of them) out. The CLI
// commands (run, chat, bench, serve, propose), the C API and through it Python all load here, so
// the order is the same everywhere:
//   1. the model folder and the drafter are checked (an unknown drafter or a folder without a
//      config fails before anything slow); the default drafter is the folder's draft/ subfolder;
//   2. a draft model folder is opened once (config + mapped weights) and counted in the target's
//      memory plan (its weights, and its cache per position for every planned sequence);
//   3. the passes are planned: rows per prompt pass (a number, or automatic from the budget and
//      the prompt), at least the verify rows of every sequence decoding at once;
//   4. the target loads (engine/engine.h) and the tokenizer is checked against its vocabulary.
// Each sequence then gets its own drafter from new_drafter(); the draft model is shared.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "engine/vision_encoder.h"
#include "generate/round.h"
#include "prefix/prefix_store.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

class DraftModel;

enum class NeedTokenizer { kOptional, kRequired };

// Prefix snapshots (prefix/prefix_store.h) as the user asked for them.
struct StateCacheSettings {
  bool enabled = true;  // false: no store, nothing kept (--state-cache none)
  std::string dir;      // the disk tier's folder ("" = states/<model id> in the cache folder)
  uint64_t disk_bytes = 16ull << 30;  // its size (0 = RAM only)
  // The RAM share of the budget (unset: default_state_cache_bytes, room for two full-context
  // states).
  std::optional<uint64_t> ram_bytes;
};

struct LoadRequest {
  EngineOptions engine;  // the model folder (resolved by the front end) and engine settings
  // "" = the model folder's draft/ subfolder when it has one, else none; then none, ngram, mtp
  // (DeepSeek-V3's MTP layer of the model itself, never the default), a draft model folder
  // (EAGLE-3.x, DSpark) or the test aid replay:FILE.
  std::string draft;
  DraftMax draft_max;
  int64_t prefill_chunk = 0;  // prompt rows per pass; 0 = automatic (as the budget allows)
  int64_t prompt_rows = 0;    // with the automatic chunk: rows the prompt needs (0 = the context)
  int sequences = 1;          // states the plan holds at once
  int parallel = 1;           // sequences decoding in one pass (their verify rows share it)
  NeedTokenizer tokenizer = NeedTokenizer::kOptional;
  std::string who = "this command";  // for "... has no tokenizer; WHO needs one"
  // A tokenizer the front end already loaded (to count its prompt before planning).
  std::optional<Tokenizer> loaded_tokenizer;
  StateCacheSettings state_cache;
};

struct LoadedEngine {
  std::unique_ptr<LoadedModel> model;
  std::optional<Tokenizer> tokenizer;
  std::string draft = "none";  // the drafter spec after the default was resolved
  DraftMax draft_max;
  std::shared_ptr<const DraftModel> draft_model;  // when `draft` is a draft model folder
  int64_t pass_rows = 0;  // rows of one pass: the plan's, at least every decoder's verify rows
  std::unique_ptr<PrefixStore> store;  // prefix snapshots (null: no reuse)
  // The vision tower and projector, opened with the model when its checkpoint holds them (null:
  // a text-only model, which refuses images). Sequences encode their images with it
  // (SequenceSpec::vision) and the renderer measures them with image_measurer(vision.get()).
  std::unique_ptr<VisionEncoder> vision;

  // A new drafter for one sequence (nullptr for none).
  std::unique_ptr<Drafter> new_drafter();
  // The same, ready to drive: `holder` owns the drafter the config points to.
  DraftConfig draft_config(std::unique_ptr<Drafter>& holder);
  // A factory for the server's sequences.
  std::function<std::unique_ptr<Drafter>()> drafter_factory();
};

LoadedEngine load_engine(LoadRequest request);

// Checks a drafter spec without loading anything (flag validation): none, ngram, replay:FILE
// or a folder holding a config.json. Throws InvalidArgument naming what is wrong.
void check_draft_spec(const std::string& spec);
// The default drafter of a model folder: its draft/ subfolder when it has one, else none.
std::string default_draft(const std::string& model_dir);
// What a snapshot's numbers depend on: the checkpoint (config.json, every tensor's name, dtype,
// shape and place, and the first bytes of every trunk tensor: a fine-tune has the same headers
// but other weights), the trunk format, the kernel set and the device.
// Snapshots of one id are continued bit for bit by a model of the same id.
std::string model_state_id(const LoadedModel& model, const EngineOptions& e);

}  // namespace deltafin
