// The engine side of the server: one thread owns the Model and runs every generation
// (docs/SERVER.md, "Scheduling").
//
// HTTP threads submit validated Jobs into a bounded FIFO queue (full: 429). The engine loop
// admits queued jobs while fewer than `parallel` sequences are active; each step gathers the
// next input of every active Generation (prompt chunks and last tokens, mixed) into ONE
// Model::forward, so the trunk is read once per step and an expert chosen by several sequences
// is fetched and applied once for all. Each sequence's events and tokens are posted to its Job,
// whose HTTP thread waits on the job's condition variable (streams see tokens as sampled).
//
// Isolation: a job that was cancelled (its client went away) or ran past its deadline is ended
// at the start of the next step, so its slot is free for the step after. An exception in one
// sequence's work fails that job only; a failing forward pass (an IoError from the expert store,
// say) fails the jobs of that pass — their states are no longer trustworthy — and the loop goes
// on with the others and the queue.
//
// Speculative decoding (serve --draft): each decoding sequence's drafter proposes, the
// draft-length choice splits the pass's rows among them (draft_length.h), and the step's one
// forward pass carries every sequence's [last token, drafts] in deferred mode; each sequence's
// rows go through accept_rows and its state is committed by the rows it consumed. Drafts never
// change a sequence's output, and one sequence's drafts cannot touch another's state.
//
// State reuse (prefix/reuse.h): at admission a job continues from the deepest snapshot of its
// prompt in the prefix store, so only the rest is prefilled; its prefill passes end at the
// positions the policy snapshots (the end of the messages, a long system prompt) and the state
// after the answer is kept when it ends. Every surface (chat and raw completions, any client)
// reuses the same way, because a snapshot is keyed by the token ids its state consumed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "generate/draft_length.h"
#include "generate/round.h"
#include "generate/speculative.h"
#include "model/model.h"
#include "runtime/sequence.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/response.h"

namespace deltafin::server {

enum class JobPhase { queued, running, done, failed };

class Job {
 public:
  Job(ServeRequest request, double deadline, double arrived)
      : req(std::move(request)), deadline(deadline), arrived(arrived) {}

  const ServeRequest req;
  const double deadline;  // now_seconds() clock
  const double arrived;   // same clock: when the HTTP thread accepted it

  // Asks the engine to end the job at its next step (client gone, handler gave up).
  void cancel() { cancel_requested.store(true); }
  bool cancelled() const { return cancel_requested.load(); }

  struct Snapshot {
    JobPhase phase = JobPhase::queued;
    std::vector<StepUpdate> updates;
    std::optional<ApiError> error;
  };
  // Waits up to `wait` for updates or a phase other than `seen`, and takes the updates.
  Snapshot take(std::chrono::milliseconds wait, JobPhase seen);

  // Valid once the phase is done.
  StopReason stop() const;
  std::string stop_string() const;  // the stop string that matched (StopReason::kStopString)
  Usage usage() const;
  // Runs `f` once the job has ended (done or failed, its usage final): now when it has, else on
  // the thread that ends it (the engine's, at its next step after a cancel). The server's log
  // line goes through it, so a cancelled request logs what it used, not what was counted yet.
  void when_settled(std::function<void()> f);

 private:
  friend class Scheduler;
  // The scheduler ended the job (phase done or failed): runs when_settled's function.
  void settled();
  std::atomic<bool> cancel_requested{false};
  mutable std::mutex m_;
  std::condition_variable cv_;
  JobPhase phase_ = JobPhase::queued;
  std::vector<StepUpdate> updates_;
  std::optional<ApiError> error_;
  StopReason stop_ = StopReason::kNone;
  std::string stop_string_;
  Usage usage_;
  std::function<void()> on_settled_;
};

struct SchedulerOptions {
  int parallel = 1;
  int queue = 16;
  PrefixStore* store = nullptr;  // the prefix store (null: no reuse)
  // Speculative decoding: a new drafter for each sequence (empty: none; runtime/load.h's
  // LoadedEngine::drafter_factory) and the most drafts per sequence and pass.
  std::function<std::unique_ptr<Drafter>()> new_drafter;
  DraftMax draft_max;
  // Rows one forward pass may hold (the pass plan's, with --prefill-chunk auto): prompt rows
  // fill what decoding leaves. 0: no cap (each prompt brings its own --prefill-chunk rows).
  int64_t pass_rows = 0;
  // The model's vision tower (LoadedEngine::vision; null: text only): a sequence encodes its
  // request's images with it.
  const VisionEncoder* vision = nullptr;
};

class Scheduler {
 public:
  Scheduler(Model& model, const Tokenizer& tok, const SchedulerOptions& options, Metrics& metrics);
  ~Scheduler();  // stop()s

  // Queues a job; throws ApiError 429 when the queue is full, 503 when shutting down.
  void submit(const std::shared_ptr<Job>& job);
  // Cancels a job: a queued one leaves the queue now, a running one ends at the next step.
  void cancel(const std::shared_ptr<Job>& job);
  // Fails queued and active jobs (503) and ends the engine thread.
  void stop();

 private:
  struct Slot {
    std::shared_ptr<Job> job;
    std::unique_ptr<Sequence> seq;  // its generation, drafter, state and reuse
    size_t sent = 0;                // tokens posted to the job
  };

  void run();
  bool admit(const std::shared_ptr<Job>& job, Slot& slot);
  void step();
  // Drops the slots marked in `drop` from the active set.
  void compact(const std::vector<bool>& drop);
  void post(Slot& s);
  void finish(Slot& s);
  void fail(const std::shared_ptr<Job>& job, const ApiError& e);
  void fail(Slot& s, const ApiError& e);  // records the slot's usage first
  void update_gauges();
  // The model's storage counters -> metrics; the heat map too when `with_heat` or when it was
  // last copied over a quarter second ago.
  void publish_storage(bool with_heat = false);

  Model& model_;
  const Tokenizer& tok_;
  SchedulerOptions opt_;
  Metrics& metrics_;
  PassCostModel cost_;

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::atomic<int64_t> active_count_{0};
  std::vector<Slot> active_;   // engine thread only
  double heat_published_ = 0;  // when the per-expert counters were last copied to metrics
  // A pass ran since the heat map was last copied: finish() copies it before it completes a
  // request, so what a client reads after its response holds that response's passes.
  bool heat_stale_ = true;
  // A test hook (core/test_hooks.h): DELTAFIN_DEBUG_STEP_DELAY_MS slows every step, e.g. to try
  // the page against a server as slow as K3 on real hardware (0.2 tokens/s is 5000).
  int step_delay_ms_ = 0;
  // Test-only: DELTAFIN_DEBUG_SCRIPT=TEXT (K3 markers allowed) forces every answer to those
  // tokens, so tests can drive real clients through a whole turn (text that ends, tool calls)
  // with the tiny random model. Never set in real use: it overrides the model's choice.
  std::vector<int32_t> script_;
  void force_script(const Generation& g, std::span<float> row) const;
  std::thread thread_;
};

}  // namespace deltafin::server
