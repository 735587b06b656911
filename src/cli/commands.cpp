#include "cli/commands.h"

namespace deltafin::cli {

void register_all(CLI::App& app) {
  register_run(app);
  register_chat(app);
  register_serve(app);
  register_doctor(app);
  register_pull(app);
  register_logits(app);
  register_propose(app);
  register_inspect(app);
  register_make_model(app);
  register_bench(app);
  register_place(app);
  register_perplexity(app);
  register_tokenize(app);
  register_render(app);
  register_embed_image(app);
}

}  // namespace deltafin::cli
