/* The C API from C: this file is compiled as C99 with -pedantic (so the header stays valid C)
 * and run by CTest twice: against the build tree, and by tests/install_test.sh against a
 * `cmake --install` prefix through pkg-config. It loads a model, checks the ABI, evaluates a
 * few ids, generates greedily with a callback that stops after three tokens, and checks that a
 * missing folder is an error with a message.
 *   usage: capi_c_test MODEL_DIR */
#include <deltafin/deltafin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int stop_after_three(const deltafin_token_event* ev, void* user) {
  int* n = (int*)user;
  ++*n;
  return ev->index >= 2;
}

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "line %d: %s failed: %s\n", __LINE__, #cond, deltafin_last_error()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

int main(int argc, char** argv) {
  deltafin_model* m = NULL;
  deltafin_model_params p;
  deltafin_session* s = NULL;
  deltafin_sampling_params sp;
  const int32_t ids[] = {5, 17, 200};
  float* logits;
  char* result = NULL;
  int calls = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  CHECK(deltafin_abi_version() == DELTAFIN_ABI_VERSION);
  CHECK(deltafin_model_load("/nonexistent/model", NULL, &m) == DELTAFIN_ERR_ARGUMENT);
  CHECK(strstr(deltafin_last_error(), "/nonexistent/model") != NULL);
  deltafin_model_params_init(&p);
  p.threads = 1;
  p.memory_budget = (uint64_t)1 << 30;
  p.ctx = 256;
  CHECK(deltafin_model_load(argv[1], &p, &m) == DELTAFIN_OK);
  CHECK(deltafin_session_new(m, &s) == DELTAFIN_OK);
  logits = (float*)malloc(sizeof(float) * (size_t)deltafin_model_vocab(m));
  CHECK(logits != NULL);
  CHECK(deltafin_session_eval(s, ids, 3, 0, logits) == DELTAFIN_OK);
  CHECK(deltafin_session_position(s) == 3);
  deltafin_sampling_params_init(&sp);
  sp.max_new_tokens = 20;
  CHECK(deltafin_session_generate(s, ids, 1, &sp, stop_after_three, &calls, &result) ==
        DELTAFIN_OK);
  CHECK(calls == 3);
  CHECK(strstr(result, "\"stop_reason\":\"cancelled\"") != NULL);
  printf("%s\n", result);
  deltafin_free(result);
  free(logits);
  deltafin_session_free(s);
  deltafin_model_free(m);
  return 0;
}
