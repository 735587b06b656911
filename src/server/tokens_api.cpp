// /tokenize and /detokenize (see tokens_api.h).
#include "server/tokens_api.h"

#include "server/translate.h"
#include "tokenizer/utf8.h"

namespace deltafin::server {

using json = nlohmann::ordered_json;

json tokenize(const json& body, const Tokenizer& tok) {
  using translate::bool_field, translate::need, translate::only_fields, translate::string_of;
  only_fields(body, {"content", "add_special", "parse_special", "with_pieces", "model"}, "");
  const std::string text = string_of(need(body, "content", ""), "content");
  bool_field(body, "add_special", "");
  const bool special = bool_field(body, "parse_special", "").value_or(true);
  const bool pieces = bool_field(body, "with_pieces", "").value_or(false);
  const std::vector<int32_t> ids =
      special ? tok.encode_with_special(text) : tok.encode_ordinary(text);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string_view b = tok.token_bytes(id);
    json piece;
    if (utf8::is_valid(b)) {
      piece = std::string(b);
    } else {
      piece = json::array();
      for (char c : b) piece.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    }
    tokens.push_back({{"id", id}, {"piece", piece}});
  }
  return {{"tokens", tokens}};
}

json detokenize(const json& body, const Tokenizer& tok) {
  using translate::array_of, translate::need, translate::only_fields;
  only_fields(body, {"tokens", "model"}, "");
  const json& arr = array_of(need(body, "tokens", ""), "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& v = arr[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.vocab_size()) {
      bad_request("tokens", "tokens[{}]: {} is not a token id (expected 0 to {})", i, v.dump(),
                  tok.vocab_size() - 1);
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return {{"content", tok.decode(ids)}};
}

}  // namespace deltafin::server
