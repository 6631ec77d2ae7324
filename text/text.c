/*
 * text.c - the text layer: a model directory's tokenizer, chat template and
 * generation config, prompt encoding, chat rendering and per-sequence text
 * streaming with stop strings. See text.h.
 */
#define _GNU_SOURCE /* memmem */
#include "text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "../engine/weights/model_dir.h"

struct text_model {
    tokenizer *tok;
    chat_template *tmpl;
    char *error;                  /* why text cannot be served, or NULL */
    char *chat_error;             /* why chat cannot be served, or NULL */
    text_sampling_defaults sampling;
    int32_t eos[REQUEST_MAX_STOP];
    int n_eos;
    size_t max_token_bytes;
    size_t max_text;              /* the longest text encoded, the most rendered (SIZE_MAX: no limit) */
};

/* sb_append of what may be an empty strbuf's NULL data */
static void put(strbuf *sb, const char *p, size_t n)
{
    if (n) sb_append(sb, p, n);
}

/* ---- loading ------------------------------------------------------------------------ */

/* Sets *slot to a malloc'd "fmt ..." (a message stays whole even when it is
 * long: ferry_errmsg's are at most FERRY_MSG_MAX). */
static ferry_status set_msg(char **slot, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ferry_status set_msg(char **slot, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    free(*slot);
    *slot = malloc((size_t)n + 1);
    if (!*slot) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    va_start(ap, fmt);
    vsnprintf(*slot, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return FERRY_OK;
}

/* Reads dir/name into *text: FERRY_ERR_NOT_FOUND when there is none. Through
 * model_dir's confinement rule (a Hugging Face cache snapshot's symlinks
 * may lead into its repository's blobs, nowhere else). */
static ferry_status read_in(const char *dir, const char *name, char **text, size_t *len)
{
    return model_dir_read(dir, name, text, len);
}

static void add_eos(text_model *m, int64_t id)
{
    if (id < 0 || id > INT32_MAX) return;
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == (int32_t)id) return;
    if (m->n_eos < REQUEST_MAX_STOP) m->eos[m->n_eos++] = (int32_t)id;
}

/* generation_config.json: eos_token_id (an id or a list), temperature,
 * top_p, top_k. A file that is not JSON, or a field of the wrong type, is
 * the text error: a silently ignored default would change every answer. */
/* Applies generation_config.json's fields held in text[0..len) to m:
 * eos_token_id (an id or a list: more end ids), temperature, top_p, top_k.
 * FERRY_ERR_INVALID with *bad naming the field (or "the file") for what
 * Hugging Face would not write there; FERRY_ERR_NOMEM. */
static ferry_status apply_generation(text_model *m, const char *text, size_t len, const char **bad)
{
    json_doc *doc = NULL;
    *bad = NULL;
    ferry_status st = json_parse(text, len, &doc);
    if (st != FERRY_OK) {
        *bad = "the JSON";
        return st;
    }
    const json_value *root = json_doc_root(doc);
    const json_value *eos = json_get(root, "eos_token_id");
    if (root->type != JSON_OBJECT) *bad = "the file";
    else if (eos && eos->type == JSON_NUMBER && eos->is_int) add_eos(m, eos->integer);
    else if (eos && eos->type == JSON_ARRAY) {
        for (size_t i = 0; i < eos->len; i++) {
            if (eos->items[i].type != JSON_NUMBER || !eos->items[i].is_int) *bad = "eos_token_id";
            else add_eos(m, eos->items[i].integer);
        }
    } else if (eos && eos->type != JSON_NULL) *bad = "eos_token_id";
    bool wrong_t = false, wrong_p = false, wrong_k = false;
    double d;
    int64_t k;
    if (json_get_num(root, "temperature", &d, &wrong_t)) {
        m->sampling.has_temperature = true;
        m->sampling.temperature = (float)d;
        wrong_t = !(d >= 0 && d < 1e30);
    }
    if (json_get_num(root, "top_p", &d, &wrong_p)) {
        m->sampling.has_top_p = true;
        m->sampling.top_p = (float)d;
        wrong_p = !(d > 0 && d <= 1);
    }
    if (json_get_int(root, "top_k", &k, &wrong_k)) {
        m->sampling.has_top_k = true;
        m->sampling.top_k = k < 0 || k > INT32_MAX ? 0 : (int)k; /* -1 (vLLM) and "all" alike */
    }
    if (wrong_t) *bad = "temperature";
    if (wrong_p) *bad = "top_p";
    if (wrong_k) *bad = "top_k";
    json_doc_free(doc);
    return *bad ? FERRY_ERR_INVALID : FERRY_OK;
}

static ferry_status load_generation_config(text_model *m, const char *dir)
{
    char *text = NULL;
    size_t len = 0;
    ferry_status st = read_in(dir, "generation_config.json", &text, &len);
    if (st == FERRY_ERR_NOT_FOUND) return FERRY_OK;
    if (st == FERRY_ERR_NOMEM) return st;
    if (st != FERRY_OK) return set_msg(&m->error, "%s", ferry_errmsg());
    const char *bad;
    st = apply_generation(m, text, len, &bad);
    free(text);
    if (st == FERRY_ERR_NOMEM) return st;
    if (st != FERRY_OK && !strcmp(bad, "the JSON"))
        return set_msg(&m->error, "%s/generation_config.json: %s", dir, ferry_errmsg());
    if (st != FERRY_OK)
        return set_msg(&m->error, "%s/generation_config.json: %s is not what Hugging Face writes there", dir, bad);
    return FERRY_OK;
}

ferry_status text_model_override_generation(text_model *m, const char *json)
{
    const char *bad;
    ferry_status st = apply_generation(m, json, strlen(json), &bad);
    if (st == FERRY_ERR_INVALID && !strcmp(bad, "the JSON"))
        return ferry_fail_context(st, "--override-generation-config");
    if (st == FERRY_ERR_INVALID)
        return ferry_fail(st, "--override-generation-config: %s must be what generation_config.json holds there "
                          "(an object; temperature >= 0, 0 < top_p <= 1, integer top_k and eos_token_id)", bad);
    return st;
}

/* The chat template's source, in transformers' order: chat_template.jinja,
 * chat_template.json ({"chat_template": "..."}), tokenizer_config.json.
 * Either JSON may hold a list of named templates: "default" is the one. */
static const char *template_in(const json_value *v)
{
    if (v && v->type == JSON_STRING) return v->str;
    if (!v || v->type != JSON_ARRAY) return NULL;
    for (size_t i = 0; i < v->len; i++) {
        bool bad = false;
        const char *name = json_get_str(&v->items[i], "name", &bad);
        if (name && !strcmp(name, "default")) return json_get_str(&v->items[i], "template", &bad);
    }
    return NULL;
}

static ferry_status load_template(text_model *m, const char *dir)
{
    char *src = NULL, *text = NULL;
    size_t len = 0;
    const char *label = "chat_template.jinja";
    ferry_status st = read_in(dir, "chat_template.jinja", &src, &len);
    for (int i = 0; st != FERRY_OK && i < 2; i++) {
        if (st == FERRY_ERR_NOMEM) return st;
        if (st != FERRY_ERR_NOT_FOUND) return set_msg(&m->chat_error, "%s", ferry_errmsg());
        label = i == 0 ? "chat_template.json" : "tokenizer_config.json chat_template";
        st = read_in(dir, i == 0 ? "chat_template.json" : "tokenizer_config.json", &text, &len);
        if (st != FERRY_OK) continue;
        json_doc *doc = NULL;
        st = json_parse(text, len, &doc);
        free(text);
        if (st != FERRY_OK) return st == FERRY_ERR_NOMEM ? st : set_msg(&m->chat_error, "%s: %s", label, ferry_errmsg());
        const char *t = template_in(json_get(json_doc_root(doc), "chat_template"));
        if (t && !(src = strdup(t))) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        else st = t ? FERRY_OK : FERRY_ERR_NOT_FOUND;
        len = t ? strlen(t) : 0;
        json_doc_free(doc);
        if (st == FERRY_ERR_NOMEM) return st;
    }
    if (st != FERRY_OK)
        return set_msg(&m->chat_error,
                       "%s has no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json "
                       "chat_template): chat needs one (/v1/completions takes plain prompts)",
                       dir);
    st = tmpl_parse(src, len, label, &m->tmpl);
    free(src);
    if (st == FERRY_ERR_NOMEM) return st;
    if (st != FERRY_OK) return set_msg(&m->chat_error, "%s", ferry_errmsg());
    return FERRY_OK;
}

/* The most bytes a token adds to a text: its longest decoding alone (+1:
 * the leading space a SentencePiece decoder strips from a text's first
 * token), times 3 for bytes that become U+FFFD in context. */
static ferry_status measure_tokens(text_model *m)
{
    strbuf sb;
    sb_init(&sb);
    size_t longest = 0;
    int vocab = tok_vocab_size(m->tok);
    for (int32_t id = 0; id < vocab; id++) {
        sb.len = 0;
        if (tok_decode(m->tok, &id, 1, false, &sb) == FERRY_OK && sb.len > longest) longest = sb.len;
    }
    bool oom = sb.oom;
    sb_free(&sb);
    if (oom) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    m->max_token_bytes = 3 * (longest + 1);
    return FERRY_OK;
}

ferry_status text_model_load(const char *dir, size_t max_text, text_model **out)
{
    *out = NULL;
    text_model *m = calloc(1, sizeof *m);
    if (!m) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    m->max_text = max_text ? max_text : SIZE_MAX;
    ferry_status st = tok_load(dir, &m->tok);
    if (st == FERRY_ERR_NOT_FOUND)
        st = set_msg(&m->error, "%s has no tokenizer.json: text needs the checkpoint's tokenizer (token ids still work)", dir);
    else if (st != FERRY_OK && st != FERRY_ERR_NOMEM)
        st = set_msg(&m->error, "%s", ferry_errmsg());
    if (st == FERRY_OK && m->tok) {
        add_eos(m, tok_token_id(m->tok, tok_eos_token(m->tok) ? tok_eos_token(m->tok) : ""));
        st = load_generation_config(m, dir);
    }
    if (st == FERRY_OK && m->tok) st = measure_tokens(m);
    if (st == FERRY_OK && m->tok && !m->error) st = load_template(m, dir);
    if (st == FERRY_OK && m->error && !m->chat_error) st = set_msg(&m->chat_error, "%s", m->error);
    if (st != FERRY_OK) {
        text_model_free(m);
        return st;
    }
    *out = m;
    return FERRY_OK;
}

void text_model_free(text_model *m)
{
    if (!m) return;
    tok_free(m->tok);
    tmpl_free(m->tmpl);
    free(m->error);
    free(m->chat_error);
    free(m);
}

const char *text_error(const text_model *m) { return m ? m->error : "no model"; }
const char *text_chat_error(const text_model *m) { return m ? m->chat_error : "no model"; }
const tokenizer *text_tokenizer(const text_model *m) { return m && !m->error ? m->tok : NULL; }
const text_sampling_defaults *text_sampling(const text_model *m) { return &m->sampling; }

int text_eos_ids(const text_model *m, const int32_t **ids)
{
    *ids = m->eos;
    return m->n_eos;
}

size_t text_max_token_bytes(const text_model *m) { return m->max_token_bytes; }

size_t text_encode_size(const text_model *m, const char *s, size_t len)
{
    return m && !m->error ? tok_encode_size(m->tok, s, len) : len;
}

/* ids (4 bytes for at most a token a byte of the text the tokenizer works
 * on, room to grow included) and the tokenizer's pieces and matches, a few
 * times that text */
size_t text_encode_bound(size_t size) { return size > SIZE_MAX / 32 ? SIZE_MAX : 16 * size + TEXT_ENCODE_SLACK; }

size_t text_max_bytes(const text_model *m) { return m ? m->max_text : SIZE_MAX; }

/* ---- prompts ------------------------------------------------------------------------ */

/* The tokenizer's time grows with its input (about 0.1 s a MiB): the limit
 * keeps one request from holding a front end's thread for seconds. */
ferry_status text_tokenize(const text_model *m, const char *s, size_t len, bool add_special, bool parse_special,
                           int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    if (m->error) return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s", m->error);
    if (len > m->max_text)
        return ferry_fail(FERRY_ERR_TOO_LARGE, "the text is %zu bytes, more than this server encodes at once (%zu, --max-text-bytes)",
                          len, m->max_text);
    return tok_encode(m->tok, s, len, add_special, parse_special, ids, n);
}

ferry_status text_encode(const text_model *m, const char *s, size_t len, bool add_special, int32_t **ids, int *n)
{
    return text_tokenize(m, s, len, add_special, true, ids, n);
}

/* A message's content as the template sees it: a string. */
static ferry_status put_content(strbuf *vars, const json_value *c, size_t i)
{
    if (!c || c->type == JSON_NULL) {
        sb_puts(vars, "\"\"");
        return FERRY_OK;
    }
    if (c->type == JSON_STRING) {
        sb_json_strn(vars, c->str, c->len);
        return FERRY_OK;
    }
    if (c->type != JSON_ARRAY)
        return ferry_fail(FERRY_ERR_INVALID, "messages[%zu].content must be a string or a list of text parts", i);
    strbuf joined;
    sb_init(&joined);
    for (size_t k = 0; k < c->len; k++) {
        const json_value *part = &c->items[k];
        bool bad = false;
        const char *type = json_get_str(part, "type", &bad);
        const json_value *text = json_get(part, "text");
        if (part->type != JSON_OBJECT || !type) {
            sb_free(&joined);
            return ferry_fail(FERRY_ERR_INVALID, "messages[%zu].content[%zu] must be an object with a type", i, k);
        }
        if (strcmp(type, "text") != 0) {
            sb_free(&joined);
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "messages[%zu].content[%zu]: type '%.40s' is not supported (text only)",
                              i, k, type);
        }
        if (!text || text->type != JSON_STRING) {
            sb_free(&joined);
            return ferry_fail(FERRY_ERR_INVALID, "messages[%zu].content[%zu].text must be a string", i, k);
        }
        if (k) sb_putc(&joined, '\n');
        put(&joined, text->str, text->len);
    }
    ferry_status st = joined.oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : FERRY_OK;
    sb_json_strn(vars, joined.data ? joined.data : "", joined.len);
    sb_free(&joined);
    return st;
}

/* {"messages": [...], "add_generation_prompt": true, "bos_token": ..., ...} */
static ferry_status build_vars(const text_model *m, const json_value *messages, const json_value *tools,
                               const json_value *kwargs, strbuf *vars)
{
    if (!messages || messages->type != JSON_ARRAY)
        return ferry_fail(FERRY_ERR_INVALID, "messages must be a list of {role, content} objects");
    if (messages->len == 0) return ferry_fail(FERRY_ERR_INVALID, "messages is empty");
    sb_puts(vars, "{\"messages\": [");
    for (size_t i = 0; i < messages->len; i++) {
        const json_value *msg = &messages->items[i];
        if (msg->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "messages[%zu] must be an object", i);
        const json_value *role = json_get(msg, "role");
        if (!role || role->type != JSON_STRING || role->len == 0)
            return ferry_fail(FERRY_ERR_INVALID, "messages[%zu].role must be a string (system, user, assistant, tool)", i);
        sb_puts(vars, i ? ", {\"role\": " : "{\"role\": ");
        sb_json_strn(vars, role->str, role->len);
        sb_puts(vars, ", \"content\": ");
        FERRY_TRY(put_content(vars, json_get(msg, "content"), i));
        for (size_t k = 0; k < msg->len; k++) {
            const char *key = msg->members[k].key;
            if (!strcmp(key, "role") || !strcmp(key, "content")) continue;
            sb_puts(vars, ", ");
            sb_json_strn(vars, key, msg->members[k].key_len);
            sb_puts(vars, ": ");
            sb_json_value(vars, &msg->members[k].value, 0);
        }
        sb_putc(vars, '}');
    }
    sb_puts(vars, "], \"add_generation_prompt\": true, \"bos_token\": ");
    const char *bos = tok_bos_token(m->tok), *eos = tok_eos_token(m->tok);
    sb_json_str(vars, bos ? bos : "");
    sb_puts(vars, ", \"eos_token\": ");
    sb_json_str(vars, eos ? eos : "");
    if (tools && tools->type != JSON_NULL) {
        if (tools->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "tools must be a list");
        sb_puts(vars, ", \"tools\": ");
        sb_json_value(vars, tools, 0);
    }
    if (kwargs && kwargs->type != JSON_NULL) {
        if (kwargs->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "chat_template_kwargs must be an object");
        for (size_t k = 0; k < kwargs->len; k++) {
            const char *key = kwargs->members[k].key;
            if (!strcmp(key, "messages") || !strcmp(key, "add_generation_prompt") || !strcmp(key, "bos_token") ||
                !strcmp(key, "eos_token") || !strcmp(key, "tools"))
                continue; /* the request's own fields decide these */
            sb_puts(vars, ", ");
            sb_json_strn(vars, key, kwargs->members[k].key_len);
            sb_puts(vars, ": ");
            sb_json_value(vars, &kwargs->members[k].value, 0);
        }
    }
    sb_putc(vars, '}');
    return vars->oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : FERRY_OK;
}

ferry_status text_render_chat(const text_model *m, const json_value *messages, const json_value *tools,
                              const json_value *kwargs, size_t max_out, strbuf *out)
{
    if (m->chat_error) return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s", m->chat_error);
    strbuf vars;
    sb_init(&vars);
    json_doc *doc = NULL;
    ferry_status st = build_vars(m, messages, tools, kwargs, &vars);
    if (st == FERRY_OK) st = json_parse(vars.data, vars.len, &doc);
    sb_free(&vars);
    /* what the template writes is encoded next: no more than the tokenizer takes */
    size_t max = max_out < m->max_text ? max_out : m->max_text;
    if (st == FERRY_OK) st = tmpl_render(m->tmpl, json_doc_root(doc), max, out);
    if (st == FERRY_ERR_TOO_LARGE && max == m->max_text && strstr(ferry_errmsg(), "chat template output exceeds"))
        st = ferry_fail(st, "the chat template's output is more than this server encodes at once (%zu bytes, --max-text-bytes)",
                        max);
    json_doc_free(doc);
    return st;
}

/* ---- requests ------------------------------------------------------------------------ */

void text_stops_free(text_stops *s)
{
    for (int i = 0; i < s->n; i++) free(s->s[i]);
    memset(s, 0, sizeof *s);
}

size_t text_stops_bytes(const text_stops *s)
{
    size_t n = 0;
    for (int i = 0; i < s->n; i++) n += s->len[i] + 1;
    return n;
}

static ferry_status stop_add(text_stops *out, const json_value *v, const char *field, int at)
{
    char where[80];
    if (at < 0) snprintf(where, sizeof where, "%s", field);
    else snprintf(where, sizeof where, "%s[%d]", field, at);
    if (v->type != JSON_STRING) return ferry_fail(FERRY_ERR_INVALID, "%s must be a string", where);
    if (v->len == 0) return ferry_fail(FERRY_ERR_INVALID, "%s is an empty string", where);
    if (v->len > TEXT_MAX_STOP_BYTES)
        return ferry_fail(FERRY_ERR_INVALID, "%s is %zu bytes (at most %d)", where, v->len, TEXT_MAX_STOP_BYTES);
    char *s = malloc(v->len + 1);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    memcpy(s, v->str, v->len + 1);
    out->s[out->n] = s;
    out->len[out->n++] = v->len;
    return FERRY_OK;
}

ferry_status text_stops_parse(const json_value *v, const char *field, text_stops *out)
{
    memset(out, 0, sizeof *out);
    if (!v || v->type == JSON_NULL) return FERRY_OK;
    ferry_status st = FERRY_OK;
    if (v->type == JSON_STRING) {
        st = stop_add(out, v, field, -1);
    } else if (v->type == JSON_ARRAY) {
        if (v->len > TEXT_MAX_STOPS)
            return ferry_fail(FERRY_ERR_INVALID, "%s: at most %d stop strings (got %zu)", field, TEXT_MAX_STOPS, v->len);
        for (size_t i = 0; i < v->len && st == FERRY_OK; i++) st = stop_add(out, &v->items[i], field, (int)i);
    } else {
        st = ferry_fail(FERRY_ERR_INVALID, "%s must be a string or a list of strings", field);
    }
    if (st != FERRY_OK) text_stops_free(out);
    return st;
}

ferry_status text_request_defaults(const text_model *m, gen_params *p, bool ignore_eos)
{
    if (m->sampling.has_temperature && !p->given[GEN_temperature]) p->sampling.temperature = m->sampling.temperature;
    if (m->sampling.has_top_p && !p->given[GEN_top_p]) p->sampling.top_p = m->sampling.top_p;
    if (m->sampling.has_top_k && !p->given[GEN_top_k]) p->sampling.top_k = m->sampling.top_k;
    if (ignore_eos) return FERRY_OK;
    for (int i = 0; i < m->n_eos; i++) {
        bool have = false;
        for (int k = 0; k < p->n_stop; k++) have |= p->stop_ids[k] == m->eos[i];
        if (have) continue;
        if (p->n_stop == REQUEST_MAX_STOP)
            return ferry_fail(FERRY_ERR_INVALID, "the stop token ids and the model's %d end-of-sequence ids are more "
                              "than %d", m->n_eos, REQUEST_MAX_STOP);
        p->stop_ids[p->n_stop++] = m->eos[i];
    }
    return FERRY_OK;
}

/* ---- generated text ------------------------------------------------------------------ */

const char *text_finish_name(text_finish f)
{
    switch (f) {
    case TEXT_FINISH_STOP: return "stop";
    case TEXT_FINISH_LENGTH: return "length";
    case TEXT_FINISH_NONE: break;
    }
    return NULL;
}

/* Invariant (the stop window): `pending` holds exactly the text decoded
 * but not yet released, and it is never longer than the longest stop
 * string - 1 after a push returns: everything before the longest suffix
 * that is a proper prefix of a stop string has been released. Hence a stop
 * string that will ever match starts inside `pending` (an earlier start
 * would have made a longer held suffix), and searching `pending` alone
 * finds the first match of the whole text. Released text is never taken
 * back. */
struct text_stream {
    const text_model *m;
    tok_stream *ts;
    int32_t stop_ids[REQUEST_MAX_STOP];
    int n_stop_ids;
    int max_new;
    int n;               /* ids pushed */
    int32_t last;
    bool stopped;        /* a stop string matched */
    bool ended;
    text_stops stops;
    strbuf pending;      /* the stop window */
    strbuf fresh;        /* the text one push decoded */
};

ferry_status text_stream_new(const text_model *m, const gen_request *g, const text_stops *stops, text_stream **out)
{
    *out = NULL;
    if (m->error) return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s", m->error);
    text_stream *s = calloc(1, sizeof *s);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    s->m = m;
    s->ts = tok_stream_new(m->tok, true);
    memcpy(s->stop_ids, g->stop_ids, sizeof s->stop_ids);
    s->n_stop_ids = g->n_stop;
    s->max_new = g->max_new_tokens;
    s->last = -1;
    bool ok = s->ts != NULL;
    for (int i = 0; ok && stops && i < stops->n; i++) {
        if (!(s->stops.s[i] = malloc(stops->len[i] + 1))) ok = false;
        else {
            memcpy(s->stops.s[i], stops->s[i], stops->len[i] + 1);
            s->stops.len[i] = stops->len[i];
            s->stops.n = i + 1;
        }
    }
    if (!ok) {
        text_stream_free(s);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return FERRY_OK;
}

void text_stream_free(text_stream *s)
{
    if (!s) return;
    tok_stream_free(s->ts);
    text_stops_free(&s->stops);
    sb_free(&s->pending);
    sb_free(&s->fresh);
    free(s);
}

/* Moves pending[0..n) to delta. */
static void release(text_stream *s, size_t n, strbuf *delta)
{
    if (!n) return;
    sb_append(delta, s->pending.data, n);
    memmove(s->pending.data, s->pending.data + n, s->pending.len - n);
    s->pending.len -= n;
}

/* Looks for a stop string in the window; on a match releases what
 * precedes it and drops the rest. */
static bool match_stop(text_stream *s, strbuf *delta)
{
    const char *first = NULL;
    for (int i = 0; i < s->stops.n; i++) {
        const char *at = s->pending.len ? memmem(s->pending.data, s->pending.len, s->stops.s[i], s->stops.len[i]) : NULL;
        if (at && (!first || at < first)) first = at;
    }
    if (!first) return false;
    release(s, (size_t)(first - s->pending.data), delta);
    s->pending.len = 0;
    s->stopped = true;
    return true;
}

/* The length of the longest suffix of the window that is a proper prefix
 * of a stop string: the text that must stay held. */
static size_t held_suffix(const text_stream *s)
{
    size_t best = 0;
    for (int i = 0; i < s->stops.n; i++) {
        size_t k = s->stops.len[i] - 1 < s->pending.len ? s->stops.len[i] - 1 : s->pending.len;
        for (; k > best; k--)
            if (!memcmp(s->pending.data + s->pending.len - k, s->stops.s[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

bool text_stream_push(text_stream *s, int32_t id, strbuf *delta)
{
    if (s->stopped || s->ended) return s->stopped;
    s->n++;
    s->last = id;
    s->fresh.len = 0;
    /* a stop id ends the sequence; its text is not part of the answer
     * (vLLM's default, include_stop_str_in_output false) */
    for (int k = 0; k < s->n_stop_ids; k++)
        if (s->stop_ids[k] == id) return false;
    if (id >= 0 && id < tok_vocab_size(s->m->tok) && tok_stream_push(s->ts, id, &s->fresh) != FERRY_OK)
        s->fresh.len = 0; /* an id without text: nothing, as HF's decode */
    if (s->stops.n == 0) {
        put(delta, s->fresh.data, s->fresh.len);
        return false;
    }
    put(&s->pending, s->fresh.data, s->fresh.len);
    if (match_stop(s, delta)) return true;
    release(s, s->pending.len - held_suffix(s), delta);
    return false;
}

text_finish text_stream_end(text_stream *s, strbuf *delta)
{
    if (!s->ended && !s->stopped) {
        s->fresh.len = 0;
        tok_stream_flush(s->ts, &s->fresh);
        put(&s->pending, s->fresh.data, s->fresh.len);
        if (!match_stop(s, delta)) release(s, s->pending.len, delta);
    }
    s->ended = true;
    if (s->stopped) return TEXT_FINISH_STOP;
    for (int k = 0; s->n > 0 && k < s->n_stop_ids; k++)
        if (s->stop_ids[k] == s->last) return TEXT_FINISH_STOP;
    if (s->n >= s->max_new) return TEXT_FINISH_LENGTH;
    return TEXT_FINISH_NONE;
}

int text_stream_tokens(const text_stream *s) { return s->n; }

bool text_stream_failed(const text_stream *s) { return s->fresh.oom || s->pending.oom; }
