/*
 * chat_template.h - renders a checkpoint's chat template (Jinja) to the
 * prompt text a chat model was trained on.
 *
 * A subset of Jinja2 large enough for the templates real checkpoints ship
 * (Llama 3.x, Qwen2.5, Qwen3, Mistral, Zephyr/TinyLlama), interpreted with
 * the environment transformers uses: trim_blocks and lstrip_blocks on,
 * loop controls, tojson that keeps non-ASCII, raise_exception and
 * strftime_now. A construct outside the subset is an error naming it and
 * its template line when the template is parsed; a raise_exception or a
 * type error is an error when it is rendered.
 *
 * A parsed template is immutable: renders may run on many threads at once.
 */
#ifndef FERRY_CHAT_TEMPLATE_H
#define FERRY_CHAT_TEMPLATE_H

#include <stddef.h>

#include "../engine/base/json.h"
#include "../engine/base/status.h"

typedef struct chat_template chat_template;

/* Parses src[0..len); `label` names it in errors ("tokenizer_config.json
 * chat_template", a file name). */
ferry_status tmpl_parse(const char *src, size_t len, const char *label, chat_template **out);
void tmpl_free(chat_template *t);

/* Renders with the top-level variables of `vars` (a JSON object: messages,
 * add_generation_prompt, bos_token, eos_token, tools, and any other keyword
 * the caller passes). Output past max_out bytes is FERRY_ERR_TOO_LARGE. */
ferry_status tmpl_render(const chat_template *t, const json_value *vars, size_t max_out, strbuf *out);

/* Ends every render running and to come with FERRY_ERR_BUSY ("the server
 * is shutting down"): each checks this where it charges its work. For a
 * server's drain; there is no undoing it. Async-signal-safe. */
void tmpl_cancel_renders(void);

#endif
