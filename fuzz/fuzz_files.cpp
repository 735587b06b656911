// Fuzz bodies for what is read from a model folder: the safetensors header and the shard index
// (safetensors), config.json (config), and the tokenizer's tiktoken.model and
// tokenizer_config.json (tokenizer_files). Checkpoint files come from the internet, so every one
// of these parsers must refuse any byte string with deltafin::Error and nothing worse.
//
// The index and the tokenizer files are parsed through the real loaders, which read folders, so
// those inputs are written into a scratch folder first (the shards the index names are links to
// the tiny test model's, so a valid index really opens them).
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fuzz_targets.h"
#include "model/config.h"
#include "storage/checkpoint.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deltafin::fuzz {

namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  fuzz_check(out.good(), "cannot write a scratch file");
}

// A model folder whose shards are the tiny test model's (links); the index is the input.
const fs::path& index_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::path(scratch_dir()) / "index";
    fs::create_directories(d);
    const fs::path src = fs::path(test_data_dir()) / "k3-tiny-mxfp4" / "model";
    for (const auto& e : fs::directory_iterator(src)) {
      if (e.path().extension() == ".safetensors")
        fs::create_symlink(e.path(), d / e.path().filename());
    }
    return d;
  }();
  return dir;
}

}  // namespace

// First byte even: the bytes are a whole safetensors file (header length, JSON header, data);
// odd: the rest is model.safetensors.index.json next to the tiny model's three shards.
void safetensors(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const bool index = (data[0] & 1) != 0;
  ++data, --size;
  try {
    if (!index) {
      const auto tensors = parse_safetensors_header(data, size, "fuzz.safetensors");
      for (const auto& t : tensors) {
        fuzz_check(t.offset + t.nbytes <= size, "a tensor's bytes lie outside the file");
        fuzz_check(t.data == data + t.offset, "a tensor's data pointer is not its offset");
      }
    } else {
      write_file(index_dir() / "model.safetensors.index.json", data, size);
      auto ck = Checkpoint::open(index_dir().string());
      for (const auto& [name, t] : ck->tensors()) {
        fuzz_check(t.shard >= 0 && static_cast<size_t>(t.shard) < ck->shards().size(),
                   "a tensor names a shard that is not open");
      }
    }
  } catch (const Error&) {
  }
}

void config(const uint8_t* data, size_t size) {
  try {
    const ModelConfig c =
        parse_config(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    fuzz_check(c.num_layers > 0 && c.hidden > 0 && c.vocab > 0,
               "a config with a zero dimension was accepted");
    fuzz_check(static_cast<int64_t>(c.layer_kinds.size()) == c.num_layers,
               "layer kinds do not cover every layer");
  } catch (const Error&) {
  }
}

// The input is tiktoken.model, a 0x00 byte, then tokenizer_config.json (no 0x00: an empty
// config). A tokenizer that loads must encode and decode a fixed text back to itself.
void tokenizer_files(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');
  const fs::path dir = fs::path(scratch_dir()) / "tokenizer";
  fs::create_directories(dir);
  const std::string ranks = in.substr(0, cut);
  const std::string cfg = cut == std::string::npos ? "" : in.substr(cut + 1);
  write_file(dir / Tokenizer::kRankFile, reinterpret_cast<const uint8_t*>(ranks.data()),
             ranks.size());
  write_file(dir / Tokenizer::kConfigFile, reinterpret_cast<const uint8_t*>(cfg.data()),
             cfg.size());
  try {
    const Tokenizer tok = Tokenizer::load(dir.string());
    const std::string text = "The king said: <|open|> 42\n";
    const auto ids = tok.encode_ordinary(text);
    for (int32_t id : ids) fuzz_check(id >= 0 && id < tok.vocab_size(), "id out of range");
    fuzz_check(tok.decode(ids) == text, "a loaded tokenizer does not round-trip plain text");
  } catch (const Error&) {
  }
}

}  // namespace deltafin::fuzz
