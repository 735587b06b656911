// Kimi pre-tokenizer over PCRE2 (UTF + UCP + MATCH_INVALID_UTF, JIT when available).
//
// Rewrites relative to the reference pattern, each chosen to keep the meaning of the Rust
// `regex` crate that tiktoken uses:
//  * `\p{Han}` -> `\p{sc:Han}`: Rust means the Script property; PCRE2 >= 10.40 reads a bare
//    script name as Script_Extensions, which would also match `。`, `、`, `ー` and friends.
//  * `\s` / `\S` -> an explicit Unicode White_Space class (what Rust's `\s` is), so the result
//    does not depend on how a PCRE2 version defines `\s` under UCP.
//  * `[X&&[^\p{Han}]]` with X a union of general categories -> `[^ (other categories) \p{Han}]`.
//    General categories partition the code space, so "not in the other categories and not Han"
//    is exactly "in X and not Han". One class per character instead of a look-ahead group.
#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deltafin {

const std::string_view kKimiPatStr =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space, the set Rust's `\s` matches.
constexpr std::string_view kWs =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string build_pattern(const std::string& upper, const std::string& lower) {
  const std::string ws = std::string(kWs);
  const std::string contractions = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)";
  std::string p;
  p += R"([\p{sc:Han}]+)";
  p += R"(|[^\r\n\p{L}\p{N}]?)" + upper + "*" + lower + "+" + contractions;
  p += R"(|[^\r\n\p{L}\p{N}]?)" + upper + "+" + lower + "*" + contractions;
  p += R"(|\p{N}{1,3})";
  p += "| ?[^" + ws + R"(\p{L}\p{N}]+[\r\n]*)";
  p += "|[" + ws + R"(]*[\r\n]+)";
  p += "|[" + ws + "]+(?![^" + ws + "])";
  p += "|[" + ws + "]+";
  return p;
}

struct Pattern {
  pcre2_code* code = nullptr;
  bool jit = false;
  Pattern() {
    const std::string pat = kimi_pcre2_pattern();
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("pre-tokenizer pattern does not compile with this PCRE2 at offset {}: {}", off,
           reinterpret_cast<const char*>(msg));
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
};

const Pattern& pattern() {
  static const Pattern p;
  return p;
}

// Per-thread match state: match data and a JIT stack large enough for the longest run the
// guards allow. PCRE2 objects are not shareable between concurrent matches.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (data == nullptr || context == nullptr || stack == nullptr) {
      fail("pre-tokenizer: out of memory creating PCRE2 match state");
    }
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState s;
  return s;
}

}  // namespace

std::string kimi_pcre2_pattern() {
  // X = Lu|Lt|Lm|Lo|M  ->  complement categories Ll, N, P, S, Z, C.
  // Y = Ll|Lm|Lo|M     ->  complement categories Lu, Lt, N, P, S, Z, C.
  return build_pattern(R"([^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}])",
                       R"([^\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}])");
}

std::string kimi_pcre2_pattern_lookahead_form() {
  return build_pattern(R"((?:(?!\p{sc:Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))",
                       R"((?:(?!\p{sc:Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}]))");
}

void for_each_guard_chunk(std::string_view text, const std::function<void(std::string_view)>& fn,
                          std::size_t max_slice_chars, std::size_t max_run_chars) {
  if (text.empty()) {
    fn(text);
    return;
  }
  std::size_t slice_chars = 0;
  std::size_t chunk_start = 0;
  std::size_t run_len = 0;
  bool run_is_space = false;
  for (std::size_t i = 0; i < text.size();) {
    if (slice_chars == max_slice_chars) {  // a new slice starts here: close the last chunk
      fn(text.substr(chunk_start, i - chunk_start));
      chunk_start = i;
      slice_chars = 0;
    }
    const utf8::Decoded d = utf8::decode(text, i);
    const bool is_space = d.status == utf8::Decoded::Status::ok && utf8::py_isspace(d.cp);
    if (slice_chars == 0) {
      run_is_space = is_space;
      run_len = 0;
    }
    if (run_is_space != is_space) {
      run_len = 1;
      run_is_space = is_space;
    } else if (++run_len > max_run_chars) {
      fn(text.substr(chunk_start, i - chunk_start));
      chunk_start = i;
      run_len = 1;
    }
    ++slice_chars;
    i += d.len;
  }
  fn(text.substr(chunk_start));
}

void for_each_piece(std::string_view chunk, const std::function<void(std::string_view)>& fn) {
  const Pattern& pat = pattern();
  MatchState& ms = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(chunk.data());
  std::size_t pos = 0;
  while (pos < chunk.size()) {
    const int rc = pcre2_match(pat.code, subject, chunk.size(), pos, 0, ms.data, ms.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer: PCRE2 match failed at byte {}: {}", pos,
           reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
    const std::size_t start = ov[0], end = ov[1];
    if (start > pos) fn(chunk.substr(pos, start - pos));  // unmatched (invalid) bytes
    if (end == start) {  // cannot happen with this pattern; guard against a loop anyway
      fn(chunk.substr(start, 1));
      pos = start + 1;
      continue;
    }
    fn(chunk.substr(start, end - start));
    pos = end;
  }
  if (pos < chunk.size()) fn(chunk.substr(pos));
}

}  // namespace deltafin
