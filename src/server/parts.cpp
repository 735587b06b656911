// The fold of parser events into parts (see parts.h).
#include "server/parts.h"

namespace deltafin::server {

void PartFold::add(std::span<const ParserEvent> events, Sink& sink) {
  for (const auto& e : events) {
    switch (e.kind) {
      case ParserEvent::Kind::reasoning:
      case ParserEvent::Kind::content:
        if (e.text.empty()) break;
        open(e.kind == ParserEvent::Kind::reasoning ? Kind::thinking : Kind::text, "", sink);
        parts_.back().text += e.text;
        sink.appended(parts_.back(), e.text);
        break;
      case ParserEvent::Kind::tool_call_begin:
        dropping_ = single_tool_ && calls_ > 0;
        if (dropping_) break;
        ++calls_;
        open(Kind::tool, e.name, sink);
        break;
      case ParserEvent::Kind::tool_call_delta:
        if (dropping_ || open_ != Kind::tool || e.text.empty()) break;
        parts_.back().text += e.text;
        sink.appended(parts_.back(), e.text);
        break;
      case ParserEvent::Kind::tool_call_end:
        if (dropping_ || open_ != Kind::tool) break;
        parts_.back().text = e.text;  // the parser's final text (a malformed call's, cut short)
        close(sink);
        break;
      case ParserEvent::Kind::end_of_turn:
        break;
    }
  }
}

void PartFold::open(Kind kind, const std::string& name, Sink& sink) {
  if (open_ == kind && kind != Kind::tool) return;
  close(sink);
  parts_.push_back({kind, "", name, "", ""});
  open_ = kind;
  sink.opened(parts_.back());
}

void PartFold::close(Sink& sink) {
  if (open_ == Kind::none) return;
  open_ = Kind::none;
  sink.closed(parts_.back());
}

}  // namespace deltafin::server
