// The objects behind the C API's opaque handles, and the one function that turns a C++
// exception into a status and a per-thread message. Kept in one internal header so the C
// surface (include/deltafin/deltafin.h) never shows a C++ type, and so every entry point
// converts errors the same way (no exception may cross the boundary).
#pragma once

#include <deltafin/deltafin.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "generate/chat_session.h"
#include "generate/driver.h"
#include "generate/generation.h"
#include "prefix/reuse.h"
#include "runtime/load.h"
#include "server/request.h"
#include "server/response.h"
#include "tokenizer/tokenizer.h"

struct deltafin_model {
  std::string path;
  // The model, its tokenizer and drafter as the one load path made them (runtime/load.h);
  // `model` and `tok` point into it.
  deltafin::LoadedEngine engine;
  deltafin::LoadedModel* model = nullptr;
  std::optional<deltafin::Tokenizer>& tok = engine.tokenizer;
  deltafin::server::ServeLimits limits;  // what the server would apply to requests
  std::mutex pass;                       // one forward pass at a time on this model
  // A drafter and draft settings for one generation (`holder` owns the drafter).
  deltafin::DraftConfig draft_config(std::unique_ptr<deltafin::Drafter>& holder) {
    return engine.draft_config(holder);
  }

  const deltafin::Tokenizer& tokenizer(const char* who) const;
  // One locked forward pass.
  std::vector<float> forward(deltafin::State& state, std::span<const int32_t> ids, bool all);
};

struct deltafin_session {
  deltafin_model* m = nullptr;
  deltafin::State state;
  std::vector<int32_t> history;  // every id of the sequence (the state lags by `pending`)
  std::vector<int32_t> pending;  // sampled last by a generation, not yet consumed
};

struct deltafin_chat {
  deltafin_model* m = nullptr;
  std::unique_ptr<deltafin::ChatSession> session;
  deltafin_stream* active = nullptr;  // the turn in progress (its stream uses our state)
};

// A generation in progress, producing the server's chunks (see stream.cpp).
struct deltafin_stream {
  deltafin_model* m = nullptr;
  deltafin::State own_state;
  deltafin::State* state = nullptr;
  std::unique_ptr<deltafin::Generation> gen;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::unique_ptr<deltafin::server::ResponseBuilder> builder;
  std::unique_ptr<deltafin::StatsRecorder> rec;
  std::unique_ptr<deltafin::Drafter> drafter;
  deltafin::DraftConfig draft;
  std::deque<std::string> pending;  // chunks produced, not returned yet
  size_t sent = 0;                  // tokens folded into the builder
  std::vector<int32_t> input;       // what the generation was fed before sampling
  std::vector<int32_t> prompt;      // a stream's whole prompt (a chat turn: empty)
  int64_t cached = 0;               // prompt ids the state held before it (restored or kept)
  std::optional<deltafin::SequenceReuse> reuse;  // the prefix store's restore and snapshots
  bool begun = false, ended = false;
  deltafin::server::Usage usage;
  std::optional<deltafin::RunStats> stats;
  deltafin_chat* chat = nullptr;  // a chat turn: recorded in the chat when it ends
};

namespace deltafin::capi {

// Runs `f`, returning DELTAFIN_OK or the status of the exception it threw (the message is kept
// for deltafin_last_error on this thread).
deltafin_status guard(const std::function<void()>& f);
// Fails with DELTAFIN_ERR_ARGUMENT naming `what` when `p` is NULL.
void require(const void* p, const char* what);
// malloc'ed copies the caller frees with deltafin_free.
char* copy_string(const std::string& s);
int32_t* copy_ids(const std::vector<int32_t>& ids);
// Parses a JSON request argument; ARGUMENT error naming `what` when it is not a JSON object.
nlohmann::ordered_json parse_object(const char* text, const char* what);

}  // namespace deltafin::capi
