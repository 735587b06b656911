// The objects behind the C API's opaque handles, and the one function that turns a C++
// exception into a status and a per-thread message. Kept in one internal header so the C
// surface (include/deltafin/deltafin.h) never shows a C++ type, and so every entry point
// converts errors the same way (no exception may cross the boundary).
#pragma once

#include <deltafin/deltafin.h>

#include <atomic>
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
#include "runtime/load.h"
#include "runtime/sequence.h"
#include "server/request.h"
#include "server/response.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::capi {

// Every handle the C API gives out. Its lifetime is counted: the caller's reference (dropped by
// *_free), one per call in progress (taken on entry, so a handle freed by another thread while
// a call uses it stays alive until that call returns), and one per handle made from it (a
// session, chat or stream keeps its model alive; a chat turn's stream keeps its chat). *_free
// retires the handle: later calls with it fail (DELTAFIN_ERR_ARGUMENT, "... was freed"), a call
// in progress stops at its next pass, and the object goes when its last reference does. So no
// free, from any thread, can pull memory out from under a call.
struct Handle {
  mutable std::atomic<int> refs{1};
  std::atomic<bool> retired{false};
  virtual ~Handle() = default;
};

// Registers a new handle (the caller's reference).
void adopt(Handle* h);
// Drops one reference; the last one deletes the handle.
void release(const Handle* h);
// *_free: retires a live handle and drops the caller's reference (a handle already freed is
// ignored).
void retire(Handle* h);
// Takes a reference on a live handle; false when `h` is not one (freed, or never made here).
bool acquire(const Handle* h);

// A counted reference: held by a call in progress or by a handle made from another.
template <class T>
class Ref {
 public:
  Ref() = default;
  // Takes a reference on `h`, failing with DELTAFIN_ERR_ARGUMENT naming `what` when `h` is NULL
  // or not a live handle.
  Ref(T* h, const char* what);
  Ref(const Ref& o) : p_(o.p_) {
    if (p_ != nullptr) ++p_->refs;
  }
  Ref& operator=(Ref o) {
    std::swap(p_, o.p_);
    return *this;
  }
  ~Ref() {
    if (p_ != nullptr) release(p_);
  }
  // Wraps a reference already taken with acquire().
  static Ref taken(T* h) {
    Ref r;
    r.p_ = h;
    return r;
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

// For the calls that cannot fail (getters, reset): the handle, or no reference when it is not
// live.
template <class T>
Ref<T> peek(T* h) {
  return h != nullptr && acquire(h) ? Ref<T>::taken(h) : Ref<T>();
}

}  // namespace deltafin::capi

struct deltafin_model : deltafin::capi::Handle {
  ~deltafin_model() override;
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

struct deltafin_session : deltafin::capi::Handle {
  deltafin::capi::Ref<deltafin_model> m;
  deltafin::State state;
  std::vector<int32_t> history;  // every id of the sequence (the state lags by `pending`)
  std::vector<int32_t> pending;  // sampled last by a generation, not yet consumed
};

struct deltafin_chat : deltafin::capi::Handle {
  deltafin::capi::Ref<deltafin_model> m;
  std::unique_ptr<deltafin::ChatSession> session;
  std::atomic<deltafin_stream*> active{nullptr};  // the turn in progress (it uses our state)
  std::vector<deltafin::ChatImage> attached;      // for the next user message (add_image)
};

// A generation in progress, producing the server's chunks (see stream.cpp).
struct deltafin_stream : deltafin::capi::Handle {
  ~deltafin_stream() override;
  deltafin::capi::Ref<deltafin_model> m;
  // Its generation, drafter, state (a chat turn: the chat's) and reuse.
  std::unique_ptr<deltafin::Sequence> seq;
  std::unique_ptr<deltafin::server::ResponseBuilder> builder;
  std::deque<std::string> pending;  // chunks produced, not returned yet
  size_t sent = 0;                  // tokens folded into the builder
  bool begun = false, ended = false;
  deltafin::Usage usage;
  std::optional<deltafin::RunStats> stats;
  deltafin_chat* chat = nullptr;             // a chat turn: recorded in the chat when it ends
  deltafin::capi::Ref<deltafin_chat> owner;  // a chat turn's chat, kept alive while we are
};

namespace deltafin::capi {

// Runs `f`, returning DELTAFIN_OK or the status of the exception it threw (the message is kept
// for deltafin_last_error on this thread).
deltafin_status guard(const std::function<void()>& f);
// Fails with DELTAFIN_ERR_ARGUMENT naming `what` when `p` is NULL.
void require(const void* p, const char* what);
// Fails with DELTAFIN_ERR_ARGUMENT naming `what` unless `h` is a live handle.
[[noreturn]] void fail_not_live(const void* h, const char* what);

template <class T>
Ref<T>::Ref(T* h, const char* what) {
  require(h, what);
  if (!acquire(h)) fail_not_live(h, what);
  p_ = h;
}
// malloc'ed copies the caller frees with deltafin_free.
char* copy_string(const std::string& s);
int32_t* copy_ids(const std::vector<int32_t>& ids);
// Parses a JSON request argument; ARGUMENT error naming `what` when it is not a JSON object.
nlohmann::ordered_json parse_object(const char* text, const char* what);

}  // namespace deltafin::capi
