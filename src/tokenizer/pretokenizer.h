// The Kimi pre-tokenizer: splits text into the pieces that BPE then encodes one by one.
//
// The reference (`tokenization_kimi.py`, K2 and K3 alike) runs tiktoken with a pattern that
// needs Unicode properties, class intersection `&&` and a look-ahead. PCRE2 has the first and
// the last but not `&&` (before 10.45), so each intersection is rewritten as an equivalent
// single negated class over the complementary general categories (see pretokenizer.cpp).
// Single-character classes keep the JIT-compiled matcher linear and free of per-character
// group frames; the two spellings are compared over every code point in the tests.
//
// Guards from the reference, applied before the pattern: the text is cut into slices of at most
// 400,000 characters, and each slice is cut wherever a run of consecutive whitespace or
// non-whitespace characters (Python `str.isspace`) would exceed 25,000 characters. Pieces never
// cross those cuts.
//
// Invalid UTF-8: PCRE2 runs with PCRE2_MATCH_INVALID_UTF, so an invalid byte never matches and
// never crashes the matcher; the bytes between matches (only ever invalid ones) are emitted as
// their own piece and therefore still encoded byte-level. For the guards, each maximal invalid
// subpart counts as one non-whitespace character (Python strings cannot hold such bytes, so the
// reference has no opinion).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace deltafin {

// The reference `pat_str`, verbatim (Rust-regex syntax, with `&&`); kept for documentation
// and for the tests that compare it to the golden file.
extern const std::string_view kKimiPatStr;

// The PCRE2 pattern actually compiled.
std::string kimi_pcre2_pattern();

// The intersection classes written as a look-ahead, `(?:(?!\p{Han})[X])`, for tests
// that check the rewrite is equivalent.
std::string kimi_pcre2_pattern_lookahead_form();

// Reference guard limits (characters, i.e. code points).
inline constexpr std::size_t kMaxEncodeChars = 400'000;
inline constexpr std::size_t kMaxConsecutiveRun = 25'000;

// Calls `fn` for each guard chunk of `text` (see above), in order; their concatenation is
// `text`. An empty text yields one empty chunk, like the reference.
void for_each_guard_chunk(std::string_view text, const std::function<void(std::string_view)>& fn,
                          std::size_t max_slice_chars = kMaxEncodeChars,
                          std::size_t max_run_chars = kMaxConsecutiveRun);

// Calls `fn` for each pre-tokenizer piece of `chunk` (no guards applied here), in order; their
// concatenation is `chunk`.
void for_each_piece(std::string_view chunk, const std::function<void(std::string_view)>& fn);

}  // namespace deltafin
