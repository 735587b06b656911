#include "engine/synthetic.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "model/inventory.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

SyntheticSpec synthetic_preset(const std::string& name) {
  SyntheticSpec s;
  if (name == "tiny") return s;  // the golden tiny models' shape
  if (name == "k3") {
    s.hidden = 7168;
    s.layers = 4;
    s.vocab = 32768;
    s.dense_intermediate = 33792;
    s.first_k_dense = 1;
    s.attn_res_block = 12;
    s.kda_heads = 96;
    s.kda_head_dim = 128;
    s.mla_heads = 96;
    s.q_lora = 1536;
    s.kv_lora = 512;
    s.qk_nope = 128;
    s.qk_rope = 64;
    s.v_head = 128;
    s.experts = 32;
    s.top_k = 16;
    s.shared_experts = 2;
    s.moe_intermediate = 3072;
    s.latent = 3584;
    s.max_positions = 1048576;
    s.shard_bytes = 4ull << 30;
    return s;
  }
  fail_arg("unknown preset \"{}\" (expected tiny or k3)", name);
}

std::string synthetic_config_json(const SyntheticSpec& s) {
  std::vector<int64_t> mla = s.mla_layers;
  if (mla.empty()) {
    for (int64_t l = 1; l <= s.layers; ++l) {
      if (l % 4 == 0 || l == s.layers) mla.push_back(l);
    }
  }
  std::vector<int64_t> kda;
  for (int64_t l = 1; l <= s.layers; ++l) {
    if (std::find(mla.begin(), mla.end(), l) == mla.end()) kda.push_back(l);
  }
  const int64_t first_special = s.vocab - 256;
  ojson tc;
  tc["architectures"] = {"KimiLinearForCausalLM"};
  tc["model_type"] = "kimi_linear";
  tc["hidden_size"] = s.hidden;
  tc["num_hidden_layers"] = s.layers;
  tc["num_attention_heads"] = s.mla_heads;
  tc["num_key_value_heads"] = s.mla_heads;
  tc["vocab_size"] = s.vocab;
  tc["rms_norm_eps"] = 1e-5;
  tc["intermediate_size"] = s.dense_intermediate;
  tc["moe_intermediate_size"] = s.moe_intermediate;
  tc["num_experts"] = s.experts;
  tc["num_experts_per_token"] = s.top_k;
  tc["num_shared_experts"] = s.shared_experts;
  tc["first_k_dense_replace"] = s.first_k_dense;
  tc["routed_scaling_factor"] = s.routed_scaling;
  tc["moe_renormalize"] = true;
  tc["moe_router_activation_func"] = "sigmoid";
  tc["num_expert_group"] = 1;
  tc["topk_group"] = 1;
  tc["routed_expert_hidden_size"] = s.latent;
  tc["hidden_act"] = "situ";
  tc["activation_situ_beta"] = s.situ_beta;
  tc["activation_situ_linear_beta"] = s.situ_linear_beta;
  tc["attn_res_block_size"] = s.attn_res_block;
  tc["q_lora_rank"] = s.q_lora;
  tc["kv_lora_rank"] = s.kv_lora;
  tc["qk_nope_head_dim"] = s.qk_nope;
  tc["qk_rope_head_dim"] = s.qk_rope;
  tc["v_head_dim"] = s.v_head;
  tc["mla_use_nope"] = true;
  tc["linear_attn_config"] = {{"full_attn_layers", mla},
                              {"kda_layers", kda},
                              {"head_dim", s.kda_head_dim},
                              {"num_heads", s.kda_heads},
                              {"short_conv_kernel_size", s.conv_kernel},
                              {"gate_lower_bound", -5.0},
                              {"use_full_rank_gate", true}};
  tc["mla_use_output_gate"] = true;
  tc["latent_moe_use_norm"] = true;
  tc["topk_method"] = "noaux_tc";
  tc["use_grouped_topk"] = true;
  tc["moe_layer_freq"] = 1;
  tc["num_nextn_predict_layers"] = 0;
  tc["use_cache"] = true;
  tc["tie_word_embeddings"] = false;
  tc["bos_token_id"] = first_special;
  tc["eos_token_id"] = first_special + 2;  // <|end_of_msg|>
  tc["pad_token_id"] = first_special + 255;
  tc["max_position_embeddings"] = s.max_positions;
  tc["dtype"] = "bfloat16";
  if (s.expert_format == ExpertFormat::kMXFP4) {
    tc["quantization_config"] = ojson::parse(R"({
      "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "quantization_status": "compressed",
      "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                    "symmetric": true, "dynamic": false, "observer": "minmax",
                    "scale_dtype": "torch.uint8"},
        "input_activations": null, "output_activations": null}},
      "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                 "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]})");
  }
  ojson root;
  root["architectures"] = {"KimiK3ForConditionalGeneration"};
  root["model_type"] = "kimi_k3";
  root["text_config"] = tc;
  root["dtype"] = "bfloat16";
  root["vision_config"] = {{"model_type", "moonvit3d"},
                           {"note", "synthetic checkpoint: no vision tower"}};
  root["bos_token_id"] = first_special;
  root["eos_token_id"] = first_special + 2;
  root["pad_token_id"] = first_special + 255;
  root["tie_word_embeddings"] = false;
  root["deltafin_synthetic"] = {{"seed", s.seed},
                                {"note", "random weights with the K3 architecture"}};
  return root.dump(1) + "\n";
}

namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    s += 0xa0761d6478bd642full;
    __uint128_t t = static_cast<__uint128_t>(s) * (s ^ 0xe7037ed1a0b428dbull);
    return static_cast<uint64_t>(t >> 64) ^ static_cast<uint64_t>(t);
  }
  // uniform in [-1, 1)
  float sym() {
    return static_cast<float>(static_cast<int64_t>(next()) >> 40) * (1.0f / 8388608.0f);
  }
  float unit() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
};

enum class Gen { kLinear, kOnePlus, kVector, kALog, kPacked, kScale };

struct TensorPlan {
  ExpectedTensor t;
  Gen gen = Gen::kLinear;
  float std = 0.02f;
  uint64_t nbytes = 0;
  uint64_t seed = 0;
};

TensorPlan plan_for(const ExpectedTensor& t, uint64_t seed) {
  TensorPlan p;
  p.t = t;
  int64_t n = 1;
  for (auto d : t.shape) n *= d;
  p.nbytes = static_cast<uint64_t>(n) * dtype_size(t.dtype);
  p.seed = mix64(seed ^ hash_name(t.name));
  const std::string& s = t.name;
  auto ends = [&](const char* x) { return s.ends_with(x); };
  if (ends("weight_packed"))
    p.gen = Gen::kPacked;
  else if (ends("weight_scale"))
    p.gen = Gen::kScale;
  else if (ends("A_log"))
    p.gen = Gen::kALog;
  else if (ends("dt_bias")) {
    p.gen = Gen::kVector;
    p.std = 0.5f;
  } else if (ends("conv1d.weight")) {
    p.gen = Gen::kVector;
    p.std = 0.3f;
  } else if (ends("e_score_correction_bias")) {
    p.gen = Gen::kVector;
    p.std = 0.05f;
  } else if (ends("res_proj.weight")) {
    p.gen = Gen::kLinear;
    p.std = 0.5f;
  } else if (ends("norm.weight") || ends("layernorm.weight")) {
    p.gen = Gen::kOnePlus;
    p.std = 0.1f;
  } else {
    p.gen = Gen::kLinear;
    p.std = 0.02f;
  }
  return p;
}

constexpr uint64_t kChunk = 1ull << 20;  // generation unit (bytes), seeded independently

// Fills bytes [begin, begin + len) of a tensor (begin is a multiple of kChunk, or the tail).
void generate(const TensorPlan& p, int64_t kda_heads, uint64_t begin, uint64_t len, uint8_t* out) {
  Rng rng{mix64(p.seed + begin / kChunk)};
  const float a = p.std * 1.7320508f;  // uniform with this standard deviation
  switch (p.gen) {
    case Gen::kPacked: {
      uint64_t i = 0;
      for (; i + 8 <= len; i += 8) {
        uint64_t v = rng.next();
        std::memcpy(out + i, &v, 8);
      }
      for (; i < len; ++i) out[i] = static_cast<uint8_t>(rng.next());
      break;
    }
    case Gen::kScale:  // E8M0 around 2^-7: weights of std ~0.02 with E2M1 codes uniform
      for (uint64_t i = 0; i < len; ++i) out[i] = static_cast<uint8_t>(119 + (rng.next() & 1));
      break;
    case Gen::kALog:
    case Gen::kVector: {
      for (uint64_t i = 0; i < len; i += 4) {
        const uint64_t idx = (begin + i) / 4;
        float v;
        if (p.gen == Gen::kALog) {
          v = static_cast<int64_t>(idx) < kda_heads ? std::log(1.0f + 15.0f * rng.unit()) : 0.0f;
        } else {
          v = a * rng.sym();
        }
        std::memcpy(out + i, &v, 4);
      }
      break;
    }
    case Gen::kLinear:
    case Gen::kOnePlus: {
      const bool f32 = p.t.dtype == DType::kF32;
      const uint64_t es = f32 ? 4 : 2;
      for (uint64_t i = 0; i < len; i += es) {
        float v = a * rng.sym();
        if (p.gen == Gen::kOnePlus) v += 1.0f;
        if (f32) {
          std::memcpy(out + i, &v, 4);
        } else {
          uint16_t h = f32_to_bf16(v);
          std::memcpy(out + i, &h, 2);
        }
      }
      break;
    }
  }
}

// A background writer: the generator hands it filled buffers, it writes them in order.
class AsyncWriter {
 public:
  AsyncWriter() : thread_([this] { loop(); }) {}
  ~AsyncWriter() {
    {
      std::lock_guard<std::mutex> l(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(int fd, std::vector<uint8_t> buf, const std::string& path) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return q_.size() < 2 || !error_.empty(); });
    check_locked();
    q_.push_back({fd, std::move(buf), path});
    cv_.notify_all();
  }
  std::vector<uint8_t> recycle() {
    std::lock_guard<std::mutex> l(m_);
    if (free_.empty()) return {};
    auto b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void drain() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return (q_.empty() && !busy_) || !error_.empty(); });
    check_locked();
  }

 private:
  struct Job {
    int fd;
    std::vector<uint8_t> buf;
    std::string path;
  };
  void check_locked() {
    if (!error_.empty()) throw IoError(error_);
  }
  void loop() {
    std::unique_lock<std::mutex> l(m_);
    while (true) {
      cv_.wait(l, [&] { return !q_.empty() || done_; });
      if (q_.empty() && done_) return;
      Job j = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      l.unlock();
      std::string err;
      size_t off = 0;
      while (off < j.buf.size()) {
        ssize_t n = ::write(j.fd, j.buf.data() + off, j.buf.size() - off);
        if (n < 0) {
          if (errno == EINTR) continue;
          err = fmt::format("cannot write {}: {}", j.path, std::strerror(errno));
          break;
        }
        off += static_cast<size_t>(n);
      }
      l.lock();
      busy_ = false;
      if (!err.empty() && error_.empty()) error_ = err;
      j.buf.clear();
      free_.push_back(std::move(j.buf));
      cv_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> q_;
  std::vector<std::vector<uint8_t>> free_;
  bool done_ = false, busy_ = false;
  std::string error_;
  std::thread thread_;
};

// Writes `units` (tensors that stay in one shard) into a new folder `out_dir`: shards of about
// `shard_bytes` plus the index, or one model.safetensors when `single_file`; then config.json
// (and a tokenizer when `tokenizer_vocab` > 0). Written into a temporary sibling and renamed, so
// a failed run leaves nothing that looks like a checkpoint.
MakeModelResult write_units(const std::string& out_dir, const std::string& config_text,
                            std::vector<std::vector<TensorPlan>> units, uint64_t shard_bytes,
                            int64_t kda_heads, bool single_file, int64_t tokenizer_vocab,
                            const std::function<void(const MakeModelProgress&)>& progress) {
  Stopwatch sw;
  std::vector<std::vector<TensorPlan>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (auto& u : units) {
    uint64_t b = 0;
    for (const auto& t : u) b += t.nbytes;
    if (in_shard > 0 && in_shard + b > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    for (auto& t : u) shards.back().push_back(std::move(t));
    in_shard += b;
    total += b;
  }

  fs::path out(out_dir);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    fail_arg("{} exists and is not a folder", out_dir);
  if (fs::exists(out, ec) && !fs::is_empty(out, ec)) {
    fail_arg("{} is not empty (make-model writes a new checkpoint folder; remove it first)",
             out_dir);
  }
  fs::path tmp =
      out.parent_path() / (out.filename().string() + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  if (fs::create_directories(tmp, ec); ec)
    fail_arg("cannot create the folder {}: {}", tmp.string(), ec.message());
  // Whatever ends the writing early (an error, a full disk, the CLI's SIGINT/SIGTERM handling
  // through `progress`) removes the partial folder rather than leaving it behind.
  struct RemoveUnlessKept {
    fs::path dir;
    bool keep = false;
    ~RemoveUnlessKept() {
      std::error_code e;
      if (!keep) fs::remove_all(dir, e);
    }
  } partial{tmp};
  // Refuse what cannot fit before writing any of it (shards + a little for the small files).
  if (const fs::space_info sp = fs::space(tmp, ec); !ec && total + (1ull << 20) > sp.available) {
    fail_arg(
        "the checkpoint needs {:.2f} GiB but {} has {:.2f} GiB free (make a smaller model: fewer "
        "--layers or --experts, a smaller --hidden)",
        static_cast<double>(total) / 1073741824.0, fs::absolute(tmp.parent_path()).string(),
        static_cast<double>(sp.available) / 1073741824.0);
  }

  const int n = static_cast<int>(shards.size());
  ojson weight_map = ojson::object();
  MakeModelProgress prog;
  prog.bytes_total = total;
  ThreadPool& pool = global_pool();
  {
    AsyncWriter writer;
    constexpr uint64_t kBlock = 32ull << 20;
    for (int si = 0; si < n; ++si) {
      const std::string fname = single_file
                                    ? std::string("model.safetensors")
                                    : fmt::format("model-{:05d}-of-{:06d}.safetensors", si + 1, n);
      const fs::path path = tmp / fname;
      ojson header;
      header["__metadata__"] = {{"format", "pt"}};
      uint64_t off = 0;
      for (const auto& t : shards[si]) {
        header[t.t.name] = {{"dtype", dtype_name(t.t.dtype)},
                            {"shape", t.t.shape},
                            {"data_offsets", {off, off + t.nbytes}}};
        off += t.nbytes;
        weight_map[t.t.name] = fname;
      }
      std::string h = header.dump();
      while (h.size() % 8 != 0) h.push_back(' ');
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) fail_io("cannot create {}: {}", path.string(), std::strerror(errno));
      std::vector<uint8_t> head(8 + h.size());
      uint64_t hl = h.size();
      std::memcpy(head.data(), &hl, 8);
      std::memcpy(head.data() + 8, h.data(), h.size());
      writer.submit(fd, std::move(head), path.string());
      for (const auto& t : shards[si]) {
        for (uint64_t b = 0; b < t.nbytes; b += kBlock) {
          const uint64_t len = std::min(kBlock, t.nbytes - b);
          std::vector<uint8_t> buf = writer.recycle();
          buf.resize(len);
          const int chunks = static_cast<int>((len + kChunk - 1) / kChunk);
          pool.run(chunks, [&](int c, int) {
            const uint64_t cb = static_cast<uint64_t>(c) * kChunk;
            generate(t, kda_heads, b + cb, std::min(kChunk, len - cb), buf.data() + cb);
          });
          writer.submit(fd, std::move(buf), path.string());
          prog.bytes_written += len;
          prog.seconds = sw.elapsed();
          if (progress) progress(prog);
        }
      }
      writer.drain();
      if (::close(fd) != 0)
        fail_io("cannot finish writing {}: {}", path.string(), std::strerror(errno));
    }
  }
  ojson index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  if (!single_file)
    write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(1) + "\n");
  write_file_atomic((tmp / "config.json").string(), config_text);
  if (tokenizer_vocab > 0)
    write_synthetic_tokenizer(tmp.string(), static_cast<int32_t>(tokenizer_vocab));
  if (fs::exists(out, ec)) fs::remove(out, ec);
  if (fs::rename(tmp, out, ec); ec)
    fail_io("cannot move {} to {}: {}", tmp.string(), out_dir, ec.message());
  partial.keep = true;

  MakeModelResult r;
  r.bytes = total;
  r.shards = n;
  r.seconds = sw.elapsed();
  return r;
}

}  // namespace

MakeModelResult make_model(const std::string& out_dir, const SyntheticSpec& spec,
                           const std::function<void(const MakeModelProgress&)>& progress) {
  Stopwatch sw;
  const std::string config_text = synthetic_config_json(spec);
  const ModelConfig cfg = parse_config(config_text, "config.json (generated)");
  InventoryOptions io{spec.expert_format, spec.kda_head_dim};
  const auto expected = expected_tensors(cfg, io);

  // Units that must stay together in one shard: a layer's trunk tensors, one expert's tensors,
  // the leading and trailing globals. Experts are shuffled within their layer like the release.
  std::vector<std::vector<TensorPlan>> units;
  {
    std::vector<TensorPlan> cur;
    int cur_layer = -2, cur_expert = -2;
    std::vector<std::vector<TensorPlan>> layer_experts;
    auto flush_experts = [&] {
      Rng r{mix64(spec.seed ^ 0x5eedull ^ static_cast<uint64_t>(cur_layer))};
      for (size_t i = layer_experts.size(); i > 1; --i)
        std::swap(layer_experts[i - 1], layer_experts[r.next() % i]);
      for (auto& u : layer_experts) units.push_back(std::move(u));
      layer_experts.clear();
    };
    for (const auto& t : expected) {
      if (t.layer != cur_layer || t.expert != cur_expert) {
        if (!cur.empty()) (cur_expert >= 0 ? layer_experts : units).push_back(std::move(cur));
        cur.clear();
        if (t.layer != cur_layer) flush_experts();
        cur_layer = t.layer;
        cur_expert = t.expert;
      }
      cur.push_back(plan_for(t, spec.seed));
    }
    if (!cur.empty()) (cur_expert >= 0 ? layer_experts : units).push_back(std::move(cur));
    flush_experts();
  }
  MakeModelResult r = write_units(out_dir, config_text, std::move(units), spec.shard_bytes,
                                  spec.kda_heads, false, spec.tokenizer ? spec.vocab : 0, progress);
  r.tensors = expected.size();
  r.seconds = sw.elapsed();
  return r;
}

MakeModelResult write_random_checkpoint(const std::string& out_dir, const std::string& config_text,
                                        const std::vector<ExpectedTensor>& tensors, uint64_t seed) {
  std::vector<std::vector<TensorPlan>> units;
  for (const auto& t : tensors) units.push_back({plan_for(t, seed)});
  MakeModelResult r =
      write_units(out_dir, config_text, std::move(units), UINT64_MAX, 0, true, 0, {});
  r.tensors = tensors.size();
  return r;
}

}  // namespace deltafin
