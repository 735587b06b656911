// OpenAI-shaped generation for the C API: the server's request validation
// (parse_chat_request / parse_completion_request) and response shapes (ResponseBuilder) around
// a Generation the caller pulls one forward pass at a time. Pulling, not a callback, is the
// primitive because it lets a binding stop between any two passes (a Python iterator that is
// abandoned, Ctrl-C) without threads; the callback calls are a loop over it. Chat turns are
// the same stream over a ChatSession's kept state. Images reach a stream the server's way: a
// chat request's image_url parts are checked and measured by parse_chat_request (the model's
// ServeLimits carry the tower's measurer), a chat's attached images by ChatSession, and the
// sequence encodes them with the model's tower (SequenceSpec::images / vision).
#include <cctype>
#include <ctime>

#include "capi/handles.h"
#include "core/error.h"
#include "core/timer.h"
#include "server/api_error.h"
#include "server/structured.h"
#include "vision/image.h"

using namespace deltafin;
using capi::guard;
using capi::require;
using json = nlohmann::ordered_json;

namespace {

// A stream over `ids` (a whole prompt, or a chat's history with its new turn) whose state holds
// the first state->position() of them (a fresh stream: a state of its own, none). The prefix
// store (prefix/reuse.h) may restore a deeper prefix first; the generation is fed the rest.
std::unique_ptr<deltafin_stream> make_stream(const capi::Ref<deltafin_model>& model,
                                             server::ServeRequest& r, std::span<const int32_t> ids,
                                             const PromptMarks& marks, State* state,
                                             std::vector<PromptImage> images) {
  auto s = std::make_unique<deltafin_stream>();
  s->m = model;
  deltafin_model& m = *model;
  const Tokenizer& tok = m.tokenizer("an OpenAI-shaped completion");
  {
    // A restored drafter computes with the model, and the counters are written by passes.
    std::lock_guard<std::mutex> lock(m.pass);
    SequenceSpec spec{std::vector<int32_t>(ids.begin(), ids.end()), marks, r.params, r.logit_bias};
    spec.images = std::move(images);
    spec.vision = m.engine.vision.get();
    s->seq = std::make_unique<Sequence>(*m.model, &tok, m.engine.store.get(), std::move(spec),
                                        SequenceDrafter(m.engine.new_drafter(), m.engine.draft_max),
                                        state, true);
  }
  const bool chat = r.endpoint == server::Endpoint::chat;
  s->builder = std::make_unique<server::ResponseBuilder>(
      tok, r.endpoint, server::random_id(chat ? "chatcmpl-" : "cmpl-"),
      static_cast<int64_t>(std::time(nullptr)), m.limits.model_id, r.logprobs, r.include_usage);
  return s;
}

void push(deltafin_stream& s, const std::vector<json>& chunks) {
  for (const auto& c : chunks) s.pending.push_back(server::dump(c));
}

// After the generation finished: usage, the final chunks, stats, the chat's record and the
// state after the answer for the prefix store.
void finish(deltafin_stream& s) {
  Sequence& seq = *s.seq;
  const Generation& g = seq.gen();
  s.usage = seq.usage();
  push(s, s.builder->end(g.stop_reason(), s.usage));
  s.ended = true;
  std::lock_guard<std::mutex> lock(s.m->pass);  // the counters are written by passes
  s.stats = seq.run_stats();
  if (s.chat != nullptr) {
    ChatSession& session = *s.chat->session;
    session.end_turn(g);
    seq.finish(session.consumed());
    s.chat->active = nullptr;
    s.chat = nullptr;
  } else {
    seq.finish();
  }
}

// A stream whose model or chat was freed (by another thread, or before it) stops at its next
// pass; the freed objects stay in memory until the stream is freed (capi::Ref).
void check_owners(const deltafin_stream& s) {
  if (s.retired) fail_arg("the stream was freed by another thread; it cannot go on");
  if (s.m->retired) fail_arg("the model this stream belongs to was freed; it cannot go on");
  if (s.owner && s.owner->retired)
    fail_arg("the chat this stream belongs to was freed; it cannot go on");
}

// One forward pass (or the end), folding what it produced into chunks.
void step(deltafin_stream& s) {
  Generation& g = s.seq->gen();
  check_owners(s);
  if (!g.finished()) {
    try {
      std::lock_guard<std::mutex> lock(s.m->pass);
      s.seq->step();
    } catch (...) {
      g.abort();
      if (s.chat != nullptr) {
        s.chat->session->reset();  // its state is no longer trustworthy
        s.chat->active = nullptr;
        s.chat = nullptr;
      }
      throw;
    }
    server::StepUpdate u;
    u.events = g.take_events();
    const auto& toks = g.tokens();
    u.tokens.assign(toks.begin() + static_cast<ptrdiff_t>(s.sent), toks.end());
    s.sent = toks.size();
    push(s, s.builder->add(u));
  }
  if (g.finished() && !s.ended) finish(s);
}

deltafin_status run_to_end(deltafin_stream* s, deltafin_chunk_callback cb, void* user,
                           char** out_response) {
  for (;;) {
    char* chunk = nullptr;
    int done = 0;
    if (auto st = deltafin_stream_next(s, &chunk, &done); st != DELTAFIN_OK) return st;
    if (chunk != nullptr) {
      const int stop = cb != nullptr ? cb(chunk, user) : 0;
      deltafin_free(chunk);
      if (stop != 0 && !s->seq->gen().finished()) s->seq->gen().cancel();
    }
    if (done != 0) break;
  }
  return deltafin_stream_response(s, out_response);
}

deltafin_status create(deltafin_model* model, const char* request_json, int chat,
                       deltafin_chunk_callback cb, void* user, char** out_response) {
  deltafin_stream* s = nullptr;
  if (auto st = deltafin_stream_start(model, request_json, chat, &s); st != DELTAFIN_OK) return st;
  const deltafin_status st = run_to_end(s, cb, user, out_response);
  deltafin_stream_free(s);
  return st;
}

}  // namespace

// A stream freed before its end ends its chat's turn there (recorded as cancelled: the next
// turn prefills again). A freed chat is still in memory here: `owner` holds it.
deltafin_stream::~deltafin_stream() {
  try {
    if (chat != nullptr) {
      if (seq && !ended) {
        seq->gen().cancel();
        chat->session->end_turn(seq->gen());
      }
      chat->active = nullptr;
    }
  } catch (...) {
  }
}

extern "C" {

deltafin_status deltafin_stream_start(deltafin_model* model, const char* request_json, int chat,
                                      deltafin_stream** out) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out, "out");
    *out = nullptr;
    const json body = capi::parse_object(request_json, "request_json");
    const Tokenizer& tok = model->tokenizer("an OpenAI-shaped completion");
    server::ServeRequest r = chat != 0 ? server::parse_chat_request(body, model->limits, tok)
                                       : server::parse_completion_request(body, model->limits, tok);
    auto s =
        make_stream(hold, r, r.prompt, PromptMarks{r.system_end, r.messages_end, r.last_message},
                    nullptr, std::move(r.images));
    capi::adopt(s.get());
    *out = s.release();
  });
}

deltafin_status deltafin_stream_next(deltafin_stream* s, char** out_chunk, int* out_done) {
  return guard([&] {
    const capi::Ref<deltafin_stream> hold(s, "stream");
    require(out_chunk, "out_chunk");
    require(out_done, "out_done");
    *out_chunk = nullptr;
    *out_done = 0;
    if (!s->begun) {
      push(*s, s->builder->begin());
      s->begun = true;
    }
    if (s->pending.empty() && !s->ended) step(*s);
    if (!s->pending.empty()) {
      *out_chunk = capi::copy_string(s->pending.front());
      s->pending.pop_front();
    }
    *out_done = s->ended && s->pending.empty() ? 1 : 0;
  });
}

deltafin_status deltafin_stream_response(deltafin_stream* s, char** out_json) {
  return guard([&] {
    const capi::Ref<deltafin_stream> hold(s, "stream");
    require(out_json, "out_json");
    s->begun = true;
    while (!s->ended) step(*s);  // (a detached stream fails in step)
    s->pending.clear();
    *out_json = capi::copy_string(
        server::dump(s->builder->response(s->seq->gen().stop_reason(), s->usage)));
  });
}

deltafin_status deltafin_stream_stats_json(deltafin_stream* s, char** out_json) {
  return guard([&] {
    const capi::Ref<deltafin_stream> hold(s, "stream");
    require(out_json, "out_json");
    if (!s->stats) fail_arg("the stream has not finished: its stats are complete at the end");
    nlohmann::json j;
    const auto fed = s->seq->input();  // the ids fed (a chat turn: only the new ones)
    j["prompt_ids"] = std::vector<int32_t>(fed.begin(), fed.end());
    j["completion_ids"] = s->seq->gen().completion_ids();
    s->stats->to_json(j);
    *out_json = capi::copy_string(j.dump());
  });
}

void deltafin_stream_free(deltafin_stream* s) {
  capi::retire(s);
}

deltafin_status deltafin_create_completion(deltafin_model* model, const char* request_json,
                                           deltafin_chunk_callback callback, void* user_data,
                                           char** out_response_json) {
  return create(model, request_json, 0, callback, user_data, out_response_json);
}

deltafin_status deltafin_create_chat_completion(deltafin_model* model, const char* request_json,
                                                deltafin_chunk_callback callback, void* user_data,
                                                char** out_response_json) {
  return create(model, request_json, 1, callback, user_data, out_response_json);
}

deltafin_status deltafin_chat_new(deltafin_model* model, const char* options_json,
                                  deltafin_chat** out) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out, "out");
    *out = nullptr;
    auto c = std::make_unique<deltafin_chat>();
    c->m = hold;
    c->session = std::make_unique<ChatSession>(*model->model, model->tokenizer("chat"));
    if (model->engine.vision)
      c->session->set_image_measurer(image_measurer(model->engine.vision.get()));
    if (options_json != nullptr) {
      const json o = capi::parse_object(options_json, "options_json");
      for (const auto& [k, v] : o.items()) {
        if (k == "system") {
          if (!v.is_string()) fail_arg("system: expected a string, got {}", v.type_name());
          c->session->set_system(v.get<std::string>());
        } else if (k == "reasoning_effort") {
          if (!v.is_string())
            fail_arg("reasoning_effort: expected low, high or max, got {}", v.dump());
          c->session->set_effort(v.get<std::string>());
        } else if (k == "thinking") {
          if (!v.is_boolean()) fail_arg("thinking: expected true or false, got {}", v.dump());
          c->session->set_thinking(v.get<bool>());
        } else {
          fail_arg("{}: unknown chat option (expected system, reasoning_effort, thinking)", k);
        }
      }
    }
    capi::adopt(c.get());
    *out = c.release();
  });
}

void deltafin_chat_free(deltafin_chat* chat) {
  capi::retire(chat);  // a turn's stream that outlives it keeps it, and fails from now on
}

void deltafin_chat_reset(deltafin_chat* chat) {
  const auto c = capi::peek(chat);
  if (c && c->active == nullptr) {
    c->session->reset();
    c->attached.clear();
  }
}

deltafin_status deltafin_chat_send(deltafin_chat* chat, const char* request_json,
                                   deltafin_stream** out) {
  return guard([&] {
    const capi::Ref<deltafin_chat> hold(chat, "chat");
    require(out, "out");
    *out = nullptr;
    if (chat->active != nullptr)
      fail_arg("this chat already has a turn in progress (free its stream first)");
    json body = capi::parse_object(request_json, "request_json");
    const json* content = body.contains("content") ? &body["content"] : nullptr;
    if (content == nullptr || !content->is_string())
      fail_arg("content: expected the user's message as a string");
    const std::string text = content->get<std::string>();
    body.erase("content");
    for (const char* k : {"messages", "tools", "tool_choice", "response_format", "thinking",
                          "reasoning_effort", "add_generation_prompt"}) {
      if (body.contains(k))
        fail_arg("{}: not part of a chat turn (set thinking/effort/system when making the chat)",
                 k);
    }
    body["messages"] = json::array({{{"role", "user"}, {"content", text}}});
    deltafin_model& m = *chat->m;
    if (m.retired) fail_arg("chat: its model was freed; it cannot go on");
    server::ServeRequest r = server::parse_chat_request(body, m.limits, m.tokenizer("chat"));
    const json saved = chat->session->to_json();
    try {
      ChatTurn turn = chat->session->begin_user_turn(text, chat->attached);
      r.params.start_channel = turn.start;
      if (r.params.constraint && r.chat && r.chat->thinking != (turn.start == Channel::think)) {
        // The constraint covers the turn from where this chat's prompt opened it.
        r.chat->thinking = turn.start == Channel::think;
        r.params.constraint = server::chat_constraint(body, *r.chat, m.tokenizer("chat"));
      }
      State& state = chat->session->state();
      if (state.position() + static_cast<int64_t>(turn.input.size()) + 1 > m.limits.context) {
        throw server::ApiError(400,
                               fmt::format("This model's context is {} tokens, but the "
                                           "conversation needs {} (it must leave room for at "
                                           "least one generated token)",
                                           m.limits.context, state.position() + turn.input.size()),
                               "invalid_request_error", "content", "context_length_exceeded");
      }
      auto s = make_stream(chat->m, r, chat->session->history(),
                           PromptMarks{turn.system_end, turn.messages_end}, &state,
                           std::move(turn.images));
      chat->attached.clear();  // in the conversation now
      s->chat = chat;
      s->owner = hold;
      chat->active = s.get();
      capi::adopt(s.get());
      *out = s.release();
    } catch (...) {
      chat->session->load_json(saved);  // the turn never started: the conversation as it was
      throw;
    }
  });
}

namespace {

// Checks one image for a chat's next message (headers only, as `deltafin chat`'s /image) and
// attaches it.
void attach_image(deltafin_chat& chat, std::vector<uint8_t> bytes, const std::string& name) {
  deltafin_model& m = *chat.m;
  if (m.retired) fail_arg("chat: its model was freed; it cannot go on");
  if (!m.engine.vision)
    fail_arg("{}: this model has no vision tower, so it cannot take images", name);
  if (chat.active != nullptr)
    fail_arg("{}: this chat has a turn in progress (attach images before sending)", name);
  const int most = m.limits.images.max_images;
  if (static_cast<int>(chat.attached.size()) >= most)
    fail_arg("{}: at most {} images may wait for one message", name, most);
  if (bytes.size() > m.limits.images.max_bytes) {
    fail_arg("{}: {} bytes; an image may have at most {} bytes", name, bytes.size(),
             m.limits.images.max_bytes);
  }
  const std::span<const uint8_t> view(bytes);
  const vision::ImageFormat f = vision::sniff_format(view, name);
  m.engine.vision->plan(view, name, nullptr);  // headers: size, pixel and patch limits
  vision::ImageLimits lim = m.engine.vision->limits();
  lim.max_bytes = m.limits.images.max_bytes;
  (void)vision::decode_image(view, name, lim);  // the whole frame: truncation, corruption
  std::string type = vision::format_name(f);
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  ChatImage img;
  img.media_type = "image/" + type;
  img.name = name;
  img.bytes = std::make_shared<const std::string>(bytes.begin(), bytes.end());
  chat.attached.push_back(std::move(img));
}

}  // namespace

deltafin_status deltafin_chat_add_image(deltafin_chat* chat, const void* data, size_t len,
                                        const char* name) {
  return guard([&] {
    const capi::Ref<deltafin_chat> hold(chat, "chat");
    const std::string label =
        name != nullptr ? std::string(name) : fmt::format("image {}", chat->attached.size() + 1);
    if (data == nullptr && len > 0) fail_arg("{}: data is NULL but len is {}", label, len);
    if (len == 0) fail_arg("{}: no bytes (len 0); expected a PNG, JPEG, WebP or GIF file", label);
    const uint64_t most = chat->m->limits.images.max_bytes;
    if (len > most)  // before the copy: the caller's buffer may be of any size
      fail_arg("{}: {} bytes; an image may have at most {} bytes", label, len, most);
    const auto* p = static_cast<const uint8_t*>(data);
    attach_image(*chat, std::vector<uint8_t>(p, p + len), label);
  });
}

deltafin_status deltafin_chat_add_image_file(deltafin_chat* chat, const char* path) {
  return guard([&] {
    const capi::Ref<deltafin_chat> hold(chat, "chat");
    require(path, "path");
    vision::ImageLimits lim;
    lim.max_bytes = chat->m->limits.images.max_bytes;
    attach_image(*chat, vision::read_image_file(path, lim), path);
  });
}

int deltafin_chat_clear_images(deltafin_chat* chat) {
  const auto c = capi::peek(chat);
  if (!c) return 0;
  const int n = static_cast<int>(c->attached.size());
  c->attached.clear();
  return n;
}

deltafin_status deltafin_chat_history_json(deltafin_chat* chat, char** out_json) {
  return guard([&] {
    const capi::Ref<deltafin_chat> hold(chat, "chat");
    require(out_json, "out_json");
    *out_json = capi::copy_string(chat->session->to_json().dump());
  });
}

}  // extern "C"
