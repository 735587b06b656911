// The engine loop (see scheduler.h).
#include "server/scheduler.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "core/test_hooks.h"
#include "core/timer.h"
#include "core/trace.h"

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

void Job::when_settled(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (phase_ != JobPhase::done && phase_ != JobPhase::failed) {
      on_settled_ = std::move(f);
      return;
    }
  }
  f();
}

void Job::settled() {
  std::function<void()> f;
  {
    std::lock_guard<std::mutex> lock(m_);
    f.swap(on_settled_);
  }
  try {
    if (f) f();
  } catch (const std::exception& e) {
    log_warn("[serve] after a request ended: {}", e.what());
  }
}

Scheduler::Scheduler(Model& model, const Tokenizer& tok, const SchedulerOptions& options,
                     Metrics& metrics)
    : model_(model),
      tok_(tok),
      opt_(options),
      metrics_(metrics),
      cost_(PassCostModel::for_model(model)) {
  opt_.parallel = std::max(1, opt_.parallel);
  opt_.queue = std::max(0, opt_.queue);
  step_delay_ms_ = debug_step_delay_ms();  // test hooks (core/test_hooks.h)
  if (const char* t = test_hook_env("DELTAFIN_DEBUG_SCRIPT")) {
    script_ = tok_.encode_with_special(t);
    log_warn(
        "DELTAFIN_DEBUG_SCRIPT: every answer is forced to a scripted {} tokens, not the model's",
        script_.size());
  }
  publish_storage();
  thread_ = std::thread([this] {
    trace_thread_name("scheduler");
    run();
  });
}

void Scheduler::force_script(const Generation& g, std::span<float> row) const {
  const size_t i = g.tokens().size();  // the token this row samples
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
  if (opt_.store != nullptr) metrics_.set_prefix(opt_.store->stats());
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
  job->settled();
}

void Scheduler::update_gauges() {
  active_count_.store(static_cast<int64_t>(active_.size()));
  std::lock_guard<std::mutex> lock(m_);
  metrics_.set_gauges(static_cast<int64_t>(queue_.size()), static_cast<int64_t>(active_.size()));
}

bool Scheduler::admit(const std::shared_ptr<Job>& job, Slot& slot) {
  const ServeRequest& r = job->req;
  slot.job = job;
  SequenceDrafter drafter;
  try {
    if (opt_.new_drafter) drafter = SequenceDrafter(opt_.new_drafter(), opt_.draft_max);
  } catch (const std::exception& e) {
    fail(job,
         ApiError(500, fmt::format("could not start the drafter: {}", e.what()), "server_error"));
    return false;
  }
  try {
    // Continues from the deepest kept snapshot of this prompt (prefix/reuse.h): only the rest
    // is prefilled.
    SequenceSpec spec{r.prompt, PromptMarks{r.system_end, r.messages_end, r.last_message}, r.params,
                      r.logit_bias, job->arrived};
    spec.images = r.images;
    spec.vision = opt_.vision;
    slot.seq =
        std::make_unique<Sequence>(model_, &tok_, opt_.store, std::move(spec), std::move(drafter));
    if (const ImageEncodeStats& is = slot.seq->image_stats(); is.images > 0)
      metrics_.count_images(is.images, is.tokens, is.encoded, is.encoded_tokens, is.seconds);
    const Restored& how = slot.seq->restored();
    if (how.position > 0) {
      log_debug("[serve] continuing a kept prefix of {} tokens from {} ({:.3f} s){}", how.position,
                how.where(), how.seconds,
                slot.seq->drafter() && slot.seq->drafter()->keeps_state() && !how.with_draft
                    ? "; the drafter has no state for it"
                    : "");
    }
  } catch (const InvalidArgument& e) {
    // A bad image (decoded here, once, by the encoder) is named by its part, the client's path.
    std::optional<std::string> param;
    const std::string_view msg = e.what();
    for (const PromptImage& img : r.images) {
      if (!img.name.empty() && msg.starts_with(img.name + ":")) param = img.name;
    }
    fail(job, ApiError(400, e.what(), "invalid_request_error", param));
    return false;
  } catch (const std::bad_alloc&) {
    // Out of memory for this sequence's state: refuse this request, keep serving the others.
    slot.seq.reset();
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
  {
    std::lock_guard<std::mutex> lock(job->m_);
    job->phase_ = JobPhase::running;
  }
  job->cv_.notify_all();
  return true;
}

void Scheduler::post(Slot& s) {
  StepUpdate u;
  Generation& g = s.seq->gen();
  u.events = g.take_events();
  const auto& toks = g.tokens();
  u.tokens.assign(toks.begin() + static_cast<ptrdiff_t>(s.sent), toks.end());
  s.sent = toks.size();
  if (u.events.empty() && u.tokens.empty()) return;
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->updates_.push_back(std::move(u));
  }
  s.job->cv_.notify_all();
}

void Scheduler::fail(Slot& s, const ApiError& e) {
  // A request ended by its timeout, a cancellation or shutdown still used what it used (the log
  // line and the stream's usage count its tokens).
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->usage_ = s.seq->usage();
  }
  fail(s.job, e);
}

void Scheduler::finish(Slot& s) {
  if (heat_stale_) publish_storage(true);
  const Generation& g = s.seq->gen();
  const Usage usage = s.seq->usage();
  metrics_.count_finished(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens);
  {
    std::lock_guard<std::mutex> lock(s.job->m_);
    s.job->usage_ = usage;
    s.job->stop_ = g.stop_reason();
    s.job->stop_string_ = g.stop_string();
    s.job->phase_ = JobPhase::done;
  }
  s.job->cv_.notify_all();
  s.job->settled();
  // The state after the answer as the model wrote it, for a client that sends it back verbatim.
  s.seq->finish();
}

void Scheduler::step() {
  const double now = now_seconds();
  std::vector<bool> drop(active_.size(), false);
  for (size_t i = 0; i < active_.size(); ++i) {
    Slot& s = active_[i];
    Generation& g = s.seq->gen();
    if (s.job->cancelled()) {
      g.cancel();
      fail(s,
           ApiError(500, "the request was cancelled", "server_error", std::nullopt, "cancelled"));
      drop[i] = true;
    } else if (now > s.job->deadline) {
      g.cancel();
      post(s);
      fail(s, ApiError(504, "the request did not finish within the server's time limit (--timeout)",
                       "timeout_error", std::nullopt, "timeout"));
      drop[i] = true;
    } else if (g.next_input().empty()) {  // finished without a pass (not for a fresh one)
      finish(s);
      drop[i] = true;
    }
  }
  // One round over every live sequence: decoding rows first, prompt rows fill what the pass
  // plan leaves (generate/round.h).
  std::vector<RoundSequence> seqs;
  std::vector<size_t> slot_of;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (drop[i]) continue;
    seqs.push_back(active_[i].seq->round_entry(
        script_.empty()
            ? std::function<void(const Generation&, std::span<float>)>()
            : [this](const Generation& g, std::span<float> row) { force_script(g, row); }));
    slot_of.push_back(i);
  }
  if (seqs.empty()) {
    compact(drop);
    return;
  }
  heat_stale_ = true;  // even a pass that throws may have counted expert lookups
  const RoundReport rep = run_round(model_, seqs, opt_.pass_rows, &cost_);
  if (!rep.ran) {
    compact(drop);
    return;
  }
  if (rep.failure) {
    try {
      std::rethrow_exception(rep.failure);
    } catch (const std::exception& e) {
      log_warn("forward pass over {} sequences failed: {}", rep.sequences, e.what());
    }
  }
  if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
  for (size_t k = 0; k < seqs.size(); ++k) {
    const RoundSequence& r = seqs[k];
    if (!r.in_pass) continue;
    Slot& s = active_[slot_of[k]];
    if (r.error) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(r.error);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      fail(s,
           ApiError(500, (rep.failure ? "the forward pass failed: " : "generation failed: ") + what,
                    "server_error"));
      drop[slot_of[k]] = true;
      continue;
    }
    // A prefill pass that reached a cut (or ended a long stretch) is kept (prefix/reuse.h).
    s.seq->after_pass();
    post(s);
    if (s.seq->gen().finished()) {
      finish(s);
      drop[slot_of[k]] = true;
    }
  }
  metrics_.count_pass(rep.rows, rep.prompt_rows, rep.generated, rep.sequences,
                      rep.seconds + static_cast<double>(step_delay_ms_) / 1000.0);
  if (opt_.new_drafter)
    metrics_.count_drafts(rep.proposed, rep.accepted, rep.decode_sequences, rep.decode_tokens);
  publish_storage();
  compact(drop);
}

void Scheduler::compact(const std::vector<bool>& drop) {
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

}  // namespace deltafin::server
