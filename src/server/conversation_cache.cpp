// Conversation cache (see conversation_cache.h). Segments: a special id alone, or a maximal run
// of ordinary ids with its decoded bytes.
#include "server/conversation_cache.h"

#include <algorithm>
#include <string>

namespace deltafin::server {

namespace {

struct Segment {
  bool special = false;
  int32_t id = 0;
  std::string text;
  size_t end = 0;  // index after the segment in its id list
};

std::vector<Segment> segments(const Tokenizer& tok, std::span<const int32_t> ids) {
  std::vector<Segment> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (tok.is_special(id)) {
      out.push_back({true, id, {}, i + 1});
      continue;
    }
    if (out.empty() || out.back().special) out.push_back({false, 0, {}, i});
    out.back().text += tok.token_bytes(id);
    out.back().end = i + 1;
  }
  return out;
}

}  // namespace

std::optional<std::vector<int32_t>> segment_completion(const Tokenizer& tok,
                                                       std::span<const int32_t> history,
                                                       std::span<const int32_t> canon) {
  const auto h = segments(tok, history);
  const auto c = segments(tok, canon);
  if (h.size() > c.size()) return std::nullopt;
  std::vector<int32_t> rest;
  for (size_t i = 0; i < h.size(); ++i) {
    if (h[i].special != c[i].special) return std::nullopt;
    if (h[i].special) {
      if (h[i].id != c[i].id) return std::nullopt;
      continue;
    }
    if (h[i].text == c[i].text) continue;
    // Only the last segment of the history may be a strict prefix of canon's run.
    const bool last = i + 1 == h.size();
    if (!last || c[i].text.compare(0, h[i].text.size(), h[i].text) != 0 ||
        h[i].text.size() >= c[i].text.size()) {
      return std::nullopt;
    }
    rest = tok.encode_ordinary(std::string_view(c[i].text).substr(h[i].text.size()));
  }
  const size_t from = h.empty() ? 0 : c[h.size() - 1].end;
  rest.insert(rest.end(), canon.begin() + static_cast<ptrdiff_t>(from), canon.end());
  return rest;
}

void ConversationCache::put(KeptConversation entry) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(m_);
  entries_.remove_if([&](const KeptConversation& e) { return e.canon == entry.canon; });
  entries_.push_front(std::move(entry));
  while (entries_.size() > capacity_) entries_.pop_back();
}

std::optional<KeptConversation> ConversationCache::take(std::span<const int32_t> prompt) {
  std::lock_guard<std::mutex> lock(m_);
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const auto& k = it->canon;
    if (k.size() >= prompt.size() || !std::equal(k.begin(), k.end(), prompt.begin())) continue;
    if (best == entries_.end() || k.size() > best->canon.size()) best = it;
  }
  if (best == entries_.end()) return std::nullopt;
  KeptConversation out = std::move(*best);
  entries_.erase(best);
  return out;
}

size_t ConversationCache::size() const {
  std::lock_guard<std::mutex> lock(m_);
  return entries_.size();
}

}  // namespace deltafin::server
