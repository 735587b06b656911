#include "cli/common.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/demo.h"
#include "cli/error_text.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "vision/image.h"

namespace deltafin::cli {

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          long long x = std::stoll(v, &used);
          if (used == v.size() && x >= 0) return {};
        } catch (...) {
        }
        return "expected a whole number >= 0, found " + v;
      },
      "N>=0");
}

CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          long long x = std::stoll(v, &used);
          if (used == v.size() && x >= 1) return {};
        } catch (...) {
        }
        return "expected a whole number >= 1, found " + v;
      },
      "N>=1");
}

// A flag validator from the parser the value goes to later: its exception text is the message.
template <class Parse>
CLI::Validator parses_with(Parse parse, const char* shape) {
  return CLI::Validator(
      [parse](std::string& v) -> std::string {
        try {
          parse(v);
        } catch (const SettingError& e) {
          return validator_text(e);  // CLI11 names the flag
        } catch (const std::exception& e) {
          return e.what();
        }
        return {};
      },
      shape);
}

void add_draft_options(CLI::App* cmd, DraftOptions& o) {
  cmd->add_option("--draft", o.draft,
                  "Speculative decoding: none, ngram (drafts from the sequence's own text), mtp "
                  "(DeepSeek-V3's own MTP layer) or a draft model folder (EAGLE-3.x, DSpark); "
                  "drafts are verified in one pass and "
                  "the output is unchanged. Default: the model folder's draft/ subfolder when it "
                  "has one (the built-in demo's trained EAGLE-3.1 drafter), else none")
      ->check(parses_with([](const std::string& v) { check_draft_spec(v); }, "none|ngram|mtp|DIR"));
  cmd->add_option("--draft-max", o.draft_max,
                  "Most drafts verified per pass: auto (chosen per pass from measured pass costs "
                  "and acceptance, up to 16) or N (always up to N)")
      ->capture_default_str()
      ->check(parses_with([](const std::string& v) { DraftMax::parse(v); }, "auto|N>=1"));
}

void add_state_cache_options(CLI::App* cmd, StateCacheSettings& o) {
  auto size = [](const std::string& v, const char* flag) -> uint64_t {
    if (v == "0") return 0;
    try {
      return parse_size(v, flag);
    } catch (const InvalidArgument& e) {
      fail_usage("{}", e.what());
    }
  };
  cmd->add_option_function<std::string>(
      "--state-cache",
      [&o](const std::string& v) {
        o.enabled = v != "none";
        o.dir = o.enabled ? v : "";
      },
      "Where prefix snapshots of sequence states are kept on disk, so a prompt that starts with "
      "a kept prefix prefills only the rest, across restarts too (default: states/ in the cache "
      "folder; none: no reuse at all)");
  cmd->add_option_function<std::string>(
         "--state-cache-size",
         [&o, size](const std::string& v) { o.disk_bytes = size(v, "--state-cache-size"); },
         "Most disk the snapshots may take, e.g. 16G (0: RAM only)")
      ->default_str("16G");
  cmd->add_option_function<std::string>(
         "--state-cache-ram",
         [&o, size](const std::string& v) {
           o.ram_bytes =
               v == "auto" ? std::nullopt : std::optional<uint64_t>(size(v, "--state-cache-ram"));
         },
         "RAM of the memory budget kept for snapshots, e.g. 2G (auto: two full-context states; "
         "0: disk only)")
      ->default_str("auto");
}

void note_demo_drafter(const std::string& model_dir, const std::string& draft) {
  if (const std::string note = demo_drafter_note(model_dir, draft); !note.empty())
    fmt::print(stderr, "{}\n", note);
}

LoadRequest load_request(const EngineOptions& e, const DraftOptions& d,
                         const std::string& prefill_chunk) {
  LoadRequest r;
  r.engine = e;
  r.draft = d.draft;
  r.draft_max = DraftMax::parse(d.draft_max);
  r.prefill_chunk = prefill_chunk_rows(prefill_chunk);
  r.state_cache.enabled = false;  // the commands that keep snapshots give their own settings
  return r;
}

CLI::Validator auto_or_positive() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v == "auto" || prefill_chunk_rows(v) > 0) return {};
        return "expected auto or a whole number >= 1, got " + v;
      },
      "auto|N");
}

int64_t prefill_chunk_rows(const std::string& flag) {
  if (flag == "auto") return 0;
  try {
    size_t used = 0;
    const long long x = std::stoll(flag, &used);
    if (used == flag.size() && x >= 1) return x;
  } catch (...) {
  }
  return -1;
}

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  cmd->add_option("--model", o.model,
                  "Model folder (config.json + safetensors shards; default: $DELTAFIN_MODEL, "
                  "else the built-in demo)");
  cmd->add_option("--threads", o.threads, "Compute threads (default: one per physical core)")
      ->check(non_negative());
  cmd->add_option("--kernels", o.kernels,
                  "Force a kernel set: scalar, avx2, avx512 or neon (default: best for this CPU)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "neon"}));
  cmd->add_option_function<std::string>(
      "--memory-budget",
      [&o](const std::string& v) { o.memory_budget = parse_size(v, "memory budget"); },
      "RAM for the model, e.g. 48G or 1.5 (GiB; K/M/G/T are powers of 1024); default 75% of RAM "
      "or of the cgroup limit. Trunk layers and experts that do not fit are streamed from disk");
  cmd->add_flag("-v,--verbose", o.verbose,
                "Print the memory plan and the kernel set (always shown on a terminal)");
  cmd->add_option(
         "--ctx", o.ctx,
         "Context positions per sequence to plan memory for (default: the model's limit, at "
         "most 8192)")
      ->check(non_negative());
  cmd->add_flag(
      "--mmap", o.mmap,
      "Map the shards and let the page cache page weights in (no budget, no expert store)");
  cmd->add_option_function<std::string>(
         "--cache-policy", [&o](const std::string& v) { o.cache_policy = parse_cache_policy(v); },
         "Expert cache policy: lru, lfu or pinned (keeps the hottest experts of earlier runs "
         "resident)")
      ->default_str("lru")
      ->check(CLI::IsMember({"lru", "lfu", "pinned"}));
  cmd->add_option("--readers", o.readers, "Reader threads for expert and trunk reads")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--trunk-read-ahead", o.trunk_read_ahead,
                  "Streamed trunk layers read ahead of the one computing (default 0: as many as "
                  "the budget holds beside the expert cache, at least 1; more costs resident "
                  "layers or expert cache)")
      ->check(CLI::Range(0, 64));
  cmd->add_flag_callback(
      "--no-prefetch", [&o] { o.prefetch = false; },
      "Do not predict and read the next layer's experts ahead");
  cmd->add_flag_callback(
      "--no-direct-io", [&o] { o.direct_io = false; },
      "Read through the page cache instead of O_DIRECT");
  cmd->add_option("--home", o.homes,
                  "A folder on another drive holding copies of experts (filled by deltafin "
                  "place; repeatable): an expert several drives hold is read from all of them "
                  "at once");
  cmd->add_option_function<std::string>(
      "--read-piece",
      [&o](const std::string& v) {
        o.read_piece = parse_size(v, "read piece");
        if (o.read_piece < 4096 || o.read_piece % 4096 != 0)
          fail_setting("read piece", v, "expected a multiple of 4K, at least 4K");
      },
      "Smallest piece of one expert's read when it is split over several drives holding it, a "
      "multiple of 4K (default 1M)");
  cmd->add_option("--gpu", o.gpu.select,
                  "Vulkan GPU for the matrix products: auto (a GPU if there is one), a device "
                  "index (0, 1, ...; CPU drivers such as lavapipe only this way) or off")
      ->capture_default_str()
      ->check(
          [](const std::string& v) -> std::string {
            if (v == "auto" || v == "off") return "";
            if (!v.empty() && v.size() < 6 &&
                v.find_first_not_of("0123456789") == std::string::npos)
              return "";
            return "expected auto, off or a device index (0, 1, ...), found " + v;
          },
          "auto|N|off");
  cmd->add_option_function<std::string>(
      "--gpu-memory", [&o](const std::string& v) { o.gpu.memory = parse_size(v, "gpu memory"); },
      "Device memory for resident trunk weights, e.g. 20G (default: 3/4 of the device's memory)");
  cmd->add_option("--gpu-min-rows", o.gpu.min_rows,
                  "Rows from which a product whose weights are not resident on the device "
                  "(routed experts, streamed trunk layers) is uploaded and run there")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option_function<std::string>(
         "--trunk",
         [&o](const std::string& v) {
           o.trunk = v == "int8" ? TrunkFormat::kInt8 : TrunkFormat::kBF16;
         },
         "Trunk weights: bf16 (exact, default) or int8 (lossy: per-row int8, f16 scales, for "
         "resident layers)")
      ->default_str("bf16")
      ->check(CLI::IsMember({"bf16", "int8"}));
}

void require_tokenizer(const std::string& dir, const char* who) {
  require_model_folder(dir);
  if (!has_tokenizer(dir))
    fail_arg("{} has no tokenizer (tiktoken.model + tokenizer_config.json); {} needs one", dir,
             who);
}

bool has_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  return fs::exists(fs::path(dir) / "tiktoken.model") &&
         fs::exists(fs::path(dir) / "tokenizer_config.json");
}

void add_tokenizer_model_option(CLI::App* cmd, std::string& model) {
  cmd->add_option("--model", model,
                  "Model folder holding tiktoken.model and tokenizer_config.json (the tokenizer "
                  "files alone are enough; default: $DELTAFIN_MODEL, else the built-in demo)");
}

void write_stdout(std::string_view bytes) {
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size()) {
    fail("cannot write to standard output");
  }
  if (std::fflush(stdout) != 0) fail("cannot write to standard output");
}

std::string resolve_model_dir(const std::string& flag) {
  namespace fs = std::filesystem;
  auto checked = [](const std::string& dir, const char* from) {
    std::error_code ec;
    if (!fs::exists(dir, ec))
      fail_arg("{} {}: no such folder (expected a checkpoint folder)", from, dir);
    if (!fs::is_directory(dir, ec))
      fail_arg("{} {}: not a folder (expected a checkpoint folder)", from, dir);
    return dir;
  };
  if (!flag.empty()) return checked(flag, "--model");
  if (const char* m = std::getenv("DELTAFIN_MODEL"); m != nullptr && *m)
    return checked(m, "DELTAFIN_MODEL");
  return install_demo_model();
}

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  auto skip = [&] {
    while (i < text.size() && (std::isspace(static_cast<unsigned char>(text[i])) != 0)) ++i;
  };
  skip();
  bool bracket = i < text.size() && text[i] == '[';
  if (bracket) ++i;
  skip();
  if (bracket && i < text.size() && text[i] == ']') {
    ++i;
    skip();
    if (i != text.size()) fail_arg("{}: unexpected text after ']'", what);
    return ids;
  }
  while (i < text.size()) {
    skip();
    size_t start = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) ++i;
    if (start == i)
      fail_arg("{}: expected a comma-separated list of token ids, found \"{}\"", what, text);
    long long v = std::stoll(text.substr(start, i - start));
    if (v > INT32_MAX) fail_arg("{}: token id {} is too large", what, v);
    ids.push_back(static_cast<int32_t>(v));
    skip();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (bracket && i < text.size() && text[i] == ']') {
      ++i;
      skip();
      if (i != text.size()) fail_arg("{}: unexpected text after ']'", what);
      return ids;
    }
    if (i < text.size()) fail_arg("{}: expected ',' after a token id in \"{}\"", what, text);
  }
  if (bracket) fail_arg("{}: missing ']'", what);
  if (ids.empty()) fail_arg("{}: no token ids given", what);
  return ids;
}

namespace {
std::string format_name_lower(const char* name) {
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

ChatImage read_image_part(const std::string& path) {
  std::vector<uint8_t> bytes = vision::read_image_file(path);
  const vision::ImageFormat f = vision::sniff_format(bytes, path);
  std::string type = format_name_lower(vision::format_name(f));
  ChatImage img;
  img.media_type = "image/" + type;
  img.name = path;
  img.bytes = std::make_shared<const std::string>(bytes.begin(), bytes.end());
  return img;
}

nlohmann::ordered_json images_json(std::span<const PromptImage> images) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const PromptImage& img : images) {
    out.push_back(
        {{"name", img.name},
         {"width", img.width},
         {"height", img.height},
         {"sha256", image_hash_hex(img.hash)},
         {"segment", nlohmann::ordered_json::array({img.segment_begin, img.segment_end})},
         {"pads", nlohmann::ordered_json::array({img.pad_begin, img.pad_begin + img.tokens})},
         {"tokens", img.tokens}});
  }
  return out;
}

}  // namespace deltafin::cli
