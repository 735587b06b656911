// The engine loop (see scheduler.h).
#include "server/scheduler.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "core/log.h"
#include "core/test_hooks.h"
#include "core/timer.h"

namespace deltafin::server {

using json = nlohmann::ordered_json;

Job::Snapshot Job::take(std::chrono::milliseconds wait, JobPhase seen) {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait_for(lock, wait, [&] { return !updates_.empty() || phase_ != seen; });
  Snapshot s;
  s.phase = phase_;
  s.updates.swap(updates_);
  s.error = error_;
  return s;
}

StopReason Job::stop() const {
  std::lock_guard<std::mutex> lock(m_);
  return stop_;
}

std::string Job::stop_string() const {
  std::lock_guard<std::mutex> lock(m_);
  return stop_string_;
}

Usage Job::usage() const {
  std::lock_guard<std::mutex> lock(m_);
  return usage_;
}

Scheduler::Scheduler(Model& model, const Tokenizer& tok, const SchedulerOptions& options,
                     Metrics& metrics)
    : model_(model),
      tok_(tok),
      opt_(options),
      metrics_(metrics),
      cache_(options.cache),
      cost_(PassCostModel::for_model(model)) {
  opt_.parallel = std::max(1, opt_.parallel);
  make_drafter(opt_.draft, {model.config().vocab, &model});  // a bad spec fails here, not later
  opt_.queue = std::max(0, opt_.queue);
  step_delay_ms_ = debug_step_delay_ms();  // test hooks (core/test_hooks.h)
  if (const char* t = test_hook_env("DELTAFIN_DEBUG_SCRIPT")) {
    script_ = tok_.encode_with_special(t);
    log_warn(
        "DELTAFIN_DEBUG_SCRIPT: every answer is forced to a scripted {} tokens, not the model's",
        script_.size());
  }
  publish_storage();
  thread_ = std::thread([this] { run(); });
}

void Scheduler::force_script(const Slot& s, std::span<float> row) const {
  const size_t i = s.gen->tokens().size();  // the token this row samples
  if (i >= script_.size() || static_cast<size_t>(script_[i]) >= row.size()) return;
  std::fill(row.begin(), row.end(), -1e30f);
  row[static_cast<size_t>(script_[i])] = 0.0f;
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::publish_storage(bool with_heat) {
  uint64_t hits = 0, requested = 0;
  for (const auto& l : model_.prefetch_recall()) {
    hits += l.predicted_hits;
    requested += l.requested;
  }
  // The heat map is layers x experts counters: copied a few times a second, not every pass.
  // Passes run on this thread only, so the totals and the map read here agree; Metrics takes
  // both under one lock, and a snapshot never pairs one pass's totals with another's map.
  const double now = now_seconds();
  std::optional<ExpertHeat> heat;
  if (with_heat || now - heat_published_ >= 0.25) {
    heat_published_ = now;
    heat = model_.experts().heat();
    heat_stale_ = false;
  }
  metrics_.set_storage(model_.experts().stats(), model_.trunk_stats(), hits, requested,
                       std::move(heat));
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (stop_) {
      throw ApiError(503, "the server is shutting down", "server_error", std::nullopt,
                     "shutting_down");
    }
    const int64_t free_slots = std::max<int64_t>(0, opt_.parallel - active_count_.load());
    if (static_cast<int64_t>(queue_.size()) >= opt_.queue + free_slots) {
      // Waiting requests first take the free slots; the queue is what waits beyond them.
      throw ApiError(429,
                     fmt::format("the server is busy: every slot (--parallel {}) is taken and "
                                 "{} more request{} wait{}, all the queue holds (--queue {}); "
                                 "retry later",
                                 opt_.parallel, opt_.queue, opt_.queue == 1 ? "" : "s",
                                 opt_.queue == 1 ? "s" : "", opt_.queue),
                     "rate_limit_error", std::nullopt, "queue_full")
          .with_retry_after(1);
    }
    queue_.push_back(job);
    metrics_.set_gauges(static_cast<int64_t>(queue_.size()), active_count_.load());
  }
  cv_.notify_all();
}

void Scheduler::cancel(const std::shared_ptr<Job>& job) {
  job->cancel();
  bool removed = false;
  {
    std::lock_guard<std::mutex> lock(m_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      removed = true;
      metrics_.set_gauges(static_cast<int64_t>(queue_.size()), active_count_.load());
    }
  }
  if (removed)
    fail(job,
         ApiError(500, "the request was cancelled", "server_error", std::nullopt, "cancelled"));
  cv_.notify_all();
}

void Scheduler::fail(const std::shared_ptr<Job>& job, const ApiError& e) {
  {
    std::lock_guard<std::mutex> lock(job->m_);
    if (job->phase_ == JobPhase::done || job->phase_ == JobPhase::failed) return;
    job->phase_ = JobPhase::failed;
    job->error_ = e;
  }
  job->cv_.notify_all();
}

void Scheduler::update_gauges() {
  active_count_.store(static_cast<int64_t>(active_.size()));
  std::lock_guard<std::mutex> lock(m_);
  metrics_.set_gauges(static_cast<int64_t>(queue_.size()), static_cast<int64_t>(active_.size()));
}

bool Scheduler::admit(const std::shared_ptr<Job>& job, Slot& slot) {
  const ServeRequest& r = job->req;
  const int64_t vocab = model_.config().vocab;
  slot.job = job;
  try {
    if (r.chat && opt_.cache > 0) {
      if (auto kept = cache_.take(r.prompt)) {
        std::vector<int32_t> input = kept->feed;
        input.insert(input.end(), r.prompt.begin() + static_cast<ptrdiff_t>(kept->canon.size()),
                     r.prompt.end());
        try {
          slot.gen =
              std::make_unique<Generation>(input, r.params, &tok_, vocab, kept->state.position());
          slot.state = std::move(kept->state);
          slot.seen = std::move(kept->seen);
          slot.input = std::move(input);
          slot.cached = slot.state.position();
        } catch (const InvalidArgument&) {
          slot.gen.reset();  // does not fit from the kept state (tokenized differently): start over
        }
        metrics_.set_cache_entries(static_cast<int64_t>(cache_.size()));
      }
    }
    if (!slot.gen) {
      slot.gen = std::make_unique<Generation>(r.prompt, r.params, &tok_, vocab, 0);
      slot.state = model_.new_state();
      slot.input = r.prompt;
    }
  } catch (const InvalidArgument& e) {
    fail(job, ApiError(400, e.what(), "invalid_request_error"));
    return false;
  } catch (const std::bad_alloc&) {
    // Out of memory for this sequence's state: refuse this request, keep serving the others.
    slot.gen.reset();
    fail(job, ApiError(503,
                       "not enough memory to start this sequence (its state could not be "
                       "allocated); retry later or send a shorter request",
                       "server_error")
                  .with_retry_after(1));
    return false;
  } catch (const std::exception& e) {
    fail(job, ApiError(500, fmt::format("could not start the generation: {}", e.what()),
                       "server_error"));
    return false;
  }
  try {
    slot.drafter = make_drafter(opt_.draft, {vocab, &model_});
    if (slot.drafter) slot.drafter->attach(slot.state);  // a draft model taps this sequence
  } catch (const std::exception& e) {
    fail(job,
         ApiError(500, fmt::format("could not start the drafter: {}", e.what()), "server_error"));
    return false;
  }
  slot.timings.arrived = job->arrived;
  slot.timings.admitted = now_seconds();
  slot.timings.drafting = slot.drafter != nullptr;
  {
    std::lock_guard<std::mutex> lock(job->m_);
    job->phase_ = JobPhase::running;
  }
  job->cv_.notify_all();
  return true;
}

void Scheduler::post(Slot& s) {
  StepUpdate u;
  u.events = s.gen->take_events();
  const auto& toks = s.gen->tokens();
  u.tokens.assign(toks.begin() + static_cast<ptrdiff_t>(s.sent), toks.end());
  s.sent = toks.size();
  if (u.events.empty() && u.tokens.empty()) return;
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->updates_.push_back(std::move(u));
  }
  s.job->cv_.notify_all();
}

Usage Scheduler::usage_of(const Slot& s) const {
  Usage usage;
  usage.cached_tokens = s.cached;
  usage.prompt_tokens = s.cached + static_cast<int64_t>(s.input.size());
  usage.completion_tokens = s.gen ? static_cast<int64_t>(s.gen->tokens().size()) : 0;
  usage.timings = s.timings;
  usage.timings.finished = now_seconds();
  return usage;
}

void Scheduler::fail(Slot& s, const ApiError& e) {
  // A request ended by its timeout, a cancellation or shutdown still used what it used (the log
  // line and the stream's usage count its tokens).
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->usage_ = usage_of(s);
  }
  fail(s.job, e);
}

void Scheduler::finish(Slot& s) {
  if (heat_stale_) publish_storage(true);
  const Generation& g = *s.gen;
  const Usage usage = usage_of(s);
  metrics_.count_finished(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens);
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->usage_ = usage;
    s.job->stop_ = g.stop_reason();
    s.job->stop_string_ = g.stop_string();
    if (s.job->req.chat && opt_.cache > 0) {
      std::vector<int32_t> history = std::move(s.seen);
      history.insert(history.end(), s.input.begin(), s.input.end());
      const auto ids = g.completion_ids();
      history.insert(history.end(), ids.begin(), ids.end());
      if (g.unconsumed_token()) history.pop_back();
      s.job->history_ = std::move(history);
      s.job->state_ = std::move(s.state);
    }
    s.job->phase_ = JobPhase::done;
  }
  s.job->cv_.notify_all();
}

void Scheduler::step() {
  const double now = now_seconds();
  std::vector<bool> drop(active_.size(), false);
  for (size_t i = 0; i < active_.size(); ++i) {
    Slot& s = active_[i];
    if (s.job->cancelled()) {
      s.gen->cancel();
      fail(s,
           ApiError(500, "the request was cancelled", "server_error", std::nullopt, "cancelled"));
      drop[i] = true;
    } else if (now > s.job->deadline) {
      s.gen->cancel();
      post(s);
      fail(s, ApiError(504, "the request did not finish within the server's time limit (--timeout)",
                       "timeout_error", std::nullopt, "timeout"));
      drop[i] = true;
    }
  }
  int64_t rows = 0, prompt_rows = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (drop[i]) continue;
    if (active_[i].gen->next_input().empty()) {  // finished without a pass (not for a fresh one)
      finish(active_[i]);
      drop[i] = true;
      continue;
    }
    if (!active_[i].gen->in_prefill())
      rows += static_cast<int64_t>(active_[i].gen->next_input().size());
  }
  // Prompt rows fill what the pass plan leaves after the decoding rows, in admission order: a
  // long prompt takes whole passes (each routed expert read once for all of its rows) and a
  // prompt that finds no room this pass waits for the next one.
  std::vector<bool> wait(active_.size(), false);
  for (size_t i = 0; i < active_.size(); ++i) {
    if (drop[i] || !active_[i].gen->in_prefill()) continue;
    if (opt_.pass_rows > 0) {
      const int64_t room = opt_.pass_rows - rows;
      if (room <= 0) {
        wait[i] = true;
        continue;
      }
      active_[i].gen->limit_input(room);
    }
    rows += static_cast<int64_t>(active_[i].gen->next_input().size());
  }
  std::vector<std::vector<int32_t>> proposals(active_.size());
  const std::vector<DraftProposal> drafts = propose_drafts(drop, rows, proposals);
  std::vector<SequenceInput> seqs;
  std::vector<size_t> in_pass;
  std::vector<std::vector<int32_t>> row_ids(active_.size());
  std::vector<PendingCommit> pending(active_.size());
  rows = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (drop[i] || wait[i]) continue;
    auto in = active_[i].gen->next_input();
    if (active_[i].gen->in_prefill()) prompt_rows += static_cast<int64_t>(in.size());
    if (drafts[i].tokens.empty()) {
      seqs.push_back({&active_[i].state, in, false, nullptr});
      rows += static_cast<int64_t>(in.size());
    } else {
      row_ids[i].assign(in.begin(), in.end());
      row_ids[i].insert(row_ids[i].end(), drafts[i].tokens.begin(), drafts[i].tokens.end());
      seqs.push_back({&active_[i].state, row_ids[i], true, &pending[i]});
      rows += static_cast<int64_t>(row_ids[i].size());
    }
    in_pass.push_back(i);
  }
  if (!seqs.empty()) {
    Stopwatch sw;
    std::vector<float> logits;
    bool ok = true;
    try {
      heat_stale_ = true;  // even a pass that throws may have counted expert lookups
      logits = model_.forward(seqs);
    } catch (const std::exception& e) {
      ok = false;
      log_warn("forward pass over {} sequences failed: {}", seqs.size(), e.what());
      for (size_t i : in_pass) {
        active_[i].gen->abort();
        fail(active_[i],
             ApiError(500, fmt::format("the forward pass failed: {}", e.what()), "server_error"));
        drop[i] = true;
      }
    }
    if (ok && prompt_rows == 0) cost_.observe(rows, sw.elapsed());
    if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
    const double seconds = sw.elapsed();
    int64_t generated = 0, proposed = 0, accepted = 0, decode_seqs = 0, decode_tokens = 0;
    if (ok) {
      const int64_t vocab = model_.config().vocab;
      size_t offset = 0;  // this sequence's first logit row
      for (size_t k = 0; k < in_pass.size(); ++k) {
        const size_t i = in_pass[k];
        Slot& s = active_[i];
        const DraftProposal& d = drafts[i];
        const size_t n_rows = d.tokens.size() + 1;
        std::span<float> l(logits.data() + offset * static_cast<size_t>(vocab),
                           n_rows * static_cast<size_t>(vocab));
        offset += n_rows;
        auto bias = [&s, this](std::span<float> row) {
          for (const auto& [id, b] : s.job->req.logit_bias) row[static_cast<size_t>(id)] += b;
          force_script(s, row);
        };
        const bool decoding = !s.gen->in_prefill();
        const size_t before = s.gen->tokens().size();
        try {
          const RowsVerdict v = accept_rows(*s.gen, l, vocab, d, bias);
          if (!d.tokens.empty()) {
            model_.commit(s.state, pending[i], v.fed);
            s.drafter->on_verified(static_cast<int>(d.tokens.size()), v.accepted);
          }
          if (!proposals[i].empty()) {
            std::vector<int32_t> emitted;
            for (size_t t = before; t < s.gen->tokens().size(); ++t)
              emitted.push_back(s.gen->tokens()[t].id);
            s.acceptance.observe_pass(proposals[i], static_cast<int>(d.tokens.size()), v.accepted,
                                      emitted);
          }
          if (decoding) {
            s.timings.draft_n += static_cast<int64_t>(d.tokens.size());
            s.timings.draft_n_accepted += v.accepted;
            ++s.timings.target_passes;
            s.timings.decode_tokens += v.tokens;
            proposed += static_cast<int64_t>(d.tokens.size());
            accepted += v.accepted;
            ++decode_seqs;
            decode_tokens += v.tokens;
          }
        } catch (const std::exception& e) {
          s.gen->abort();
          fail(s, ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error"));
          drop[i] = true;
          continue;
        }
        generated += static_cast<int64_t>(s.gen->tokens().size() - before);
        if (before == 0 && !s.gen->tokens().empty()) s.timings.first_token = now_seconds();
        post(s);
        if (s.gen->finished()) {
          finish(s);
          drop[i] = true;
        }
      }
    }
    metrics_.count_pass(rows, prompt_rows, generated, static_cast<int64_t>(seqs.size()), seconds);
    if (opt_.draft != "none") metrics_.count_drafts(proposed, accepted, decode_seqs, decode_tokens);
    publish_storage();
  }
  std::vector<Slot> keep;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (!drop[i]) keep.push_back(std::move(active_[i]));
  }
  active_.swap(keep);
}

std::vector<DraftProposal> Scheduler::propose_drafts(const std::vector<bool>& drop, int64_t rows,
                                                     std::vector<std::vector<int32_t>>& proposals) {
  std::vector<DraftProposal> drafts(active_.size());
  std::vector<size_t> who;
  std::vector<std::vector<double>> expected;
  const int cap = opt_.draft_max > 0 ? opt_.draft_max : kAutoDraftMax;
  for (size_t i = 0; i < active_.size(); ++i) {
    Slot& s = active_[i];
    if (drop[i] || !s.drafter || s.gen->in_prefill()) continue;
    // Drafts past the token limit could never be emitted; auto asks for what may be accepted.
    int room = static_cast<int>(std::min<int64_t>(cap, s.gen->tokens_left() - 1));
    if (opt_.draft_max == 0) room = auto_draft_room(room, s.acceptance.rate());
    if (room <= 0) continue;
    std::vector<int32_t> history = s.seen;
    history.insert(history.end(), s.input.begin(), s.input.end());
    for (int32_t t : s.gen->completion_ids()) history.push_back(t);
    try {
      drafts[i] = s.drafter->propose(history, room);
    } catch (const std::exception& e) {
      // A drafter that fails only costs this sequence its drafts.
      log_warn("drafter failed: {}", e.what());
      drafts[i] = DraftProposal{};
    }
    if (static_cast<int>(drafts[i].tokens.size()) > room)
      drafts[i].tokens.resize(static_cast<size_t>(room));
    proposals[i] = drafts[i].tokens;
    if (!drafts[i].tokens.empty()) {
      who.push_back(i);
      expected.push_back(expected_tokens(drafts[i], s.acceptance.rate()));
    }
  }
  if (opt_.draft_max == 0 && !who.empty()) {
    const std::vector<int> k = choose_draft_lengths(expected, rows, cost_);
    for (size_t j = 0; j < who.size(); ++j) {
      DraftProposal& d = drafts[who[j]];
      d.tokens.resize(static_cast<size_t>(k[j]));
      if (d.q.size() > d.tokens.size()) d.q.resize(d.tokens.size());
    }
  }
  return drafts;
}

void Scheduler::run() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted, expired;
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !active_.empty(); });
      if (stop_) break;
      const double now = now_seconds();
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (now > (*it)->deadline) {
          expired.push_back(*it);
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      while (static_cast<int>(active_.size() + admitted.size()) < opt_.parallel &&
             !queue_.empty()) {
        admitted.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    for (auto& j : expired) {
      fail(j,
           ApiError(504, "the request waited in the queue past the server's time limit (--timeout)",
                    "timeout_error", std::nullopt, "timeout"));
    }
    for (auto& j : admitted) {
      if (j->cancelled()) {
        fail(j,
             ApiError(500, "the request was cancelled", "server_error", std::nullopt, "cancelled"));
        continue;
      }
      Slot s;
      if (admit(j, s)) active_.push_back(std::move(s));
    }
    update_gauges();
    step();
    update_gauges();
    if (active_.empty() && heat_stale_) publish_storage(true);  // the last pass's counts
  }
  const ApiError down(503, "the server is shutting down", "server_error", std::nullopt,
                      "shutting_down");
  for (auto& s : active_) {
    post(s);
    fail(s, down);
  }
  active_.clear();
  std::deque<std::shared_ptr<Job>> queued;
  {
    std::lock_guard<std::mutex> lock(m_);
    queued.swap(queue_);
  }
  for (auto& j : queued) fail(j, down);
}

bool Scheduler::publish(Job& job, const ResponseBuilder& response) {
  if (!job.req.chat || opt_.cache == 0) return false;
  std::optional<State> state;
  std::vector<int32_t> history;
  StopReason stop = StopReason::kNone;
  {
    std::lock_guard<std::mutex> lock(job.m_);
    if (job.phase_ != JobPhase::done || !job.state_) return false;
    state = std::move(job.state_);
    job.state_.reset();
    history = std::move(job.history_);
    stop = job.stop_;
  }
  bool kept = false;
  if (stop == StopReason::kEndOfTurn || stop == StopReason::kStopToken ||
      stop == StopReason::kLength || stop == StopReason::kContext) {
    try {
      // The answer as a client sends it back.
      json msg;
      msg["role"] = "assistant";
      msg["content"] = response.content();
      if (job.req.chat->thinking && !response.reasoning().empty())
        msg["reasoning_content"] = response.reasoning();
      if (!response.tool_calls().empty()) {
        json calls = json::array();
        for (const auto& c : response.tool_calls()) {
          calls.push_back({{"id", c.id},
                           {"type", "function"},
                           {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        msg["tool_calls"] = calls;
      }
      ChatRequest conv = *job.req.chat;
      conv.add_generation_prompt = false;
      conv.messages.push_back(
          ChatRequest::from_json(json{{"messages", json::array({msg})}}).messages.at(0));
      std::vector<int32_t> canon = render(conv, tok_).ids;
      if (auto feed = segment_completion(tok_, history, canon)) {
        cache_.put({std::move(canon), std::move(*state), std::move(history), std::move(*feed)});
        kept = true;
      }
    } catch (const std::exception& e) {
      log_debug("conversation state not kept: {}", e.what());
    }
  }
  metrics_.count_kept(kept);
  metrics_.set_cache_entries(static_cast<int64_t>(cache_.size()));
  return kept;
}

}  // namespace deltafin::server
