// The K2-family test tokenizer, shared by the K2 chat, parser and turn-constraint tests (kept out
// of test_util.h so the other tests do not depend on it).
#pragma once

#include <string>

namespace deltafin::test {

// A synthetic tokenizer with the K2-Thinking-era special-token names (write_synthetic_tokenizer
// with SpecialNames::kK2Thinking, vocabulary 2048), written once per process: its folder. It has
// no chat template and no config.json, so by the format rule it speaks k2-thinking; tests that
// need another K2 format take Tokenizer::with_chat_format or add the evidence to a copy.
const std::string& k2_tokenizer_dir();

}  // namespace deltafin::test
