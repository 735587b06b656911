/* deltafin.h: the stable C API of Deltafin (libdeltafin.so).
 *
 * Why it is built this way: programs in any language (Python through ctypes, Rust, Go, C#)
 * bind a C ABI, not C++. So every object is an opaque handle, every option struct starts with
 * its own size (fields are only ever appended, and the library reads only the fields the caller
 * knows), and the request and response shapes that are already specified elsewhere (the
 * OpenAI-compatible server's request bodies and responses, `deltafin run --json`) travel as JSON
 * text instead of being re-declared as structs. No C++ exception crosses this boundary: every
 * call that can fail returns a deltafin_status and leaves a message that names what was wrong
 * (deltafin_last_error). There is no process-wide model state: any number of models and
 * sessions may live in one process; each model runs on its own threads.
 *
 * Ownership: strings and arrays the library returns through `char**` / `int32_t**` out
 * parameters belong to the caller, who releases them with deltafin_free(). Handles are released
 * with their own *_free function (NULL is accepted and ignored). Strings passed in are read
 * during the call only.
 *
 * Thread safety: the library is thread-safe at the level of handles. A model may be used from
 * several threads at once (its forward passes are serialised by a lock inside the model; two
 * models run truly in parallel). A session, chat or stream handle must be used by one thread at
 * a time. deltafin_last_error() is per thread. Freeing is safe from any thread at any time: a
 * call in progress on the freed handle (or on a handle made from a freed model or chat) stops
 * at its next forward pass with DELTAFIN_ERR_ARGUMENT, and the memory is released when the last
 * call using it has returned; a call made with a handle already freed fails with
 * DELTAFIN_ERR_ARGUMENT ("not a live handle") instead of reading freed memory (unless the
 * library has since given the same address to a new handle: do not keep freed handles).
 *
 * ABI: DELTAFIN_ABI_VERSION changes only when an existing function or struct field changes
 * meaning or layout; additions keep it. deltafin_abi_version() is what the loaded library
 * implements: a binding should refuse a library whose ABI version differs from the header's.
 */
#ifndef DELTAFIN_DELTAFIN_H
#define DELTAFIN_DELTAFIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DELTAFIN_API __attribute__((visibility("default")))
#else
#define DELTAFIN_API
#endif

/* The ABI this header describes, and the library release it came with. */
#define DELTAFIN_ABI_VERSION 1
#define DELTAFIN_API_VERSION_MAJOR 0
#define DELTAFIN_API_VERSION_MINOR 1
#define DELTAFIN_API_VERSION_PATCH 0

/* Thread-safe, no failure. */
DELTAFIN_API int deltafin_abi_version(void);
/* The library's release, e.g. "0.1.0" (a static string, do not free). */
DELTAFIN_API const char* deltafin_version(void);

typedef enum deltafin_status {
  DELTAFIN_OK = 0,
  DELTAFIN_ERR_ARGUMENT = 1, /* a bad argument, option or request field (the message names it) */
  DELTAFIN_ERR_IO = 2,       /* a file could not be read: missing, short, replaced */
  DELTAFIN_ERR_MODEL = 3,    /* the engine refused: corrupt checkpoint, budget too small, ... */
  DELTAFIN_ERR_CONTEXT = 4,  /* the tokens do not fit in the context */
  DELTAFIN_ERR_MEMORY = 5,   /* out of memory */
  DELTAFIN_ERR_INTERNAL = 6  /* anything else (a bug: please report the message) */
} deltafin_status;

/* The message of the last call that failed on this thread ("" if none). Valid until the next
 * failing call on this thread; do not free. */
DELTAFIN_API const char* deltafin_last_error(void);
/* Releases memory the library returned through an out parameter. NULL is ignored. */
DELTAFIN_API void deltafin_free(void* p);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------ */

typedef struct deltafin_model deltafin_model;

/* Engine options: the CLI's engine flags (see README "Engine options"). Initialise with
 * deltafin_model_params_init() and then set fields; new fields (draft settings among them) are
 * appended, and struct_size tells the library which ones the caller has. */
typedef struct deltafin_model_params {
  size_t struct_size;       /* sizeof(deltafin_model_params), set by deltafin_model_params_init */
  int32_t threads;          /* compute threads of this model's own pool; 0 = one per core */
  const char* kernels;      /* NULL/"" = best for this CPU; "scalar", "avx2", "avx512", "neon".
                               The kernel table is process-wide: a model asking for a different
                               one while another model is loaded is refused */
  uint64_t memory_budget;   /* bytes; 0 = 75% of RAM or of the cgroup limit */
  int32_t mmap;             /* 1 = map the shards, no budget and no expert store */
  const char* cache_policy; /* NULL = "lru"; "lfu", "pinned" */
  int32_t readers;          /* reader threads for expert and trunk reads (default 4) */
  int32_t prefetch;         /* 1 (default) = predict and read the next layer's experts ahead */
  int32_t direct_io;        /* 1 (default) = O_DIRECT reads; 0 = through the page cache */
  const char* trunk;        /* NULL = "bf16"; "int8" is LOSSY (see README) */
  int64_t ctx;              /* context positions per sequence to plan for; 0 = min(model, 8192) */
  int32_t sequences;        /* states to plan memory for (sessions alive at once; default 1) */
  int64_t max_rows;         /* rows per forward pass to plan for; 0 (default) = auto: as many as
                               the memory budget holds, so a prompt takes few passes */
  int32_t verbose;          /* 1 = print the memory plan and the kernel set to stderr */
  const char* heat_file;    /* NULL/"" = none; where the expert heat counts persist (pinned) */
  /* Appended (ABI 1 still): speculative decoding for this model's generations and streams.
   * Output is unchanged by it (greedy token for token; seeded sampling too for "ngram"). */
  /* NULL/"" = the model folder's draft/ subfolder when it has one, else "none"; "none",
   * "ngram" = prompt lookup, "mtp" = DeepSeek-V3's own MTP layer, or a draft model folder
   * (EAGLE-3.x, DSpark); a draft model (mtp too) is counted by the memory budget as the CLI
   * does */
  const char* draft;
  int32_t draft_max; /* most drafts per pass; 0 = auto (chosen from measured pass costs), 1..256 */
  /* Appended (ABI 1 still): the Vulkan GPU for the matrix products (README "GPU"), as the
   * CLI's --gpu: NULL/"" = "off"; "auto" = a GPU if the machine has one, else the CPU; "0",
   * "1", ... = that Vulkan device (lavapipe too). fp32 throughout; logits agree with the CPU's
   * to fp32 summation order. The selection line goes to stderr; "gpu" in the info JSON. */
  const char* gpu;
  /* Appended (ABI 1 still): prefix snapshots of sequence states (README "Conversations that
   * reuse state"), so a prompt that starts with a kept prefix — the conversation so far, a
   * shared system prompt — prefills only the rest; output is unchanged by it.
   * state_cache: NULL/"" = states/<model id> in the cache folder; "none" = no reuse at all;
   * else a folder. */
  const char* state_cache;
  uint64_t state_cache_size; /* disk bytes the snapshots may take; default 16 GiB; 0 = RAM only */
  int64_t state_cache_ram;   /* bytes of the memory budget kept for snapshots; -1 (default) =
                                auto (two full-context states); 0 = disk only */
  /* Appended (ABI 1 still): homes, folders on other drives holding copies of experts that
   * `deltafin place` wrote (README "Several drives"), as the CLI's --home: `n_homes` paths.
   * Reads go to whichever copy finishes first; output is unchanged. A home that cannot be used
   * is left out with one warning on stderr. Needs the store (not mmap). */
  const char* const* homes;
  size_t n_homes;
} deltafin_model_params;

/* Fills `p` with the defaults above. */
DELTAFIN_API void deltafin_model_params_init(deltafin_model_params* p);

/* Loads a checkpoint folder (config.json, safetensors shards, optionally tiktoken.model and
 * tokenizer_config.json). `params` may be NULL (defaults). On success *out owns the model.
 * Errors: a missing folder or bad option (ARGUMENT), unreadable files (IO), a checkpoint that
 * does not match its config or a budget below the minimum working set (MODEL). */
DELTAFIN_API deltafin_status deltafin_model_load(const char* path,
                                                 const deltafin_model_params* params,
                                                 deltafin_model** out);
/* Frees the model. Sessions, chats and streams made from it keep its memory until they are
 * freed, but fail from then on (free them too). */
DELTAFIN_API void deltafin_model_free(deltafin_model* model);

/* Vocabulary size (logit row length). Never fails. */
DELTAFIN_API int64_t deltafin_model_vocab(const deltafin_model* model);
/* Positions a sequence may reach (the planned context). Never fails. */
DELTAFIN_API int64_t deltafin_model_context(const deltafin_model* model);
/* 1 when the folder has a tokenizer (needed by tokenize, chat and the OpenAI-shaped calls). */
DELTAFIN_API int deltafin_model_has_tokenizer(const deltafin_model* model);
/* 1 when the checkpoint has K3's vision tower and projector (it takes images: the chat calls'
 * image_url parts and deltafin_chat_add_image), else 0. */
DELTAFIN_API int deltafin_model_has_vision(const deltafin_model* model);

/* JSON: {"path", "config": {...}, "eos_token_id", "vocab", "context", "kernels", "threads",
 * "describe", "gpu"}; "gpu" is the Vulkan device the products run on, or null (the CPU). */
DELTAFIN_API deltafin_status deltafin_model_info_json(deltafin_model* model, char** out_json);
/* JSON: the memory plan ({"budget", "context", "sequences", "state_bytes", ...,
 * "expert_cache_bytes", "resident_trunk_units", "describe"}), or null in mmap mode. */
DELTAFIN_API deltafin_status deltafin_model_memory_plan_json(deltafin_model* model,
                                                             char** out_json);
/* JSON: the model's counters since load: passes, rows, expert requests/hits/misses/bytes,
 * prefetch, trunk bytes streamed, I/O wait, peak RSS; with homes, "homes": per drive (the model
 * folder, then each home) its reads, bytes, busy seconds and GB/s. */
DELTAFIN_API deltafin_status deltafin_model_stats_json(deltafin_model* model, char** out_json);

/* ---------------------------------------------------------------------------------------------
 * Tokens and chat rendering (need a tokenizer; the model is only read: any thread)
 * ------------------------------------------------------------------------------------------ */

/* Text (`len` bytes, need not be NUL-terminated) -> ids. special = 0: every byte is ordinary
 * text (untrusted input); special = 1: special-token strings such as <|end_of_msg|> become their
 * ids (trusted text only). *out_ids is an array of *out_n ids (NULL when empty). */
DELTAFIN_API deltafin_status deltafin_tokenize(deltafin_model* model, const char* text, size_t len,
                                               int special, int32_t** out_ids, size_t* out_n);
/* Ids -> the exact bytes (special ids decode to their names). *out_text is NUL-terminated,
 * *out_len excludes the NUL (the bytes may be invalid UTF-8 for a partial character). */
DELTAFIN_API deltafin_status deltafin_detokenize(deltafin_model* model, const int32_t* ids,
                                                 size_t n, char** out_text, size_t* out_len);
/* An OpenAI-style chat request (the JSON the server takes: messages, tools, tool_choice,
 * response_format, reasoning_effort, thinking, add_generation_prompt) -> the exact K3 prompt
 * ids. `out_text` may be NULL; else it receives the prompt text. */
DELTAFIN_API deltafin_status deltafin_render_chat(deltafin_model* model, const char* request_json,
                                                  int32_t** out_ids, size_t* out_n,
                                                  char** out_text);

/* ---------------------------------------------------------------------------------------------
 * Sessions: one sequence's model state and the ids it has consumed
 * ------------------------------------------------------------------------------------------ */

typedef struct deltafin_session deltafin_session;

DELTAFIN_API deltafin_status deltafin_session_new(deltafin_model* model, deltafin_session** out);
DELTAFIN_API void deltafin_session_free(deltafin_session* session);
/* Empties the state and the history. */
DELTAFIN_API void deltafin_session_reset(deltafin_session* session);
/* Positions consumed so far. */
DELTAFIN_API int64_t deltafin_session_position(const deltafin_session* session);
/* The ids the state has consumed, in order (*out_ids NULL when empty). */
DELTAFIN_API deltafin_status deltafin_session_history(deltafin_session* session, int32_t** out_ids,
                                                      size_t* out_n);

/* Feeds `n` >= 1 ids in one forward pass and writes logits: with all_logits = 1, n rows of
 * vocab floats (row t = the logits after ids[0..t]); with 0, the last row only. `logits` may be
 * NULL (the state still advances); else it must hold n * vocab (or vocab) floats. The last
 * token a generation sampled is in the history but not yet in the state: it is fed first, in
 * the same pass (its row is not returned). A pass that fails leaves the session needing
 * deltafin_session_reset (the message says so). */
DELTAFIN_API deltafin_status deltafin_session_eval(deltafin_session* session, const int32_t* ids,
                                                   size_t n, int all_logits, float* logits);

/* Sampling and stop settings of `deltafin run` (same names, same defaults, same order of
 * application: penalties, top-k, top-p, min-p, temperature). */
typedef struct deltafin_sampling_params {
  size_t struct_size;      /* sizeof(deltafin_sampling_params) */
  int64_t max_new_tokens;  /* default 256 */
  float temperature;       /* 0 = greedy (default) */
  int32_t top_k;           /* 0 = off */
  float top_p;             /* 1 = off */
  float min_p;             /* 0 = off */
  float repeat_penalty;    /* 1 = off */
  float presence_penalty;  /* 0 */
  float frequency_penalty; /* 0 */
  uint64_t seed;           /* used when has_seed */
  int32_t has_seed;        /* 0 = a random seed (reported in the result) */
  const char* const* stop; /* stop strings (the match is not emitted) */
  size_t n_stop;
  int64_t prefill_chunk; /* prompt rows per forward pass; 0 (default) = the model's pass rows */
  int32_t chat;          /* 1 = parse the output as a K3 assistant turn */
} deltafin_sampling_params;

DELTAFIN_API void deltafin_sampling_params_init(deltafin_sampling_params* p);

/* What one generated token produced, for the streaming callback. Pointers are valid during the
 * callback only. `text` is the content the token completed (may be empty: a partial UTF-8
 * character, text held back while it could start a stop string, or thinking); `reasoning` is
 * thinking-channel text (chat mode). */
typedef struct deltafin_token_event {
  int32_t id;
  int64_t index; /* 0-based index of the token in this generation */
  const char* text;
  size_t text_len;
  const char* reasoning;
  size_t reasoning_len;
} deltafin_token_event;

/* Return 0 to go on, anything else to stop generation (stop_reason "cancelled"). */
typedef int (*deltafin_token_callback)(const deltafin_token_event* event, void* user_data);

/* Generates from the session's current state: feeds the pending last token of a previous
 * generation (if any) and `prompt` (n may be 0 only when there is such a token), then samples until
 * a stop token (the config's eos and <|end_of_msg|>), max_new_tokens, the context, a stop string,
 * or the callback asks to stop. `callback` may be NULL. *out_result_json (may be NULL) receives the
 * object `deltafin run --json` prints (prompt_ids, completion_ids, text, reasoning, stop_reason,
 * seed and the stats fields). */
DELTAFIN_API deltafin_status deltafin_session_generate(deltafin_session* session,
                                                       const int32_t* prompt, size_t n,
                                                       const deltafin_sampling_params* params,
                                                       deltafin_token_callback callback,
                                                       void* user_data, char** out_result_json);

/* ---------------------------------------------------------------------------------------------
 * OpenAI-shaped completions: the server's request bodies in, its response objects out
 * ------------------------------------------------------------------------------------------ */

/* A generation in progress that yields the server's stream chunks. */
typedef struct deltafin_stream deltafin_stream;

/* Starts a /v1/completions (`chat` = 0) or /v1/chat/completions (`chat` = 1) request on a fresh
 * state. `request_json` is exactly the server's request body and is validated exactly as the
 * server validates it (an unknown or unsupported field is an ARGUMENT error naming it; a prompt
 * that does not fit is CONTEXT). "model" may be omitted. */
DELTAFIN_API deltafin_status deltafin_stream_start(deltafin_model* model, const char* request_json,
                                                   int chat, deltafin_stream** out);
/* Advances the stream by at most one forward pass and returns the next chunk the server would
 * send (`chat.completion.chunk` / `text_completion` JSON, the final one with finish_reason, then
 * the usage chunk when stream_options.include_usage). *out_chunk is NULL when the pass produced
 * no chunk yet: call again. *out_done becomes 1 once every chunk was returned. */
DELTAFIN_API deltafin_status deltafin_stream_next(deltafin_stream* stream, char** out_chunk,
                                                  int* out_done);
/* Runs the stream to its end (if it is not there yet) and returns the whole non-streamed
 * response (`chat.completion` / `text_completion`), with the text of every chunk. */
DELTAFIN_API deltafin_status deltafin_stream_response(deltafin_stream* stream, char** out_json);
/* Once the stream has ended: {"prompt_ids" (the ids fed; for a chat turn only the new ones),
 * "completion_ids", and the stats fields of `run --json`: prompt_tokens, reused_prompt_tokens,
 * completion_tokens, timings, expert counters, stop_reason}. */
DELTAFIN_API deltafin_status deltafin_stream_stats_json(deltafin_stream* stream, char** out_json);
/* Stops the generation if it is still running and frees it. */
DELTAFIN_API void deltafin_stream_free(deltafin_stream* stream);

/* Callback for the convenience calls below: one chunk (NUL-terminated JSON, valid during the
 * call). Return 0 to go on, anything else to stop (finish_reason "stop", the stream closes
 * normally). */
typedef int (*deltafin_chunk_callback)(const char* chunk_json, void* user_data);

/* Images (a model with a vision tower, deltafin_model_has_vision): a chat request's user
 * messages take OpenAI's image parts, {"type": "image_url", "image_url": {"url":
 * "data:image/png;base64,..."}} (PNG, JPEG, WebP or GIF; at most 100 images of 20 MiB per
 * request; remote http(s) URLs are refused: the library fetches nothing). A bad image is an
 * ARGUMENT error naming its part, e.g. "messages[0].content[1].image_url". */

/* One request start to end: chunks go to `callback` (may be NULL) as they are produced, and
 * *out_response_json receives the whole response object. */
DELTAFIN_API deltafin_status deltafin_create_completion(deltafin_model* model,
                                                        const char* request_json,
                                                        deltafin_chunk_callback callback,
                                                        void* user_data, char** out_response_json);
DELTAFIN_API deltafin_status deltafin_create_chat_completion(deltafin_model* model,
                                                             const char* request_json,
                                                             deltafin_chunk_callback callback,
                                                             void* user_data,
                                                             char** out_response_json);

/* ---------------------------------------------------------------------------------------------
 * Chats: a multi-turn conversation over one kept state (like `deltafin chat`): each turn feeds
 * only its new tokens, and the stream's stats and usage say how many were reused.
 * ------------------------------------------------------------------------------------------ */

typedef struct deltafin_chat deltafin_chat;

/* options_json (may be NULL): {"system": "...", "reasoning_effort": "low"|"high"|"max",
 * "thinking": true|false}. */
DELTAFIN_API deltafin_status deltafin_chat_new(deltafin_model* model, const char* options_json,
                                               deltafin_chat** out);
/* Frees the chat. A turn's stream that outlives it fails from then on (free it too). */
DELTAFIN_API void deltafin_chat_free(deltafin_chat* chat);
/* Forgets the conversation (the next turn prefills from scratch) and drops attached images;
 * ignored while a turn is in progress. */
DELTAFIN_API void deltafin_chat_reset(deltafin_chat* chat);
/* Starts the next turn: `request_json` is {"content": "the user's message"} plus the
 * server's generation fields (max_tokens, temperature, top_p, top_k, min_p, seed, stop,
 * presence/frequency/repetition penalty, logit_bias, stream_options). The stream yields
 * `chat.completion.chunk`s; when it ends the answer joins the conversation. Only one turn of a
 * chat may be in progress; freeing its stream early ends the turn there. */
DELTAFIN_API deltafin_status deltafin_chat_send(deltafin_chat* chat, const char* request_json,
                                                deltafin_stream** out);
/* Attaches an image to the chat's next user message (it goes before the text, as `deltafin
 * chat`'s /image does): `len` bytes of a PNG, JPEG, WebP or GIF file at `data` (`name`, may be
 * NULL, is how errors name it), or the file at `path`. Checked now: the format, the size (at
 * most 20 MiB of file, 178,956,970 pixels), the whole first frame decoded (a truncated or
 * corrupt file is refused here), the count (at most 100 waiting), a model with a vision tower;
 * each failure is an ARGUMENT error naming the image and keeps what was attached before. The
 * next deltafin_chat_send takes them; a send that fails keeps them for the next try.
 * deltafin_chat_clear_images and deltafin_chat_reset drop them. */
DELTAFIN_API deltafin_status deltafin_chat_add_image(deltafin_chat* chat, const void* data,
                                                     size_t len, const char* name);
DELTAFIN_API deltafin_status deltafin_chat_add_image_file(deltafin_chat* chat, const char* path);
/* Drops the images attached for the next message; returns how many there were. */
DELTAFIN_API int deltafin_chat_clear_images(deltafin_chat* chat);
/* The conversation as {"messages": [...], "thinking": b, "reasoning_effort": e}. */
DELTAFIN_API deltafin_status deltafin_chat_history_json(deltafin_chat* chat, char** out_json);

#ifdef __cplusplus
}
#endif

#endif /* DELTAFIN_DELTAFIN_H */
