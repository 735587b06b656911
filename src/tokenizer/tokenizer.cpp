// Tokenizer loading, encoding and decoding.
//
// Layout: all rank bytes live in one arena string indexed by an offset table; a power-of-two
// open-addressing table maps bytes -> rank (no per-token allocations, lookups by string_view).
// BPE follows tiktoken exactly: a piece that is itself a token is one id; otherwise adjacent
// parts are merged lowest rank first, leftmost on ties. Short pieces use tiktoken's quadratic
// scan (fastest for the few bytes of a typical word); long pieces (a 25,000-character run) use a
// heap keyed by (rank, start offset) over a linked list, which picks the same pair at every step
// in O(n log n).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "tokenizer/base64.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace deltafin {

struct Tokenizer::Impl {
  std::string arena;
  std::vector<uint32_t> offsets;  // n_ranks + 1 entries
  std::vector<int32_t> slots;     // open addressing; -1 = empty
  std::size_t mask = 0;
  std::array<int32_t, 256> byte_rank{};
  std::vector<std::string> special_names;  // kNumSpecial entries
  std::map<std::string, int32_t, std::less<>> special_by_name;
  std::bitset<256> special_first_byte;
  std::vector<std::size_t> special_lengths;  // distinct name lengths, longest first

  int32_t n_ranks() const { return static_cast<int32_t>(offsets.size()) - 1; }

  std::string_view rank_bytes(int32_t r) const {
    return std::string_view(arena).substr(offsets[r], offsets[r + 1] - offsets[r]);
  }

  static std::size_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }

  int32_t lookup(std::string_view s) const {
    for (std::size_t h = hash(s) & mask;; h = (h + 1) & mask) {
      const int32_t r = slots[h];
      if (r < 0) return -1;
      if (rank_bytes(r) == s) return r;
    }
  }

  // Inserts rank r (its bytes already in the arena); returns the rank holding the same bytes if
  // there is one (then nothing is inserted).
  int32_t insert(int32_t r) {
    const std::string_view s = rank_bytes(r);
    for (std::size_t h = hash(s) & mask;; h = (h + 1) & mask) {
      const int32_t other = slots[h];
      if (other < 0) {
        slots[h] = r;
        return -1;
      }
      if (rank_bytes(other) == s) return other;
    }
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out,
                    bpe::Scratch& scratch) const {
    if (piece.size() == 1) {
      out.push_back(byte_rank[static_cast<unsigned char>(piece[0])]);
      return;
    }
    const int32_t whole = lookup(piece);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
    const auto rank = [this](std::string_view s) { return lookup(s); };
    if (piece.size() <= bpe::kQuadraticLimit) {
      bpe::merge_quadratic(piece, rank, out, scratch);
    } else {
      bpe::merge_heap(piece, rank, out, scratch);
    }
  }

  void encode_ordinary_chunk(std::string_view chunk, std::vector<int32_t>& out,
                             bpe::Scratch& scratch) const {
    for_each_piece(chunk, [&](std::string_view piece) { encode_piece(piece, out, scratch); });
  }

  // Finds the special token starting at chunk[pos] (longest name wins), -1 if none.
  int32_t special_at(std::string_view chunk, std::size_t pos, std::size_t& len) const {
    if (!special_first_byte[static_cast<unsigned char>(chunk[pos])]) return -1;
    for (const std::size_t l : special_lengths) {
      if (pos + l > chunk.size()) continue;
      const auto it = special_by_name.find(chunk.substr(pos, l));
      if (it != special_by_name.end()) {
        len = l;
        return it->second;
      }
    }
    return -1;
  }

  void encode_special_chunk(std::string_view chunk, std::vector<int32_t>& out,
                            bpe::Scratch& scratch) const {
    std::size_t seg = 0;
    for (std::size_t pos = 0; pos < chunk.size();) {
      std::size_t len = 0;
      const int32_t id = special_at(chunk, pos, len);
      if (id < 0) {
        ++pos;
        continue;
      }
      if (pos > seg) encode_ordinary_chunk(chunk.substr(seg, pos - seg), out, scratch);
      out.push_back(id);
      pos += len;
      seg = pos;
    }
    if (seg < chunk.size()) encode_ordinary_chunk(chunk.substr(seg), out, scratch);
  }
};

namespace {

std::string read_file(const std::filesystem::path& path) {
  return read_regular_file(path.string());  // a FIFO or a folder is refused, never waited on
}

std::string reserved_name(int32_t id) {
  return fmt::format("<|reserved_token_{}|>", id);
}

std::shared_ptr<Tokenizer::Impl> build_impl(std::vector<std::string> ranks,
                                            const std::vector<int64_t>& line_of_rank,
                                            const std::map<int32_t, std::string>& special_names,
                                            const std::string& rank_origin,
                                            const std::string& special_origin) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  const auto where = [&](std::size_t r) {
    return line_of_rank.empty() ? fmt::format("{} rank {}", rank_origin, r)
                                : fmt::format("{} line {}", rank_origin, line_of_rank[r]);
  };
  if (ranks.size() < 256) {
    fail("{}: {} ranks, but a byte-level BPE needs at least the 256 single bytes", rank_origin,
         ranks.size());
  }
  if (ranks.size() >
      static_cast<std::size_t>(std::numeric_limits<int32_t>::max() - 2 * Tokenizer::kNumSpecial)) {
    fail("{}: {} ranks is too many for 32-bit token ids", rank_origin, ranks.size());
  }
  std::size_t total = 0;
  for (const auto& r : ranks) total += r.size();
  if (total > std::numeric_limits<uint32_t>::max())
    fail("{}: rank bytes exceed 4 GiB", rank_origin);
  impl->arena.reserve(total);
  impl->offsets.reserve(ranks.size() + 1);
  impl->offsets.push_back(0);
  for (const auto& r : ranks) {
    impl->arena += r;
    impl->offsets.push_back(static_cast<uint32_t>(impl->arena.size()));
  }
  std::size_t cap = 1;
  while (cap < ranks.size() * 2) cap <<= 1;
  impl->slots.assign(cap, -1);
  impl->mask = cap - 1;
  impl->byte_rank.fill(-1);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].empty()) fail("{}: empty token", where(r));
    const int32_t dup = impl->insert(static_cast<int32_t>(r));
    if (dup >= 0) {
      fail("{}: duplicate token (same bytes as rank {}, {})", where(r), dup,
           where(static_cast<std::size_t>(dup)));
    }
    if (ranks[r].size() == 1)
      impl->byte_rank[static_cast<unsigned char>(ranks[r][0])] = static_cast<int32_t>(r);
  }
  for (int b = 0; b < 256; ++b) {
    if (impl->byte_rank[b] < 0) {
      fail("{}: byte 0x{:02X} has no token; every single byte must be a rank", rank_origin, b);
    }
  }
  const int32_t first = impl->n_ranks();
  impl->special_names.resize(Tokenizer::kNumSpecial);
  for (int32_t k = 0; k < Tokenizer::kNumSpecial; ++k) {
    const auto it = special_names.find(k);
    impl->special_names[k] = it != special_names.end() ? it->second : reserved_name(first + k);
  }
  for (int32_t k = 0; k < Tokenizer::kNumSpecial; ++k) {
    const std::string& name = impl->special_names[k];
    if (name.empty()) fail("{}: special token {} has an empty name", special_origin, first + k);
    const auto [it, inserted] = impl->special_by_name.emplace(name, first + k);
    if (!inserted) {
      fail("{}: special tokens {} and {} have the same name \"{}\"", special_origin, it->second,
           first + k, name);
    }
    impl->special_first_byte.set(static_cast<unsigned char>(name[0]));
    impl->special_lengths.push_back(name.size());
  }
  std::sort(impl->special_lengths.begin(), impl->special_lengths.end(), std::greater<>());
  impl->special_lengths.erase(
      std::unique(impl->special_lengths.begin(), impl->special_lengths.end()),
      impl->special_lengths.end());
  return impl;
}

// Parses tiktoken.model: one "<base64> <rank>" per line, ranks 0, 1, 2, ... in file order.
// Empty lines are skipped (tiktoken does the same); a trailing '\r' is tolerated.
std::vector<std::string> parse_rank_file(const std::string& text, const std::string& origin,
                                         std::vector<int64_t>& line_of_rank) {
  std::vector<std::string> ranks;
  std::size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
      fail("{} line {}: expected \"<base64 token> <rank>\"", origin, line_no);
    }
    const std::string_view b64 = line.substr(0, sp);
    const std::string_view rank_text = line.substr(sp + 1);
    auto bytes = base64::decode(b64);
    if (!bytes) fail("{} line {}: invalid base64 \"{}\"", origin, line_no, b64);
    int64_t rank = -1;
    const auto [end, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0) {
      fail("{} line {}: invalid rank \"{}\" (expected a non-negative integer)", origin, line_no,
           rank_text);
    }
    if (rank != static_cast<int64_t>(ranks.size())) {
      fail(
          "{} line {}: rank {} where {} was expected (ranks must be contiguous from 0, in file "
          "order)",
          origin, line_no, rank, ranks.size());
    }
    ranks.push_back(std::move(*bytes));
    line_of_rank.push_back(line_no);
  }
  if (ranks.empty()) fail("{}: no ranks", origin);
  return ranks;
}

std::map<int32_t, std::string> parse_config(const std::string& text, const std::string& origin,
                                            int32_t first_special) {
  nlohmann::json cfg;
  check_json_depth(text, kMaxJsonDepth, origin);
  try {
    cfg = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", origin, json_error_text(e));
  }
  if (!cfg.is_object()) fail("{}: expected a JSON object at the top level", origin);
  const auto it = cfg.find("added_tokens_decoder");
  if (it == cfg.end()) fail("{}: missing \"added_tokens_decoder\"", origin);
  if (!it->is_object())
    fail("{}: \"added_tokens_decoder\" must be an object of id -> token", origin);
  std::map<int32_t, std::string> names;
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty()) {
      fail("{}: added_tokens_decoder key \"{}\" is not a token id", origin, key);
    }
    if (id < first_special || id >= static_cast<int64_t>(first_special) + Tokenizer::kNumSpecial) {
      fail(
          "{}: added_tokens_decoder id {} is outside the special range [{}, {}) that follows the "
          "{} ranks",
          origin, id, first_special, first_special + Tokenizer::kNumSpecial, first_special);
    }
    if (!value.is_object() || !value.contains("content") || !value["content"].is_string()) {
      fail("{}: added_tokens_decoder[\"{}\"] must be an object with a string \"content\"", origin,
           key);
    }
    const std::string content = value["content"].get<std::string>();
    if (content.empty()) fail("{}: added_tokens_decoder[\"{}\"].content is empty", origin, key);
    names[static_cast<int32_t>(id - first_special)] = content;
  }
  return names;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path rank_path = fs::path(dir) / kRankFile;
  const fs::path cfg_path = fs::path(dir) / kConfigFile;
  std::vector<int64_t> line_of_rank;
  std::vector<std::string> ranks =
      parse_rank_file(read_file(rank_path), rank_path.string(), line_of_rank);
  const auto first_special = static_cast<int32_t>(
      std::min<std::size_t>(ranks.size(), std::numeric_limits<int32_t>::max()));
  const auto names = parse_config(read_file(cfg_path), cfg_path.string(), first_special);
  Tokenizer tok(
      build_impl(std::move(ranks), line_of_rank, names, rank_path.string(), cfg_path.string()));
  tok.format_ = chat_format_for(tok, read_chat_format_evidence(dir));
  return tok;
}

Tokenizer Tokenizer::from_ranks(std::vector<std::string> ranks,
                                const std::map<int32_t, std::string>& special_names,
                                const std::string& origin) {
  for (const auto& [offset, name] : special_names) {
    if (offset < 0 || offset >= kNumSpecial) {
      fail("{}: special token offset {} is outside [0, {})", origin, offset, kNumSpecial);
    }
  }
  Tokenizer tok(build_impl(std::move(ranks), {}, special_names, origin, origin));
  tok.format_ = chat_format_for(tok, {});
  return tok;
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  encode_ordinary_append(text, out);
  return out;
}

void Tokenizer::encode_ordinary_append(std::string_view text, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size() / 4 + 1);
  bpe::Scratch scratch;
  for_each_guard_chunk(
      text, [&](std::string_view chunk) { impl_->encode_ordinary_chunk(chunk, out, scratch); });
}

std::vector<int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 1);
  bpe::Scratch scratch;
  for_each_guard_chunk(
      text, [&](std::string_view chunk) { impl_->encode_special_chunk(chunk, out, scratch); });
  return out;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail("token id {} is out of range: the vocabulary has {} ids (0..{})", id, vocab_size(),
         vocab_size() - 1);
  }
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  if (id < impl_->n_ranks()) return impl_->rank_bytes(id);
  return impl_->special_names[id - impl_->n_ranks()];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) out += token_bytes(id);
  return out;
}

std::optional<int32_t> Tokenizer::special_id(std::string_view name) const {
  const auto it = impl_->special_by_name.find(name);
  if (it == impl_->special_by_name.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> Tokenizer::rank_of(std::string_view bytes) const {
  if (bytes.empty()) return std::nullopt;
  const int32_t r = impl_->lookup(bytes);
  if (r < 0) return std::nullopt;
  return r;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= impl_->n_ranks() && id < vocab_size();
}

int32_t Tokenizer::vocab_size() const {
  return impl_->n_ranks() + kNumSpecial;
}

int32_t Tokenizer::n_ranks() const {
  return impl_->n_ranks();
}

std::string IncrementalDecoder::push(int32_t id) {
  return push_bytes(tokenizer_->token_bytes(id));
}

std::string IncrementalDecoder::push_bytes(std::string_view bytes) {
  held_.append(bytes);
  std::string out;
  std::size_t i = 0;
  while (i < held_.size()) {
    const utf8::Decoded d = utf8::decode(held_, i);
    if (d.status == utf8::Decoded::Status::truncated) break;
    if (d.status == utf8::Decoded::Status::ok) {
      out.append(held_, i, d.len);
    } else {
      out.append(utf8::kReplacement);
    }
    i += d.len;
  }
  held_.erase(0, i);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = utf8::sanitize(held_);
  held_.clear();
  return out;
}

}  // namespace deltafin
