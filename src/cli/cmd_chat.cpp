// `deltafin chat`: an interactive multi-turn session on one kept model state (each turn costs
// only its new tokens). Line editing and history come from libedit when stdin is a terminal;
// otherwise lines are read from stdin as they are (scripts, tests). Ctrl-C stops the current
// answer (kept, with its exact ids); Ctrl-C at the prompt, Ctrl-D or /quit end the session. A
// failing command (/save to a bad path, /load of a bad file) prints its error and the session
// goes on: nothing typed at the prompt ends a conversation but the commands that say so.
#include <editline/readline.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/error_text.h"
#include "cli/gen_options.h"
#include "cli/trace_option.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "generate/chat_session.h"
#include "generate/driver.h"
#include "runtime/sequence.h"

namespace deltafin::cli {

namespace {
struct ChatArgs {
  EngineOptions engine;
  std::string trace;  // --trace FILE
  GenOptions gen;
  StateCacheSettings state_cache;
  std::string system, think = "on", effort = "max";
};

const char* kHelp =
    "commands: /reset  /retry  /stats  /system TEXT  /image FILE  /save FILE  /load FILE  "
    "/effort low|high|max  /think on|off  /help  /quit";

// SIGINT while waiting at the prompt: without SA_RESTART the read returns (EINTR) and the
// session ends cleanly instead of the process being killed.
std::atomic<bool> g_prompt_interrupted{false};
extern "C" void on_prompt_sigint(int) {
  g_prompt_interrupted.store(true);
}

bool read_line(bool tty, std::string& line) {
  struct sigaction sa {};
  sa.sa_handler = on_prompt_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  struct sigaction old {};
  sigaction(SIGINT, &sa, &old);
  struct Restore {
    struct sigaction* old;
    ~Restore() { sigaction(SIGINT, old, nullptr); }
  } restore{&old};
  if (g_prompt_interrupted.load()) return false;
  if (tty) {
    char* l = ::readline("> ");
    if (l == nullptr || g_prompt_interrupted.load()) {
      std::free(l);
      return false;
    }
    line = l;
    if (!line.empty()) ::add_history(l);
    std::free(l);
    return true;
  }
  return static_cast<bool>(std::getline(std::cin, line)) && !g_prompt_interrupted.load();
}

const char* plural(int64_t n) {
  return n == 1 ? "" : "s";
}

void run_chat(ChatArgs& a) {
  if (a.think != "on" && a.think != "off") fail_usage("--think {}: expected on or off", a.think);
  a.engine.model = resolve_model_dir(a.engine.model);
  apply_generation_config(a.gen, a.engine.model);
  // auto: passes of up to the context, as the budget allows
  LoadRequest req = load_request(a.engine, a.gen.draft, a.gen.prefill_chunk);
  req.state_cache = a.state_cache;
  req.tokenizer = NeedTokenizer::kRequired;
  req.who = "chat";
  LoadedEngine engine = load_engine(std::move(req));
  auto& model = engine.model;
  const Tokenizer& tok = *engine.tokenizer;
  // A bad --grammar-file / --json-schema ends the command here, not each turn (compiled grammars
  // are cached, so the turns reuse this one).
  constraint_for(a.gen, &tok, true, a.think == "on" ? Channel::think : Channel::response);
  note_demo_drafter(a.engine.model, engine.draft);
  a.gen.prefill_rows = model->pass_plan().pass_rows;
  ChatSession session(*model, tok);
  session.set_image_measurer(image_measurer(engine.vision.get()));
  std::vector<ChatImage> attached;  // /image: for the next user message
  // One drafter and one draft-length state for the session: the acceptance it learned and the
  // pass costs it measured carry over from turn to turn.
  std::unique_ptr<Drafter> drafter;
  DraftConfig draft = engine.draft_config(drafter);
  session.set_system(a.system);
  session.set_effort(a.effort);
  session.set_thinking(a.think == "on");
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty) fmt::print(stderr, "deltafin chat on {} — {}\n", a.engine.model, kHelp);
  std::optional<RunStats> last;
  int64_t turns = 0, total_prefill = 0, total_reused = 0, total_generated = 0;
  PrefixStore* store = engine.store.get();
  // One turn: continue from the kept state or the prefix store (only the rest is prefilled),
  // generate, keep its snapshots (prefix/reuse.h).
  auto run_turn = [&](const ChatTurn& turn) {
    GenerationParams params = make_params(a.gen, *model, &tok, /*chat=*/true);
    if (model->plan()) params.context_limit = model->plan()->context;
    params.start_channel = turn.start;
    params.constraint = constraint_for(a.gen, &tok, true, turn.start);
    draft.stats = DraftStats{};
    const auto history = session.history();
    Sequence seq(*model, &tok, store,
                 {std::vector<int32_t>(history.begin(), history.end()),
                  PromptMarks{turn.system_end, turn.messages_end},
                  params,
                  {},
                  0,
                  turn.images,
                  engine.vision.get()},
                 SequenceDrafter(draft), &session.state(), /*record_stats=*/true);
    Printer printer(a.gen, true, false);
    interrupted().store(false);
    install_sigint();
    seq.drive(&interrupted(), [&](Generation& g) { printer.on_step(g); });
    std::signal(SIGINT, SIG_DFL);
    printer.finish();
    session.end_turn(seq.gen());
    seq.finish(session.consumed());
    const RunStats s = seq.run_stats();
    ++turns;
    total_prefill += s.prompt_tokens;
    total_reused += s.reused_tokens;
    total_generated += s.completion_tokens;
    if (a.gen.stats) {
      fmt::print(stderr, "{}{}\n",
                 turn.full_prefill && s.reused_tokens == 0
                     ? "[stats] full prefill of the conversation\n"
                     : "",
                 s.summary());
    }
    last = s;
  };
  std::string line;
  while (read_line(tty, line)) {
    if (line.empty()) continue;
    try {
      if (line[0] == '/') {
        try {
          std::string cmd = line.substr(0, line.find(' '));
          std::string arg = line.size() > cmd.size() ? line.substr(cmd.size() + 1) : "";
          if (cmd == "/quit" || cmd == "/exit") break;
          if (cmd == "/help") {
            fmt::print(stderr, "{}\n", kHelp);
          } else if (cmd == "/retry") {
            run_turn(session.begin_retry());
          } else if (cmd == "/reset") {
            session.reset();
            attached.clear();
            fmt::print(stderr, "conversation cleared\n");
          } else if (cmd == "/image") {
            if (arg.empty()) fail_arg("/image needs a file name");
            if (!engine.vision)
              fail_arg("/image {}: this model has no vision tower, so it cannot take images", arg);
            ChatImage img = read_image_part(arg);
            // Checked now (headers only), so a bad file is refused before the message is typed.
            vision::ImageInfo info;
            const auto plan = engine.vision->plan(
                std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(img.bytes->data()),
                                         img.bytes->size()),
                arg, &info);
            attached.push_back(std::move(img));
            fmt::print(stderr, "image {} ({}x{}, {} tokens) attached to the next message\n", arg,
                       info.width, info.height, plan.num_tokens);
          } else if (cmd == "/system") {
            session.set_system(arg);
            fmt::print(stderr, "system prompt {}\n", arg.empty() ? "cleared" : "set");
          } else if (cmd == "/effort") {
            session.set_effort(arg);
            fmt::print(stderr, "reasoning effort {}\n", arg);
          } else if (cmd == "/think") {
            if (arg != "on" && arg != "off") fail_arg("/think {}: expected on or off", arg);
            session.set_thinking(arg == "on");
            fmt::print(stderr, "thinking {}\n", arg);
          } else if (cmd == "/save") {
            if (arg.empty()) fail_arg("/save needs a file name");
            write_file_atomic(arg, session.to_json().dump(2) + "\n");
            fmt::print(stderr, "saved to {}\n", arg);
          } else if (cmd == "/load") {
            if (arg.empty()) fail_arg("/load needs a file name");
            session.load_json(parse_ordered_json(read_file(arg), arg));
            fmt::print(stderr, "loaded {} ({} tokens); the next turn {}\n", arg,
                       session.history_tokens(),
                       store != nullptr
                           ? "continues from the longest kept snapshot of them, prefilling the rest"
                           : "prefills them all: no state cache");
          } else if (cmd == "/stats") {
            if (last) fmt::print(stderr, "{}\n", last->summary());
            fmt::print(
                stderr,
                "[session] {} turn{}, {} tokens prefilled, {} reused, {} generated, {} in the "
                "conversation\n",
                turns, plural(turns), total_prefill, total_reused, total_generated,
                session.history_tokens());
          } else {
            fmt::print(stderr, "unknown command {} ({})\n", cmd, kHelp);
          }
        } catch (const std::exception& e) {
          // A command that fails (a bad path, an unreadable file) never ends the session.
          fmt::print(stderr, "error: {}\n", error_text(e));
        }
        continue;
      }
      const ChatTurn turn = session.begin_user_turn(line, attached);
      attached.clear();
      run_turn(turn);
    } catch (const InvalidArgument& e) {
      const bool full = std::string(e.what()).find("context") != std::string::npos;
      fmt::print(
          stderr, "error: {}{}\n", error_text(e),
          full ? " (the conversation is full: /reset starts a new one, /save keeps it)" : "");
    }
  }
  if (g_prompt_interrupted.load()) fmt::print(stderr, "\ninterrupted: leaving the chat\n");
}
}  // namespace

void register_chat(CLI::App& app) {
  auto [cmd, a] = add_traced_engine_command<ChatArgs>(
      app, "chat", "Interactive multi-turn chat that keeps the model state between turns",
      run_chat);
  cmd->add_option("--system", a->system, "System message");
  cmd->add_option("--think", a->think, "Thinking channel: on or off")->capture_default_str();
  cmd->add_option("--effort", a->effort, "Reasoning effort: low, high or max")
      ->capture_default_str()
      ->check(CLI::IsMember({"low", "high", "max"}));
  add_gen_options(cmd, a->gen);
  add_state_cache_options(cmd, a->state_cache);
}

}  // namespace deltafin::cli
