// The engine loop (see scheduler.h).
#include "server/scheduler.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "core/log.h"
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

Usage Job::usage() const {
  std::lock_guard<std::mutex> lock(m_);
  return usage_;
}

Scheduler::Scheduler(Model& model, const Tokenizer& tok, const SchedulerOptions& options,
                     Metrics& metrics)
    : model_(model), tok_(tok), opt_(options), metrics_(metrics), cache_(options.cache) {
  opt_.parallel = std::max(1, opt_.parallel);
  opt_.queue = std::max(0, opt_.queue);
  if (const char* d = std::getenv("DELTAFIN_DEBUG_STEP_DELAY_MS"); d != nullptr && *d) {
    step_delay_ms_ = std::clamp(std::atoi(d), 0, 60000);
    log_warn("DELTAFIN_DEBUG_STEP_DELAY_MS: every engine step is slowed by {} ms", step_delay_ms_);
  }
  publish_storage();
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::publish_storage() {
  uint64_t hits = 0, requested = 0;
  for (const auto& l : model_.prefetch_recall()) {
    hits += l.predicted_hits;
    requested += l.requested;
  }
  metrics_.set_storage(model_.experts().stats(), model_.trunk_stats(), hits, requested);
  // The heat map is layers x experts counters: copied a few times a second, not every pass.
  const double now = now_seconds();
  if (now - heat_published_ >= 0.25) {
    heat_published_ = now;
    metrics_.set_heat(model_.experts().heat());
  }
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
      throw ApiError(429,
                     fmt::format("the server is busy: {} requests running and {} waiting (the "
                                 "queue holds {}); retry later",
                                 active_count_.load(), queue_.size(), opt_.queue),
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
  slot.timings.arrived = job->arrived;
  slot.timings.admitted = now_seconds();
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

void Scheduler::finish(Slot& s) {
  const Generation& g = *s.gen;
  Usage usage;
  usage.cached_tokens = s.cached;
  usage.prompt_tokens = s.cached + static_cast<int64_t>(s.input.size());
  usage.completion_tokens = static_cast<int64_t>(g.tokens().size());
  usage.timings = s.timings;
  usage.timings.finished = now_seconds();
  metrics_.count_finished(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens);
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->usage_ = usage;
    s.job->stop_ = g.stop_reason();
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
      fail(s.job,
           ApiError(500, "the request was cancelled", "server_error", std::nullopt, "cancelled"));
      drop[i] = true;
    } else if (now > s.job->deadline) {
      s.gen->cancel();
      post(s);
      fail(s.job,
           ApiError(504, "the request did not finish within the server's time limit (--timeout)",
                    "timeout_error", std::nullopt, "timeout"));
      drop[i] = true;
    }
  }
  std::vector<SequenceInput> seqs;
  std::vector<size_t> in_pass;
  int64_t rows = 0, prompt_rows = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (drop[i]) continue;
    auto in = active_[i].gen->next_input();
    if (in.empty()) {  // finished without a pass (cannot happen for a fresh generation)
      finish(active_[i]);
      drop[i] = true;
      continue;
    }
    seqs.push_back({&active_[i].state, in, false, nullptr});
    in_pass.push_back(i);
    rows += static_cast<int64_t>(in.size());
    if (active_[i].gen->in_prefill()) prompt_rows += static_cast<int64_t>(in.size());
  }
  if (!seqs.empty()) {
    Stopwatch sw;
    std::vector<float> logits;
    bool ok = true;
    try {
      logits = model_.forward(seqs);
    } catch (const std::exception& e) {
      ok = false;
      log_warn("forward pass over {} sequences failed: {}", seqs.size(), e.what());
      for (size_t i : in_pass) {
        active_[i].gen->abort();
        fail(active_[i].job,
             ApiError(500, fmt::format("the forward pass failed: {}", e.what()), "server_error"));
        drop[i] = true;
      }
    }
    if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
    const double seconds = sw.elapsed();
    int64_t generated = 0;
    if (ok) {
      const int64_t vocab = model_.config().vocab;
      for (size_t k = 0; k < in_pass.size(); ++k) {
        Slot& s = active_[in_pass[k]];
        std::span<float> l(logits.data() + static_cast<ptrdiff_t>(k) * vocab,
                           static_cast<size_t>(vocab));
        for (const auto& [id, bias] : s.job->req.logit_bias) l[static_cast<size_t>(id)] += bias;
        const size_t before = s.gen->tokens().size();
        try {
          s.gen->on_logits(l);
        } catch (const std::exception& e) {
          s.gen->abort();
          fail(s.job,
               ApiError(500, fmt::format("generation failed: {}", e.what()), "server_error"));
          drop[in_pass[k]] = true;
          continue;
        }
        generated += static_cast<int64_t>(s.gen->tokens().size() - before);
        if (before == 0 && !s.gen->tokens().empty()) s.timings.first_token = now_seconds();
        post(s);
        if (s.gen->finished()) {
          finish(s);
          drop[in_pass[k]] = true;
        }
      }
    }
    metrics_.count_pass(rows, prompt_rows, generated, static_cast<int64_t>(seqs.size()), seconds);
    publish_storage();
  }
  std::vector<Slot> keep;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (!drop[i]) keep.push_back(std::move(active_[i]));
  }
  active_.swap(keep);
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
    if (active_.empty()) metrics_.set_heat(model_.experts().heat());  // the last pass's counts
  }
  const ApiError down(503, "the server is shutting down", "server_error", std::nullopt,
                      "shutting_down");
  for (auto& s : active_) fail(s.job, down);
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
