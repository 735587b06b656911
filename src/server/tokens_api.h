// POST /tokenize and /detokenize in llama.cpp's shapes, for clients that count or inspect
// tokens (editor plug-ins, front ends that budget context):
//   /tokenize {"content": TEXT, "parse_special": true, "with_pieces": false, "add_special": false}
//     -> {"tokens": [ids]} or, with_pieces, {"tokens": [{"id", "piece"}]} (a piece that is not
//     valid UTF-8 on its own is a list of byte values, as llama.cpp sends it);
//   /detokenize {"tokens": [ids]} -> {"content": TEXT}.
// K3 prompts start with no BOS, so add_special adds nothing.
#pragma once

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

nlohmann::ordered_json tokenize(const nlohmann::ordered_json& body, const Tokenizer& tok);
nlohmann::ordered_json detokenize(const nlohmann::ordered_json& body, const Tokenizer& tok);

}  // namespace deltafin::server
