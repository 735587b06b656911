// The one fold of the output parser's events into an answer's parts — thinking, text, tool
// calls — each opened, added to and closed in the order the model wrote them. Every API's answer
// is built from it: OpenAI's chat deltas and message (response.cpp), Anthropic's content blocks
// and Responses' output items (PartsWire, wire.h), Ollama's message (ollama_api.cpp); each says
// only how a part looks on its wire.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "tokenizer/output_parser.h"

namespace deltafin::server {

class PartFold {
 public:
  enum class Kind { none, thinking, text, tool };
  struct Part {
    Kind kind = Kind::none;
    std::string text;         // thinking, text, or a tool call's arguments JSON
    std::string name;         // tool calls
    std::string id, call_id;  // an API's own ids, set when it is opened
  };
  // What a wire does with each step of the fold.
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual void opened(Part& p) = 0;  // may set its ids
    virtual void appended(const Part& p, const std::string& delta) = 0;
    virtual void closed(const Part& p) = 0;
  };

  // `single_tool`: keep only the first tool call of a turn (the API asked for one at most).
  explicit PartFold(bool single_tool = false) : single_tool_(single_tool) {}

  // Folds one step's events: consecutive text (or thinking) continues the open part, a change of
  // kind closes it and opens the next, each tool call is a part of its own (its arguments
  // appended as they stream, its final text the parser's at the end). Empty text opens nothing.
  void add(std::span<const ParserEvent> events, Sink& sink);
  // Closes the open part, if any (the answer ended).
  void close(Sink& sink);

  const std::vector<Part>& parts() const { return parts_; }
  int calls() const { return calls_; }

 private:
  void open(Kind kind, const std::string& name, Sink& sink);

  bool single_tool_;
  std::vector<Part> parts_;
  Kind open_ = Kind::none;
  int calls_ = 0;
  bool dropping_ = false;  // a later tool call when only one is wanted
};

}  // namespace deltafin::server
