// The C API's models, tokens and sessions (include/deltafin/deltafin.h documents every call).
// Each entry point is a thin shell: argument checks, then the library's own code (the one load
// path of runtime/load.h, the Tokenizer, the K3 renderer, Model::forward, Generation) inside
// guard(), which turns any exception into a status and a message. load_request() maps the C
// options onto the load request every front end uses.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <unordered_set>

#include "capi/handles.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "draft/draft_model.h"
#include "generate/generation_config.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "runtime/images.h"
#include "server/api_error.h"
#include "tokenizer/chat.h"

using deltafin::fail_arg;
using json = nlohmann::ordered_json;

namespace deltafin::capi {

namespace {
thread_local std::string t_error;
std::atomic<int> g_live_models{0};  // for the process-wide kernel choice only
std::mutex g_kernels_mutex;

deltafin_status set_error(deltafin_status s, const std::string& what) {
  t_error = what;
  return s;
}
}  // namespace

deltafin_status guard(const std::function<void()>& f) {
  try {
    f();
    return DELTAFIN_OK;
  } catch (const server::ApiError& e) {
    const bool ctx = e.code() && *e.code() == "context_length_exceeded";
    return set_error(ctx ? DELTAFIN_ERR_CONTEXT : DELTAFIN_ERR_ARGUMENT, e.what());
  } catch (const SettingError& e) {
    // A setting as this API (and Python) calls it: its parameter field ("memory_budget").
    std::string field = e.setting();
    std::replace(field.begin(), field.end(), ' ', '_');
    return set_error(DELTAFIN_ERR_ARGUMENT, e.worded(field));
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    // The two context refusals below the server's checks: Generation's ("... but the context
    // is N") and the session's ("... do not fit in the context of N").
    const bool ctx = m.find("the context is") != std::string::npos ||
                     m.find("the context of") != std::string::npos;
    return set_error(ctx ? DELTAFIN_ERR_CONTEXT : DELTAFIN_ERR_ARGUMENT, m);
  } catch (const IoError& e) {
    return set_error(DELTAFIN_ERR_IO, e.what());
  } catch (const Error& e) {
    return set_error(DELTAFIN_ERR_MODEL, e.what());
  } catch (const std::bad_alloc&) {
    return set_error(DELTAFIN_ERR_MEMORY, "out of memory");
  } catch (const nlohmann::json::exception& e) {
    return set_error(DELTAFIN_ERR_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    return set_error(DELTAFIN_ERR_INTERNAL, e.what());
  } catch (...) {
    return set_error(DELTAFIN_ERR_INTERNAL, "unknown error");
  }
}

void require(const void* p, const char* what) {
  if (p == nullptr) fail_arg("{} must not be NULL", what);
}

namespace {
// The live handles: a pointer is looked up here before it is used, so a freed one (even freed by
// another thread a moment ago) is an error instead of a use after free.
std::mutex g_handles_mutex;
std::unordered_set<const Handle*>& live_handles() {
  static std::unordered_set<const Handle*> live;
  return live;
}
}  // namespace

void adopt(Handle* h) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  live_handles().insert(h);
}

bool acquire(const Handle* h) {
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  if (live_handles().count(h) == 0) return false;
  ++h->refs;
  return true;
}

void release(const Handle* h) {
  if (h->refs.fetch_sub(1) == 1) delete h;
}

void retire(Handle* h) {
  if (h == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    if (live_handles().erase(h) == 0) return;  // freed already
    h->retired = true;
  }
  release(h);
}

void fail_not_live(const void* h, const char* what) {
  fail_arg("{} {}: not a live handle (it was freed, or is being freed by another thread)", what, h);
}

char* copy_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

int32_t* copy_ids(const std::vector<int32_t>& ids) {
  if (ids.empty()) return nullptr;
  auto* p = static_cast<int32_t*>(std::malloc(ids.size() * sizeof(int32_t)));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, ids.data(), ids.size() * sizeof(int32_t));
  return p;
}

json parse_object(const char* text, const char* what) {
  require(text, what);
  json j;
  check_json_depth(text, kMaxJsonDepth, what);
  try {
    j = json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_arg("{}: not valid JSON ({})", what, json_error_text(e));
  }
  if (!j.is_object()) fail_arg("{}: expected a JSON object, got {}", what, j.type_name());
  return j;
}

// The C options as a load request: the C API loads through the same path as the CLI
// (runtime/load.h), so a draft model is counted in the memory plan here too.
LoadRequest load_request(const std::string& dir, const deltafin_model_params& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail_arg("model folder {} does not exist", dir);
  if (!fs::is_directory(dir, ec))
    fail_arg("{} is not a folder (expected a checkpoint folder)", dir);
  if (p.threads < 0) fail_arg("threads: expected a whole number >= 0, got {}", p.threads);
  if (p.readers < 1) fail_arg("readers: expected a whole number >= 1, got {}", p.readers);
  if (p.ctx < 0) fail_arg("ctx: expected a whole number >= 0, got {}", p.ctx);
  if (p.sequences < 1) fail_arg("sequences: expected a whole number >= 1, got {}", p.sequences);
  if (p.max_rows < 0)
    fail_arg(
        "max_rows: expected 0 (auto: as many as the memory budget holds) or a whole number "
        ">= 1, got {}",
        p.max_rows);
  const std::string trunk = p.trunk != nullptr && *p.trunk ? p.trunk : "bf16";
  if (trunk != "bf16" && trunk != "int8")
    fail_arg("trunk: {} is not a trunk format (expected bf16 or int8)", trunk);
  const std::string policy = p.cache_policy != nullptr && *p.cache_policy ? p.cache_policy : "lru";
  if (policy != "lru" && policy != "lfu" && policy != "pinned")
    fail_arg("cache_policy: {} is not a policy (expected lru, lfu or pinned)", policy);
  if (p.mmap != 0 && trunk == "int8") fail_arg("trunk int8 needs the planned store (drop mmap)");
  if (p.state_cache_ram < -1)
    fail_arg("state_cache_ram: expected -1 (auto), 0 (disk only) or bytes, got {}",
             p.state_cache_ram);
  LoadRequest r;
  EngineOptions& e = r.engine;
  e.model = dir;
  e.threads = static_cast<int>(std::min<int64_t>(p.threads, INT32_MAX));
  e.own_threads = true;  // models loaded side by side neither share nor resize threads
  if (p.memory_budget > 0) e.memory_budget = p.memory_budget;
  e.mmap = p.mmap != 0;
  e.cache_policy = parse_cache_policy(policy);
  e.readers = p.readers;
  e.prefetch = p.prefetch != 0;
  e.direct_io = p.direct_io != 0;
  e.trunk = trunk == "int8" ? TrunkFormat::kInt8 : TrunkFormat::kBF16;
  e.ctx = p.ctx;
  e.verbose = p.verbose != 0;
  e.plan_on_terminal = false;
  e.heat_file = p.heat_file != nullptr ? p.heat_file : "";
  e.gpu.select = p.gpu != nullptr && *p.gpu ? p.gpu : "off";
  // NULL or "": the model folder's draft/ subfolder when it has one (as on the command line).
  r.draft = p.draft != nullptr ? p.draft : "";
  r.draft_max = DraftMax::from_count(p.draft_max);
  r.prefill_chunk = p.max_rows;
  r.sequences = static_cast<int>(p.sequences);
  StateCacheSettings& cache = r.state_cache;
  const std::string folder = p.state_cache != nullptr ? p.state_cache : "";
  cache.enabled = folder != "none";
  cache.dir = cache.enabled ? folder : "";
  cache.disk_bytes = p.state_cache_size;
  if (p.state_cache_ram >= 0) cache.ram_bytes = static_cast<uint64_t>(p.state_cache_ram);
  if (p.n_homes > 0 && p.homes == nullptr) fail_arg("homes: NULL with n_homes {}", p.n_homes);
  for (size_t i = 0; i < p.n_homes; ++i) {
    if (p.homes[i] == nullptr || *p.homes[i] == 0) fail_arg("homes[{}]: empty path", i);
    e.homes.emplace_back(p.homes[i]);
  }
  return r;
}

// The process-wide kernel choice (deltafin_model_params.kernels): only while no other model
// computes with the current one.
void select_kernels(const char* name) {
  if (name == nullptr || *name == '\0') return;
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  if (std::strcmp(kernels::active().name, name) == 0) return;
  if (g_live_models.load() > 0) {
    fail_arg(
        "kernels: the kernel set is process-wide; {} is in use by a loaded model, so {} "
        "cannot be selected now (free the other models first)",
        kernels::active().name, name);
  }
  kernels::select(name);
}

}  // namespace deltafin::capi

using namespace deltafin;
using capi::guard;
using capi::require;

const Tokenizer& deltafin_model::tokenizer(const char* who) const {
  if (!tok)
    fail_arg("{} has no tokenizer (tiktoken.model + tokenizer_config.json); {} needs one", path,
             who);
  return *tok;
}

deltafin_model::~deltafin_model() {
  if (model != nullptr) --capi::g_live_models;
}

std::vector<float> deltafin_model::forward(State& state, std::span<const int32_t> ids, bool all) {
  std::lock_guard<std::mutex> lock(pass);
  return model->forward(state, ids, all);
}

extern "C" {

int deltafin_abi_version(void) {
  return DELTAFIN_ABI_VERSION;
}

const char* deltafin_version(void) {
  return DELTAFIN_VERSION;
}

const char* deltafin_last_error(void) {
  return capi::t_error.c_str();
}

void deltafin_free(void* p) {
  std::free(p);
}

void deltafin_model_params_init(deltafin_model_params* p) {
  if (p == nullptr) return;
  *p = deltafin_model_params{};
  p->struct_size = sizeof(deltafin_model_params);
  p->readers = 4;
  p->prefetch = 1;
  p->direct_io = 1;
  p->sequences = 1;
  p->max_rows = 0;  // auto: the pass plan sizes prefill passes from the memory budget
  p->state_cache_size = 16ull << 30;
  p->state_cache_ram = -1;  // auto
}

deltafin_status deltafin_model_load(const char* path, const deltafin_model_params* params,
                                    deltafin_model** out) {
  return guard([&] {
    require(path, "path");
    require(out, "out");
    *out = nullptr;
    deltafin_model_params p;
    deltafin_model_params_init(&p);
    if (params != nullptr) {
      if (params->struct_size < offsetof(deltafin_model_params, threads) ||
          params->struct_size > sizeof(deltafin_model_params)) {
        fail_arg("deltafin_model_params.struct_size is {}: set it with deltafin_model_params_init",
                 params->struct_size);
      }
      std::memcpy(&p, params, params->struct_size);  // fields the caller knows; defaults after
    }
    auto m = std::make_unique<deltafin_model>();
    m->path = path;
    LoadRequest req = capi::load_request(path, p);
    capi::select_kernels(p.kernels);
    m->engine = load_engine(std::move(req));
    m->model = m->engine.model.get();
    ++capi::g_live_models;  // (the destructor counts it down)
    namespace fs = std::filesystem;
    const ModelConfig& c = m->model->config();
    auto& l = m->limits;
    l.prefill_chunk = m->model->pass_plan().pass_rows;  // what the plan holds per pass
    l.model_id = fs::path(path).filename().string();
    l.aliases = {"*"};
    l.context = m->model->plan() ? std::min(c.max_positions, m->model->plan()->context)
                                 : (p.ctx > 0 ? p.ctx : c.max_positions);
    l.max_tokens = l.context;
    l.vocab = c.vocab;
    const GenerationDefaults generation = load_generation_config(path);
    generation.apply(l.sampling);
    l.stop_ids = stop_ids_for(c, m->tok ? &*m->tok : nullptr, generation);
    // Image parts are measured by the tower, as the server does (a text-only model refuses them).
    if (m->engine.vision) l.measure_image = image_measurer(m->engine.vision.get());
    capi::adopt(m.get());
    *out = m.release();
  });
}

void deltafin_model_free(deltafin_model* model) {
  capi::retire(model);
}

int64_t deltafin_model_vocab(const deltafin_model* model) {
  const auto m = capi::peek(model);
  return m ? m->model->config().vocab : 0;
}

int64_t deltafin_model_context(const deltafin_model* model) {
  const auto m = capi::peek(model);
  return m ? m->limits.context : 0;
}

int deltafin_model_has_tokenizer(const deltafin_model* model) {
  const auto m = capi::peek(model);
  return m && m->tok ? 1 : 0;
}

int deltafin_model_has_vision(const deltafin_model* model) {
  const auto m = capi::peek(model);
  return m && m->engine.vision ? 1 : 0;
}

deltafin_status deltafin_model_info_json(deltafin_model* model, char** out_json) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out_json, "out_json");
    const ModelConfig& c = model->model->config();
    json cfg = {{"hidden", c.hidden},
                {"num_layers", c.num_layers},
                {"vocab", c.vocab},
                {"max_positions", c.max_positions},
                {"first_k_dense", c.first_k_dense},
                {"num_experts", c.moe.num_experts},
                {"experts_per_token", c.moe.top_k},
                {"num_kda_layers", c.num_kda_layers()},
                {"num_mla_layers", c.num_mla_layers()},
                {"bos_token_id", c.bos_token_id},
                {"eos_token_id", c.eos_token_id},
                {"quantized_experts", c.quantized_experts}};
    json j = {{"path", model->path},
              {"config", cfg},
              {"vocab", c.vocab},
              {"context", model->limits.context},
              {"stop_ids", model->limits.stop_ids},
              {"tokenizer", model->tok.has_value()},
              {"kernels", kernels::active().name},
              {"describe", model->model->describe()},
              {"gpu",
               model->model->gpu() ? json(model->model->gpu()->info().describe()) : json(nullptr)}};
    *out_json = capi::copy_string(j.dump());
  });
}

deltafin_status deltafin_model_memory_plan_json(deltafin_model* model, char** out_json) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out_json, "out_json");
    json j = nullptr;
    if (const auto& p = model->model->plan()) {
      int resident = 0;
      for (bool r : p->resident) resident += r ? 1 : 0;
      j = {{"budget", p->budget},
           {"context", p->context},
           {"sequences", p->sequences},
           {"state_bytes", p->state_bytes},
           {"buffer_bytes", p->buffer_bytes},
           {"overhead_bytes", p->overhead_bytes},
           {"router_bytes", p->router_bytes},
           {"draft_weight_bytes", p->draft_weight_bytes},
           {"draft_cache_bytes", p->draft_cache_bytes},
           {"fixed_bytes", p->fixed_bytes()},
           {"trunk_units", p->resident.size()},
           {"resident_trunk_units", resident},
           {"trunk_resident_bytes", p->trunk_resident_bytes},
           {"stream_buffer_bytes", p->stream_buffer_bytes},
           {"expert_cache_bytes", p->expert_cache_bytes},
           {"expert_slot_bytes", p->expert_slot_bytes},
           {"all_experts_bytes", p->all_experts_bytes},
           {"min_working_set", p->min_working_set},
           {"streamed_bytes_per_pass", p->streamed_bytes_per_pass()},
           {"pass_rows", p->pass.pass_rows},
           {"pass_rows_auto", p->pass.automatic},
           {"trunk", p->trunk == TrunkFormat::kInt8 ? "int8" : "bf16"},
           {"describe", p->describe()}};
    }
    *out_json = capi::copy_string(j.dump());
  });
}

deltafin_status deltafin_model_stats_json(deltafin_model* model, char** out_json) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out_json, "out_json");
    std::lock_guard<std::mutex> lock(model->pass);
    const ExpertStats e = model->model->experts().stats();
    const TrunkStats t = model->model->trunk_stats();
    const PassStats& p = model->model->pass_stats();
    json j = {{"passes", p.passes},
              {"rows", p.rows},
              {"pass_seconds", p.seconds},
              {"expert_requests", e.requests},
              {"expert_hits", e.hits},
              {"expert_misses", e.misses},
              {"expert_bytes_read", e.bytes_read},
              {"expert_bytes_served", e.bytes_served},
              {"prefetch_issued", e.prefetch_issued},
              {"prefetch_used", e.prefetch_used},
              {"prefetch_wasted_bytes", e.prefetch_wasted_bytes},
              {"expert_io_wait_s", e.io_wait_s},
              {"trunk_bytes_streamed", t.bytes_streamed},
              {"trunk_wait_s", t.wait_s},
              {"peak_rss_bytes", peak_rss_bytes()}};
    if (!e.sources.empty()) j["homes"] = sources_json(e.sources);
    *out_json = capi::copy_string(j.dump());
  });
}

deltafin_status deltafin_tokenize(deltafin_model* model, const char* text, size_t len, int special,
                                  int32_t** out_ids, size_t* out_n) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out_ids, "out_ids");
    require(out_n, "out_n");
    if (len > 0) require(text, "text");
    const Tokenizer& tok = model->tokenizer("tokenize");
    std::string_view t(text != nullptr ? text : "", len);
    auto ids = special != 0 ? tok.encode_with_special(t) : tok.encode_ordinary(t);
    *out_ids = capi::copy_ids(ids);
    *out_n = ids.size();
  });
}

deltafin_status deltafin_detokenize(deltafin_model* model, const int32_t* ids, size_t n,
                                    char** out_text, size_t* out_len) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out_text, "out_text");
    if (n > 0) require(ids, "ids");
    const Tokenizer& tok = model->tokenizer("detokenize");
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= tok.vocab_size())
        fail_arg("ids[{}]: token id {} is out of range (expected 0 to {})", i, ids[i],
                 tok.vocab_size() - 1);
    }
    std::string s = tok.decode(std::span<const int32_t>(ids, n));
    *out_text = capi::copy_string(s);
    if (out_len != nullptr) *out_len = s.size();
  });
}

deltafin_status deltafin_render_chat(deltafin_model* model, const char* request_json,
                                     int32_t** out_ids, size_t* out_n, char** out_text) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out_ids, "out_ids");
    require(out_n, "out_n");
    const json body = capi::parse_object(request_json, "request_json");
    auto r = render_json(body, model->tokenizer("render_chat"));
    char* text = out_text != nullptr ? capi::copy_string(r.text) : nullptr;
    *out_ids = capi::copy_ids(r.ids);
    *out_n = r.ids.size();
    if (out_text != nullptr) *out_text = text;
  });
}

deltafin_status deltafin_session_new(deltafin_model* model, deltafin_session** out) {
  return guard([&] {
    const capi::Ref<deltafin_model> hold(model, "model");
    require(out, "out");
    auto s = std::make_unique<deltafin_session>();
    s->m = hold;
    s->state = model->model->new_state();
    capi::adopt(s.get());
    *out = s.release();
  });
}

void deltafin_session_free(deltafin_session* session) {
  capi::retire(session);
}

void deltafin_session_reset(deltafin_session* session) {
  const auto s = capi::peek(session);
  if (!s) return;
  s->state.reset();
  s->history.clear();
  s->pending.clear();
}

int64_t deltafin_session_position(const deltafin_session* session) {
  const auto s = capi::peek(session);
  return s ? static_cast<int64_t>(s->history.size()) : 0;
}

deltafin_status deltafin_session_history(deltafin_session* session, int32_t** out_ids,
                                         size_t* out_n) {
  return guard([&] {
    const capi::Ref<deltafin_session> hold(session, "session");
    require(out_ids, "out_ids");
    require(out_n, "out_n");
    *out_ids = capi::copy_ids(session->history);
    *out_n = session->history.size();
  });
}

namespace {
void check_ids(const deltafin_session& s, const int32_t* ids, size_t n) {
  const int64_t vocab = s.m->model->config().vocab;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      fail_arg("ids[{}]: token id {} is out of range (expected 0 to {})", i, ids[i], vocab - 1);
  }
  const int64_t need = static_cast<int64_t>(s.history.size() + n);
  if (need > s.m->limits.context)
    fail_arg("the session holds {} tokens and {} more do not fit in the context of {}",
             s.history.size(), n, s.m->limits.context);
}
}  // namespace

deltafin_status deltafin_session_eval(deltafin_session* session, const int32_t* ids, size_t n,
                                      int all_logits, float* logits) {
  return guard([&] {
    const capi::Ref<deltafin_session> hold(session, "session");
    require(ids, "ids");
    if (n == 0) fail_arg("n: evaluate at least one token");
    if (session->m->retired) fail_arg("session: its model was freed; it cannot go on");
    check_ids(*session, ids, n);
    std::vector<int32_t> feed = session->pending;
    const size_t skip = feed.size();
    feed.insert(feed.end(), ids, ids + n);
    auto out = session->m->forward(session->state, feed, all_logits != 0);
    session->pending.clear();
    session->history.insert(session->history.end(), ids, ids + n);
    if (logits != nullptr) {
      const size_t vocab = static_cast<size_t>(session->m->model->config().vocab);
      const size_t from = all_logits != 0 ? skip * vocab : 0;
      std::memcpy(logits, out.data() + from, (out.size() - from) * sizeof(float));
    }
  });
}

void deltafin_sampling_params_init(deltafin_sampling_params* p) {
  if (p == nullptr) return;
  *p = deltafin_sampling_params{};
  p->struct_size = sizeof(deltafin_sampling_params);
  p->max_new_tokens = 256;
  p->top_p = 1.0f;
  p->repeat_penalty = 1.0f;
  p->prefill_chunk = 0;  // the model's pass rows (deltafin_model_params.max_rows, or auto)
}

deltafin_status deltafin_session_generate(deltafin_session* session, const int32_t* prompt,
                                          size_t n, const deltafin_sampling_params* params,
                                          deltafin_token_callback callback, void* user_data,
                                          char** out_result_json) {
  return guard([&] {
    const capi::Ref<deltafin_session> hold(session, "session");
    if (n > 0) require(prompt, "prompt");
    if (n == 0 && session->pending.empty())
      fail_arg(
          "prompt: give at least one token (the session has no sampled token to continue from)");
    check_ids(*session, prompt, n);
    deltafin_sampling_params sp;
    deltafin_sampling_params_init(&sp);
    if (params != nullptr) {
      if (params->struct_size < sizeof(size_t) || params->struct_size > sizeof(sp))
        fail_arg(
            "deltafin_sampling_params.struct_size is {}: set it with "
            "deltafin_sampling_params_init",
            params->struct_size);
      std::memcpy(&sp, params, params->struct_size);
    }
    deltafin_model& m = *session->m;
    GenerationParams gp;
    if (sp.max_new_tokens < 0) fail_arg("max_new_tokens: expected >= 0, got {}", sp.max_new_tokens);
    if (sp.prefill_chunk < 0)
      fail_arg("prefill_chunk: expected 0 (the model's pass rows) or >= 1, got {}",
               sp.prefill_chunk);
    gp.max_new_tokens = sp.max_new_tokens;
    gp.sampling.temperature = sp.temperature;
    gp.sampling.top_k = sp.top_k;
    gp.sampling.top_p = sp.top_p;
    gp.sampling.min_p = sp.min_p;
    gp.sampling.repetition_penalty = sp.repeat_penalty;
    gp.sampling.presence_penalty = sp.presence_penalty;
    gp.sampling.frequency_penalty = sp.frequency_penalty;
    gp.sampling.seed = sp.seed;
    gp.sampling.has_seed = sp.has_seed != 0;
    gp.sampling.validate();
    for (size_t i = 0; i < sp.n_stop; ++i) {
      require(sp.stop, "stop");
      require(sp.stop[i], "stop[i]");
      gp.stop_strings.emplace_back(sp.stop[i]);
    }
    gp.stop_ids = m.limits.stop_ids;
    gp.prefill_chunk = sp.prefill_chunk > 0 ? sp.prefill_chunk : m.limits.prefill_chunk;
    gp.context_limit = m.limits.context;
    gp.chat = sp.chat != 0;
    if (gp.chat) m.tokenizer("chat generation");
    const Tokenizer* tok = m.tok ? &*m.tok : nullptr;
    if (!gp.stop_strings.empty() && tok == nullptr)
      fail_arg("stop strings need a tokenizer; {} has none", m.path);

    std::vector<int32_t> input = session->pending;
    input.insert(input.end(), prompt, prompt + n);
    // The history's ids the state consumed (it lags by `pending`).
    const auto consumed =
        std::min(session->history.size(), static_cast<size_t>(session->state.position()));
    Generation gen(input, gp, tok, m.model->config().vocab,
                   std::span<const int32_t>(session->history).first(consumed));
    std::unique_lock<std::mutex> counters(m.pass);  // the counters are written by passes
    StatsRecorder rec(*m.model);
    counters.unlock();
    std::unique_ptr<Drafter> drafter;
    DraftConfig draft = m.draft_config(drafter);
    while (!gen.finished()) {
      // Freed by another thread (the session, or its model): stop between two passes.
      if (session->retired || m.retired)
        fail_arg("session: freed by another thread while it was generating; generation stopped");
      const size_t before = gen.tokens().size();
      {
        std::lock_guard<std::mutex> lock(m.pass);
        drive_step(*m.model, session->state, gen, &draft);
      }
      std::string text, think;
      for (auto& e : gen.take_events()) {
        if (e.kind == ParserEvent::Kind::content) text += e.text;
        if (e.kind == ParserEvent::Kind::reasoning) think += e.text;
      }
      // A verify pass may emit several tokens: one event each, the pass's text with the last.
      for (size_t t = before; callback != nullptr && t < gen.tokens().size(); ++t) {
        const bool last = t + 1 == gen.tokens().size();
        deltafin_token_event ev{gen.tokens()[t].id,        static_cast<int64_t>(t),
                                last ? text.c_str() : "",  last ? text.size() : 0,
                                last ? think.c_str() : "", last ? think.size() : 0};
        if (callback(&ev, user_data) != 0 && !gen.finished()) {
          gen.cancel();
          break;
        }
      }
    }
    session->pending.clear();
    session->history.insert(session->history.end(), prompt, prompt + n);
    const auto ids = gen.completion_ids();
    session->history.insert(session->history.end(), ids.begin(), ids.end());
    if (auto last = gen.unconsumed_token()) session->pending.push_back(*last);
    if (out_result_json != nullptr) {
      std::unique_lock<std::mutex> lock(m.pass);
      RunStats stats = rec.finish(gen);
      lock.unlock();
      stats.draft = draft.stats;
      const nlohmann::json j =
          run_json(m.path, std::span<const int32_t>(prompt, n), gen, stats, gp.chat);
      *out_result_json =
          capi::copy_string(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  });
}

}  // extern "C"
