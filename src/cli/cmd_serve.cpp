// `deltafin serve`: the OpenAI-compatible HTTP server. This file only wires the parts together:
// flags, the tokenizer, the listening socket (bound first, so a busy port fails at once and
// /health can say "loading" while the model loads), the model, the engine's Scheduler, and a
// signal thread that turns SIGINT/SIGTERM into an orderly shutdown (running and queued requests
// get a 503, then the listener closes). The engine flags are the ones `run` takes; --ctx
// among them is the served context, and the memory plan is told how many states to hold.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/trace_option.h"
#include "core/error.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "engine/engine.h"
#include "generate/generation_config.h"
#include "model/config.h"
#include "model/model.h"
#include "model/released.h"
#include "model/vision_tower.h"
#include "runtime/images.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "storage/plan.h"
#include "vision/preprocess.h"

namespace deltafin::cli {

namespace {

struct ServeArgs {
  EngineOptions engine;
  std::string trace;  // --trace FILE
  std::string host = "127.0.0.1";
  int port = 8000;
  std::optional<std::string> api_key;  // given but empty is refused, not "no authentication"
  std::string api_key_file;
  std::string model_id;  // "": the release the model belongs to (release_name_of)
  std::vector<std::string> aliases;
  int parallel = 1;
  int queue = 16;
  double timeout = 600;
  int64_t max_tokens = 0;
  std::string max_request_bytes = "16M";
  std::string max_image_bytes = "20M";
  bool allow_image_urls = false;
  StateCacheSettings state_cache;
  std::string prefill_chunk = "auto";
  bool no_webui = false;
  DraftOptions draft;
};

// The engine view's fixed part: the memory plan as the page's bar shows it, and the disk's
// bandwidth from a short O_DIRECT probe of the model's own files (64 MiB at most: well under a
// second on any SSD, once at start), so the page can draw read throughput against it. With homes
// each drive is probed and the bandwidth is their sum (per drive in "drive_bandwidths").
nlohmann::ordered_json engine_info(LoadedModel& model, int readers) {
  nlohmann::ordered_json j;
  j["model"] = model.describe();
  if (const auto& p = model.plan()) {
    const uint64_t state = p->state_bytes;
    const uint64_t other =
        p->buffer_bytes + p->overhead_bytes + p->router_bytes + p->stream_buffer_bytes;
    const uint64_t used =
        p->trunk_resident_bytes + p->expert_cache_bytes + state + p->state_cache_bytes + other;
    j["memory"] = {{"budget", p->budget},
                   {"trunk_resident", p->trunk_resident_bytes},
                   {"expert_cache", p->expert_cache_bytes},
                   {"state_cache", p->state_cache_bytes},
                   {"states", state},
                   {"buffers", other},
                   {"free", p->budget > used ? p->budget - used : 0}};
  } else {
    j["memory"] = nullptr;  // mmap mode: the page cache holds the weights
  }
  const std::vector<double> drives = probe_drives(model, readers, 64ull << 20);
  double sum = 0;
  for (double b : drives) sum += b;
  j["disk_bandwidth_bytes_per_s"] = sum;
  j["drive_bandwidths"] = drives;
  return j;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost" || host.rfind("127.", 0) == 0;
}

std::string read_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_arg("--api-key-file {}: cannot read the file", path);
  std::string key;
  std::getline(in, key);
  while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
    key.pop_back();
  size_t b = 0;
  while (b < key.size() && (key[b] == ' ' || key[b] == '\t')) ++b;
  key = key.substr(b);
  if (key.empty()) fail_arg("--api-key-file {}: the first line is empty (expected the key)", path);
  return key;
}

// A byte size flag: a plain number is bytes (parse_size reads it as GiB, so its message would
// lie), else a number with K, M or G.
uint64_t byte_size_flag(const std::string& v, const char* flag, const char* example) {
  const bool digits =
      !v.empty() && v.size() < 19 && v.find_first_not_of("0123456789") == std::string::npos;
  uint64_t n = 0;
  try {
    n = digits ? std::stoull(v) : parse_size(v, flag);
  } catch (const InvalidArgument&) {
    fail_usage(
        "{} {}: not a size (expected bytes, e.g. 1048576, or a number with K, M or G, powers of "
        "1024, e.g. {})",
        flag, v, example);
  }
  if (n == 0) fail_usage("{} must be positive", flag);
  return n;
}

void run_serve(ServeArgs& a) {
  if (a.api_key && !a.api_key_file.empty())
    fail_usage("give --api-key or --api-key-file, not both");
  if (a.api_key && a.api_key->empty())
    fail_usage("--api-key is empty (expected the key; leave the flag out to serve without one)");
  if (!a.api_key_file.empty()) a.api_key = read_key_file(a.api_key_file);
  const std::string api_key = a.api_key.value_or("");
  if (!(a.timeout > 0)) fail_usage("--timeout {}: must be positive (seconds)", a.timeout);
  const uint64_t max_body = byte_size_flag(a.max_request_bytes, "--max-request-bytes", "16M");
  const uint64_t max_image = byte_size_flag(a.max_image_bytes, "--max-image-bytes", "20M");
  a.engine.model = resolve_model_dir(a.engine.model);
  require_tokenizer(a.engine.model, "the server");
  {
    // Read once before the socket opens: the --ctx bound and the default model id.
    const ModelConfig cfg = load_config(a.engine.model);
    if (a.engine.ctx > cfg.max_positions) {
      fail_arg("--ctx {} exceeds the model's context of {} positions", a.engine.ctx,
               cfg.max_positions);
    }
    if (a.model_id.empty()) a.model_id = release_name_of(cfg);
  }
  const Tokenizer tok = Tokenizer::load(a.engine.model);

  // Signals go to one thread that sigwait()s; block them before any other thread exists.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // The detached signal thread shares ownership of what it touches: the main thread may return
  // (and would destroy a stack condition variable) while notify_all is still running, which
  // ThreadSanitizer reported as a race on every shutdown.
  struct StopSignal {
    std::atomic<bool> ready{false};
    std::mutex m;
    std::condition_variable cv;
    bool stop = false;
  };
  const auto stop_signal = std::make_shared<StopSignal>();
  std::thread([s = stop_signal, sigs] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (!s->ready.load()) {
      fmt::print(stderr, "deltafin serve: interrupted while loading the model\n");
      std::_Exit(128 + sig);
    }
    fmt::print(stderr, "deltafin serve: shutting down (signal {})\n", sig);
    {
      std::lock_guard<std::mutex> lock(s->m);
      s->stop = true;
    }
    s->cv.notify_all();
  }).detach();

  server::Metrics metrics;
  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = api_key;
  ho.max_request_bytes = max_body;
  ho.timeout_s = a.timeout;
  ho.aliases = a.aliases;
  ho.model_id = a.model_id;
  ho.webui = !a.no_webui;
  server::HttpServer http(ho, tok, metrics);
  const int port = http.bind();
  if (!is_loopback(a.host) && api_key.empty()) {
    log_warn(
        "listening on {} without an API key: anyone who can reach this address can use the model "
        "(give --api-key or --api-key-file)",
        a.host);
  }
  const bool v6 = a.host.find(':') != std::string::npos;
  fmt::print(stderr, "deltafin serve: listening on http://{}{}{}:{} (loading the model)\n",
             v6 ? "[" : "", a.host, v6 ? "]" : "", port);
  http.start();

  // The memory plan reserves a full-context state for every active sequence and every kept
  // conversation, and the rows of one pass: with --prefill-chunk auto as many as the budget
  // holds (prompts share them, decoding rows first), with N every sequence's N rows.
  LoadRequest req = load_request(a.engine, a.draft, a.prefill_chunk);
  req.state_cache = a.state_cache;
  req.sequences = a.parallel;
  req.parallel = a.parallel;
  req.loaded_tokenizer = tok;
  LoadedEngine engine = load_engine(std::move(req));  // the drafter counted for every sequence
  note_demo_drafter(a.engine.model, engine.draft);
  auto& model = engine.model;
  const int64_t chunk = prefill_chunk_rows(a.prefill_chunk);
  const int64_t pass_rows = engine.pass_rows;
  const auto& cfg = model->config();
  int64_t context = cfg.max_positions;
  if (a.engine.ctx > 0) context = a.engine.ctx;
  if (model->plan())
    context = std::min(context, model->plan()->context);  // what the memory plan holds
  server::ServeLimits limits;
  limits.model_id = a.model_id;
  limits.aliases = a.aliases;
  limits.context = context;
  limits.max_tokens = a.max_tokens > 0 ? std::min(a.max_tokens, context) : context;
  limits.vocab = cfg.vocab;
  const GenerationDefaults generation = load_generation_config(a.engine.model);
  generation.apply(limits.sampling);
  limits.stop_ids = stop_ids_for(cfg, &tok, generation);
  limits.prefill_chunk = chunk > 0 ? chunk : pass_rows;
  limits.images.allow_urls = a.allow_image_urls;
  limits.images.max_bytes = max_image;
  if (engine.vision) limits.measure_image = image_measurer(engine.vision.get());
  // A text-only model: the edge checks an image's headers and refuses it, naming the part.
  limits.images.text_only = !engine.vision;

  server::SchedulerOptions so;
  so.parallel = a.parallel;
  so.queue = a.queue;
  so.store = engine.store.get();
  so.new_drafter = engine.drafter_factory();
  so.draft_max = engine.draft_max;
  so.pass_rows = chunk > 0 ? 0 : pass_rows;
  so.vision = engine.vision.get();
  metrics.set_engine_info(engine_info(*model, a.engine.readers));
  server::Scheduler scheduler(*model, tok, so, metrics);
  metrics.set_static(context, a.parallel, a.queue, so.pass_rows);
  if (engine.vision) {
    const VisionConfig& vc = engine.vision->config();
    const VisionCost cost = vision_cost(vc);
    metrics.set_vision(
        cost.tower_params + cost.projector_params, cost.weight_bytes,
        model->plan() ? model->plan()->vision_work_bytes
                      : vision_work_bytes(vc, vision::max_patches(engine.vision->media_config()),
                                          global_pool().size()));
  }
  metrics.set_ready(true);
  http.set_ready(&scheduler, limits);
  stop_signal->ready.store(true);
  fmt::print(stderr,
             "deltafin serve: ready: {} as `{}`{}; context {} tokens (model max {}), max tokens "
             "{}, parallel {}, "
             "queue {}, timeout {} s{}\n",
             a.engine.model, a.model_id,
             a.aliases.empty() ? "" : fmt::format(" (aliases {})", fmt::join(a.aliases, ", ")),
             context, cfg.max_positions, limits.max_tokens, a.parallel, a.queue, a.timeout,
             api_key.empty() ? "" : ", API key required");
  if (!a.no_webui) {
    fmt::print(stderr, "deltafin serve: open http://{}{}{}:{}/ in a browser for the chat page\n",
               v6 ? "[" : "", a.host, v6 ? "]" : "", port);
  }
  if (model->plan()) {
    fmt::print(stderr, "deltafin serve: the memory plan holds {} states of up to {}\n",
               model->plan()->sequences,
               human_bytes(static_cast<double>(state_bytes(cfg, context))));
  }
  fmt::print(stderr, "deltafin serve: {}\n",
             engine.store ? engine.store->describe() : "[state cache] off (--state-cache none)");

  {
    std::unique_lock<std::mutex> lock(stop_signal->m);
    stop_signal->cv.wait(lock, [&] { return stop_signal->stop; });
  }
  http.set_stopping();
  scheduler.stop();
  http.stop();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto [cmd, a] = add_traced_engine_command<ServeArgs>(
      app, "serve", "OpenAI-compatible HTTP server (chat, completions, models, health, metrics)",
      run_serve);
  cmd->add_option("--host", a->host, "Address to listen on (loopback by default)")
      ->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->api_key,
                  "Require Authorization: Bearer KEY on every endpoint but /health");
  cmd->add_option("--api-key-file", a->api_key_file,
                  "Read the API key from the first line of a file");
  cmd->add_option("--model-id", a->model_id,
                  "The model name clients use (default: the release the model belongs to: "
                  "kimi-k3, kimi-linear, kimi-k2, kimi-k2-thinking, kimi-k2.5 or deepseek-v3)");
  cmd->add_option("--alias", a->aliases,
                  "Another accepted model name (repeatable; '*' accepts any)");
  cmd->add_option("--parallel", a->parallel, "Sequences decoded together in one forward pass")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--queue", a->queue, "Requests that may wait for a slot (beyond: 429)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--timeout", a->timeout, "Seconds a request may take, queueing included")
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "Ceiling for max_tokens (default: the context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-request-bytes", a->max_request_bytes,
                  "Largest request body (e.g. 16M; beyond: 413)")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Prompt tokens per forward pass: auto (as many as the memory budget holds, "
                  "shared by the sequences) or N per sequence")
      ->capture_default_str()
      ->check(auto_or_positive());
  cmd->add_option("--max-image-bytes", a->max_image_bytes,
                  "Largest image, decoded, in a request (e.g. 20M; beyond: 400 naming the part)")
      ->capture_default_str();
  cmd->add_flag("--allow-image-urls", a->allow_image_urls,
                "Fetch http(s) image URLs that clients send (off: only inline data URLs and "
                "base64 images; the server fetches nothing a client names)");
  cmd->add_flag("--no-webui", a->no_webui,
                "Do not serve the browser page (chat and engine view) at /");
  add_draft_options(cmd, a->draft);
  add_state_cache_options(cmd, a->state_cache);
}

}  // namespace deltafin::cli
