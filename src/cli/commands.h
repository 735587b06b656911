// The `deltafin` subcommands. Each cmd_*.cpp file adds one subcommand to the app; main.cpp
// lists them. A subcommand's callback throws deltafin::Error on failure; main prints it as one
// line ("deltafin: <message>") and exits 1.
#pragma once

#include <CLI/CLI.hpp>

namespace deltafin::cli {

// Adds every subcommand (commands.cpp lists them in help order).
void register_all(CLI::App& app);

void register_inspect(CLI::App& app);
void register_logits(CLI::App& app);
void register_propose(CLI::App& app);  // cmd_propose.cpp
void register_make_model(CLI::App& app);
void register_bench(CLI::App& app);
void register_place(CLI::App& app);  // cmd_place.cpp
void register_run(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_chat(CLI::App& app);
void register_serve(CLI::App& app);   // cmd_serve.cpp
void register_doctor(CLI::App& app);  // cmd_doctor.cpp (+ doctor_text.cpp)
void register_pull(CLI::App& app);    // cmd_pull.cpp (+ hub.cpp, fetch.cpp)
// `deltafin tokenize` (cmd_tokenize.cpp) and `deltafin render` (cmd_render.cpp).
void register_tokenize(CLI::App& app);
void register_render(CLI::App& app);
// `deltafin embed-image` (cmd_embed_image.cpp): the vision tower over one image.
void register_embed_image(CLI::App& app);

}  // namespace deltafin::cli
