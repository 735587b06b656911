// llama.cpp's logits for a token sequence, written the way `deltafin logits` writes its own
// (float32 little-endian [T, vocab]), so tools/llamacpp-yardstick.sh can compare the two engines
// row by row. A development tool built by that script against the llama.cpp it builds; nothing
// in Deltafin's build or tests uses it.
//
//   llamacpp-logits MODEL.gguf IDS MODE THREADS OUT
//     IDS      comma-separated token ids, e.g. 5,17,200
//     MODE     prefill (one batch, every position's logits), decode (one token per call) or
//              split:N (a batch of the first N, then one token per call), as `deltafin logits`
//     THREADS  compute threads
//
// The KV cache is float32 and flash attention is off, so the cache does not round what the
// products computed; what llama.cpp rounds in its products is decided by the GGUF's types.
//
// YaRN's beta_fast / beta_slow: llama.cpp's converter writes the config's values into the GGUF
// (`<arch>.rope.scaling.yarn_beta_fast`, `_slow`), but its deepseek2 loader does not read them
// and runs with its defaults 32 / 1. Kimi K2 declares 1 / 1, so llama.cpp as shipped rotates
// pairs 11-19 of K2's rope dimensions at blended frequencies the published modeling code does
// not use (measured: logits up to 6% apart by position 24). This tool passes the GGUF's values
// as context parameters, so llama.cpp runs the model the config describes.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "llamacpp-logits: %s\n", what.c_str());
  std::exit(1);
}

std::vector<llama_token> parse_ids(const char* text, int32_t vocab) {
  std::vector<llama_token> ids;
  const char* p = text;
  while (*p != '\0') {
    if (ids.size() >= 65536) fail("more than 65536 token ids");
    errno = 0;
    char* end = nullptr;
    const long id = std::strtol(p, &end, 10);
    if (end == p || errno != 0 || id < 0 || id >= vocab)
      fail(std::string("bad token id near '") + p + "' (expected ids in [0, " +
           std::to_string(vocab) + ") separated by commas)");
    ids.push_back(static_cast<llama_token>(id));
    p = end;
    if (*p == ',')
      ++p;
    else if (*p != '\0')
      fail(std::string("unexpected '") + *p + "' in the token ids");
  }
  if (ids.empty()) fail("no token ids");
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) fail("usage: llamacpp-logits MODEL.gguf IDS prefill|decode|split:N THREADS OUT");
  const std::string mode = argv[3];
  long first = -1;  // the first batch's size; -1 = all (prefill)
  if (mode == "decode") {
    first = 1;
  } else if (mode.rfind("split:", 0) == 0) {
    char* end = nullptr;
    first = std::strtol(mode.c_str() + 6, &end, 10);
    if (end == mode.c_str() + 6 || *end != '\0' || first < 1 || first > 65536)
      fail("split:N needs N in [1, 65536], not " + mode);
  } else if (mode != "prefill") {
    fail("mode must be prefill, decode or split:N, not " + mode);
  }
  const int threads = std::atoi(argv[4]);
  if (threads < 1 || threads > 1024) fail("threads must be in [1, 1024]");

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) fail(std::string("cannot load ") + argv[1]);
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const std::vector<llama_token> ids = parse_ids(argv[2], vocab);
  const int32_t n = static_cast<int32_t>(ids.size());
  if (first < 0 || first > n) first = n;

  llama_context_params cp = llama_context_default_params();
  char arch[64] = {0}, value[64] = {0};
  if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) > 0) {
    const std::string prefix = std::string(arch) + ".rope.scaling.yarn_beta_";
    if (llama_model_meta_val_str(model, (prefix + "fast").c_str(), value, sizeof value) > 0)
      cp.yarn_beta_fast = std::strtof(value, nullptr);
    if (llama_model_meta_val_str(model, (prefix + "slow").c_str(), value, sizeof value) > 0)
      cp.yarn_beta_slow = std::strtof(value, nullptr);
  }
  cp.n_ctx = static_cast<uint32_t>(n + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(n);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) fail("cannot create a context");

  std::vector<float> out(static_cast<size_t>(n) * static_cast<size_t>(vocab));
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int32_t start = 0, step = static_cast<int32_t>(first); start < n; start += step, step = 1) {
    batch.n_tokens = step;
    for (int32_t i = 0; i < step; ++i) {
      batch.token[i] = ids[static_cast<size_t>(start + i)];
      batch.pos[i] = start + i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    if (llama_decode(ctx, batch) != 0)
      fail("llama_decode failed at position " + std::to_string(start));
    for (int32_t i = 0; i < step; ++i) {
      const float* row = llama_get_logits_ith(ctx, i);
      if (row == nullptr) fail("no logits for position " + std::to_string(start + i));
      std::memcpy(&out[static_cast<size_t>(start + i) * static_cast<size_t>(vocab)], row,
                  sizeof(float) * static_cast<size_t>(vocab));
    }
  }
  llama_batch_free(batch);

  // A new file of the user's alone, never written through a link or over another file.
  const int fd = ::open(argv[5], O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE* f = fd < 0 ? nullptr : ::fdopen(fd, "wb");
  if (f == nullptr) fail(std::string("cannot write ") + argv[5] + ": " + std::strerror(errno));
  if (std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size() || std::fclose(f) != 0)
    fail(std::string("short write to ") + argv[5]);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  std::printf("wrote %d x %d logits to %s\n", n, vocab, argv[5]);
  return 0;
}
