/*
 * text.h - the text layer every front end shares: prompts as text and chat
 * messages in, generated text out, whatever the transport (the OpenAI API,
 * Triton's generate extension with text_input, KServe infer with a BYTES
 * text_input, the CLI).
 *
 * A text_model is loaded once from the model directory when serving
 * starts: the tokenizer (tokenizer.json, tokenizer_config.json), the chat
 * template (chat_template.jinja, else chat_template.json, else
 * tokenizer_config.json's chat_template - the order transformers reads them
 * in) and generation_config.json (end-of-sequence ids, sampling defaults).
 * Loading never fails for what a directory lacks: a checkpoint without a
 * tokenizer still serves token ids, and text_error says why text cannot be
 * served (naming the missing or unreadable file) so that every text
 * endpoint answers that message. A loaded text_model is immutable: any
 * number of threads may use it at once.
 *
 * Special tokens, as transformers and vLLM treat them:
 *   - a completion prompt is encoded with the tokenizer's special tokens
 *     added (BOS) and special-token text parsed into ids;
 *   - a chat prompt is rendered by the template (which writes bos_token
 *     itself) and encoded without adding special tokens but with
 *     special-token text parsed - what apply_chat_template(tokenize=True)
 *     does. So a user message holding "<|im_end|>" becomes that control
 *     token, exactly as in transformers and vLLM;
 *   - generated text skips special tokens (skip_special_tokens=True).
 *
 * Generated text is streamed per sequence by a text_stream: ids go through
 * the tokenizer's streaming decoder (tok_stream, UTF-8 safe), then through
 * the stop strings. A stop string is matched across token boundaries; text
 * that could still turn out to be the start of one is held back and
 * released once it cannot; the stop string and everything after it are not
 * returned (as OpenAI does), and the caller ends the sequence (sched_cancel).
 * The concatenation of every delta a stream gives is the text a non-streamed
 * answer holds: both come from the same stream.
 */
#ifndef FERRY_TEXT_H
#define FERRY_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/base/json.h"
#include "../engine/base/status.h"
#include "../engine/request.h"
#include "tokenizer.h"

#define TEXT_MAX_STOPS 16        /* stop strings in one request */
#define TEXT_MAX_STOP_BYTES 256  /* bytes of one stop string */

typedef struct text_model text_model;

/* ---- the model's text files ------------------------------------------------------- */

/* Reads what dir holds (see the top). Fails only when memory runs out;
 * what is missing or malformed is reported by text_error / text_chat_error.
 * max_text: the longest text the model encodes at once and the most a chat
 * template may write (a server's --max-text-bytes); 0 = no limit. */
ferry_status text_model_load(const char *dir, size_t max_text, text_model **out);
/* Applies a JSON object of generation_config.json's fields over what the
 * model's file said (serve's --override-generation-config, as vLLM's):
 * temperature, top_p, top_k (the defaults of requests that leave them
 * out), eos_token_id (more end ids). A malformed one is refused naming the
 * field. Before the model is shared between threads. */
ferry_status text_model_override_generation(text_model *m, const char *json);
void text_model_free(text_model *m);

/* NULL when text works, else why not, naming the file ("DIR has no
 * tokenizer.json: ..."). Every text entry point below fails with this
 * message (FERRY_ERR_UNSUPPORTED) when it is set. */
const char *text_error(const text_model *m);
/* NULL when chat works, else why not (no chat template, or the template's
 * parse error). */
const char *text_chat_error(const text_model *m);

/* The tokenizer; NULL when text_error is set. */
const tokenizer *text_tokenizer(const text_model *m);

/* generation_config.json's sampling values; has_* false when absent. */
typedef struct {
    bool has_temperature, has_top_p, has_top_k;
    float temperature, top_p;
    int top_k;
} text_sampling_defaults;
const text_sampling_defaults *text_sampling(const text_model *m);

/* The ids that end generation on the text endpoints unless a request says
 * otherwise: generation_config.json's eos_token_id (an id or a list) and
 * the tokenizer's eos_token, as vLLM stops. */
int text_eos_ids(const text_model *m, const int32_t **ids);

/* The most bytes of text one generated token can add to a sequence's text
 * (decoded alone or in context, replacement characters included): what a
 * front end reserves per token of its budget. */
size_t text_max_token_bytes(const text_model *m);

/* The bytes of text the tokenizer works on for s[0..len): len, or more
 * when the text grows before it is tokenized (ill-formed UTF-8 becomes
 * U+FFFD; the tokenizer's NFC/NFKC/lowercase lengthen some characters):
 * tok_encode_size. len when m has no tokenizer. */
size_t text_encode_size(const text_model *m, const char *s, size_t len);
/* Memory an encode may hold (ids and the tokenizer's work), for the
 * budget, given text_encode_size of its text (not its length: 32 KiB of
 * 0xFF bytes is 96 KiB of U+FFFD to the tokenizer). */
size_t text_encode_bound(size_t size);
#define TEXT_ENCODE_SLACK (64u << 10) /* of text_encode_bound: what an encode holds whatever its text */
/* The longest text the model encodes at once (--max-text-bytes; SIZE_MAX:
 * no limit): a front end need not reserve for a longer one, text_tokenize
 * refuses it. */
size_t text_max_bytes(const text_model *m);

/* ---- prompts ---------------------------------------------------------------------- */

/* Encodes a prompt: add_special adds the tokenizer's BOS/EOS (completion
 * prompts: true; rendered chat prompts: false); special-token text is
 * always parsed (see the top). *ids is malloc'd. */
ferry_status text_encode(const text_model *m, const char *s, size_t len, bool add_special, int32_t **ids, int *n);
/* The same with special-token parsing chosen (/tokenize's parse_special).
 * Both refuse text longer than the model's max_text (FERRY_ERR_TOO_LARGE). */
ferry_status text_tokenize(const text_model *m, const char *s, size_t len, bool add_special, bool parse_special,
                           int32_t **ids, int *n);

/* Renders a chat prompt with add_generation_prompt true. messages is the
 * OpenAI list: objects with a role (system, user, assistant, tool, ...)
 * and content - a string, a list of {"type": "text", "text": ...} parts
 * (joined with "\n", as vLLM does) or null (an assistant turn holding only
 * tool_calls); other members (name, tool_calls, tool_call_id) are passed to
 * the template as they are. tools (a list, or NULL) and the members of
 * kwargs (an object, or NULL: vLLM's chat_template_kwargs, e.g.
 * enable_thinking) become template variables too. FERRY_ERR_INVALID names
 * the message at fault ("messages[1].content ..."); output past max_out
 * bytes, or past the model's max_text (text_model_load), is
 * FERRY_ERR_TOO_LARGE. */
ferry_status text_render_chat(const text_model *m, const json_value *messages, const json_value *tools,
                              const json_value *kwargs, size_t max_out, strbuf *out);

/* What a text_stream holds of its own (its stop window and the tokenizer's
 * streaming state), stop strings aside: what a front end reserves per row. */
#define TEXT_STREAM_BYTES 8192

/* ---- requests ---------------------------------------------------------------------- */

/* Stop strings of one request. */
typedef struct {
    int n;
    char *s[TEXT_MAX_STOPS];   /* malloc'd; may hold NUL bytes */
    size_t len[TEXT_MAX_STOPS];
} text_stops;

/* Reads `stop`: null, a string, or a list of strings (each 1 ..
 * TEXT_MAX_STOP_BYTES bytes, at most TEXT_MAX_STOPS). field names it in
 * errors ("stop", "parameters.stop"). */
ferry_status text_stops_parse(const json_value *v, const char *field, text_stops *out);
void text_stops_free(text_stops *s);
size_t text_stops_bytes(const text_stops *s);

/* What a text request did not set: sampling values from
 * generation_config.json where given (p->given false: the request did not
 * set it), and, unless ignore_eos, the model's end-of-sequence ids added to
 * the stop ids (FERRY_ERR_INVALID when they do not fit REQUEST_MAX_STOP). */
ferry_status text_request_defaults(const text_model *m, gen_params *p, bool ignore_eos);

/* ---- generated text ---------------------------------------------------------------- */

typedef enum { TEXT_FINISH_NONE, TEXT_FINISH_STOP, TEXT_FINISH_LENGTH } text_finish;

/* "stop", "length", or NULL (the sequence was cancelled or failed). */
const char *text_finish_name(text_finish f);

typedef struct text_stream text_stream;

/* A streamer for one sequence generated from g (its stop ids and
 * max_new_tokens give the finish reason); stops is copied (NULL: none).
 * Memory: a few KB plus the stop strings, never the whole text. */
ferry_status text_stream_new(const text_model *m, const gen_request *g, const text_stops *stops, text_stream **out);
void text_stream_free(text_stream *s);
/* One generated id: appends the text that became final to delta. Returns
 * true when a stop string matched: delta ends before it, the caller ends
 * the sequence, and later pushes are ignored. An id the tokenizer does not
 * know (a model's padding rows) adds no text, as HF's decode skips it. */
bool text_stream_push(text_stream *s, int32_t id, strbuf *delta);
/* The sequence ended: appends what was held back (nothing after a stop
 * string) and says why it ended. */
text_finish text_stream_end(text_stream *s, strbuf *delta);
/* Ids pushed until the end (a stop string's last token included). */
int text_stream_tokens(const text_stream *s);
/* Memory ran out inside the stream: its text is incomplete, and the row
 * must fail rather than answer it. */
bool text_stream_failed(const text_stream *s);


#endif
