/*
 * test_chat_template.c - the chat-template interpreter (text/
 * chat_template.h) on its own: what it renders, which errors it gives and
 * when, and that hostile templates end with an error instead of a crash or
 * a hang. (Byte-for-byte agreement with Python jinja2 on real templates is
 * tests/integration/test_chat_template.py.)
 *
 * Covers: rendering with whitespace control and loops; parse errors that
 * name the construct and its line (unsupported filters, tests, statements,
 * methods, recursive loops, unclosed blocks, break outside a loop, invalid
 * UTF-8); render errors (raise_exception with the template's own message,
 * type errors, attribute of undefined); jinja's undefined (prints "",
 * iterates empty, is falsy, equals undefined, fails on use); the limits
 * (loop iterations, macro recursion, nesting, output size, memory); the
 * variables argument; and concurrent renders of one parsed template.
 */
#include <pthread.h>
#include <stdlib.h>

#include "../../engine/base/json.h"
#include "../../text/chat_template.h"
#include "check.h"

#define MAX_OUT ((size_t)1 << 20)

/* Renders src with the variables in vars_json ("{}" if NULL). Returns the
 * status of the first step that failed; *out (malloc'd) holds the text on
 * success. */
static ferry_status render(const char *src, const char *vars_json, size_t max_out, char **out)
{
    *out = NULL;
    chat_template *t = NULL;
    ferry_status st = tmpl_parse(src, strlen(src), "chat template", &t);
    if (st != FERRY_OK) return st;
    json_doc *doc = NULL;
    if (!vars_json) vars_json = "{}";
    if (json_parse(vars_json, strlen(vars_json), &doc) != FERRY_OK) {
        fprintf(stderr, "bad test JSON: %s\n", vars_json);
        abort();
    }
    strbuf sb;
    sb_init(&sb);
    st = tmpl_render(t, json_doc_root(doc), max_out, &sb);
    if (st == FERRY_OK) *out = strdup(sb.data ? sb.data : "");
    sb_free(&sb);
    json_doc_free(doc);
    tmpl_free(t);
    return st;
}

/* One case: a template, its variables as JSON (NULL: none) and what it
 * gives - the text `want` (st FERRY_OK), or a failure with status st whose
 * message contains `want`. */
typedef struct {
    const char *src, *vars;
    ferry_status st;
    const char *want;
} render_case;

/* renders and compares; on a failure names the table, the case and the template */
static void check_case(const char *table, size_t i, const render_case *c)
{
    char *got;
    ferry_status st = render(c->src, c->vars, MAX_OUT, &got);
    check_count++;
    if (c->st == FERRY_OK && st != FERRY_OK) {
        fprintf(stderr, "%s: %s[%zu]: %s: failed (%s): %s\n", __FILE__, table, i, c->src, ferry_status_name(st),
                ferry_errmsg());
        check_failures++;
    } else if (c->st == FERRY_OK && strcmp(got, c->want) != 0) {
        fprintf(stderr, "%s: %s[%zu]: %s: expected \"%s\", got \"%s\"\n", __FILE__, table, i, c->src, c->want, got);
        check_failures++;
    } else if (c->st != FERRY_OK && (st != c->st || !strstr(ferry_errmsg(), c->want))) {
        fprintf(stderr, "%s: %s[%zu]: %.120s: expected %s with \"%s\", got %s: \"%s\" (output \"%.80s\")\n", __FILE__,
                table, i, c->src, ferry_status_name(c->st), c->want, ferry_status_name(st),
                st == FERRY_OK ? "" : ferry_errmsg(), got ? got : "");
        check_failures++;
    }
    free(got);
}

#define CHECK_CASES(table)                                                                         \
    for (size_t i_ = 0; i_ < sizeof table / sizeof table[0]; i_++) check_case(#table, i_, &table[i_])

/* expects tmpl_parse itself to fail with INVALID and msg */
static void check_parse_error(const char *table, size_t i, const char *src, const char *msg)
{
    chat_template *t = NULL;
    ferry_status st = tmpl_parse(src, strlen(src), "chat template", &t);
    check_count++;
    if (st != FERRY_ERR_INVALID || t || !strstr(ferry_errmsg(), msg)) {
        fprintf(stderr, "%s: %s[%zu]: %s: expected a parse error with \"%s\", got %s: \"%s\"\n", __FILE__, table, i,
                src, msg, ferry_status_name(st), st == FERRY_OK ? "" : ferry_errmsg());
        check_failures++;
    }
    tmpl_free(t);
}

/* ---- rendering ---------------------------------------------------------- */

static const render_case renders[] = {
    {"Hello {{ name }}!", "{\"name\": \"W\\u00f6rld\"}", FERRY_OK, "Hello Wörld!"},
    {"{% for m in messages %}<{{ m.role }}>{{ m['content'] }}{% endfor %}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}",
     FERRY_OK, "<user>hi<assistant>yo"},
    /* trim_blocks and lstrip_blocks are on, as in transformers */
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, FERRY_OK, "a\n  b\nc"},
    {"a  {%- if true -%}  b  {%- endif -%}  c", NULL, FERRY_OK, "abc"},
    {"{{ 'x' }}\n{{ 'y' }}\n", NULL, FERRY_OK, "x\ny"}, /* one final newline is dropped */
    {"{% raw %}{{ not evaluated }}{% endraw %}", NULL, FERRY_OK, "{{ not evaluated }}"},
    {"{# comment #}x{#- c -#}  y", NULL, FERRY_OK, "xy"},
    /* the message text is never evaluated */
    {"{{ c }}", "{\"c\": \"{{ 1 + 1 }} {% if %}\"}", FERRY_OK, "{{ 1 + 1 }} {% if %}"},
    /* Python's str() of values */
    {"{{ [1, 'a', none, true, 1.0, {'k': \"it's\"}] }}", NULL, FERRY_OK, "[1, 'a', None, True, 1.0, {'k': \"it's\"}]"},
    {"{{ 1e-5 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 7 // -2 }} {{ -7 % 3 }}", NULL, FERRY_OK,
     "1e-05 1e+16 0.30000000000000004 -4 2"},
    {"{{ v|tojson }}", "{\"v\": {\"a\": [1, 2.5, \"\\u00e9\", null]}}", FERRY_OK, "{\"a\": [1, 2.5, \"é\", null]}"},
    {"{{ v|tojson(indent=2) }}", "{\"v\": {\"a\": [1]}}", FERRY_OK, "{\n  \"a\": [\n    1\n  ]\n}"},
    /* loop variables, namespace, slicing, filters, tests */
    {"{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ '|' if not loop.last }}{% endfor %}", NULL, FERRY_OK, "1a|2b|3c"},
    {"{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", NULL,
     FERRY_OK, "6"},
    {"{{ 'héllo'[::-1] }}|{{ [1, 2, 3][1:] }}|{{ 'abc'[-1] }}", NULL, FERRY_OK, "olléh|[2, 3]|c"},
    {"{{ '  x  '|trim }}|{{ [3, 1, 2]|sort|join(',') }}|{{ none|default('d') }}|{{ 'a' is string }}", NULL,
     FERRY_OK, "x|1,2,3|None|True"},
    {"{{ m.content.split('</think>')[-1].lstrip('\\n') }}", "{\"m\": {\"content\": \"<think>a</think>\\n\\nb\"}}",
     FERRY_OK, "b"},
    {"{% macro greet(n, p='!') %}Hi {{ n }}{{ p }}{% endmacro %}{{ greet('a') }}{{ greet('b', p='?') }}", NULL,
     FERRY_OK, "Hi a!Hi b?"},
    {"{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
     "{{ x }}{% endfor %}",
     NULL, FERRY_OK, "13"},
    {"{% generation %}gen{% endgeneration %}", NULL, FERRY_OK, "gen"},
    /* a set inside a loop is gone after the iteration (jinja's scoping) */
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, FERRY_OK, "1"},
    /* a name the template assigns later is undefined in a loop before that */
    {"{% for i in [1] %}[{{ s }}]{% endfor %}{% set s = 'late' %}{{ s }}", "{\"s\": \"caller\"}", FERRY_OK, "[]late"},
    /* caller keywords and the globals */
    {"{{ enable_thinking }}{{ range(3)|list }}", "{\"enable_thinking\": false}", FERRY_OK, "False[0, 1, 2]"},
    /* items near the ends of int64 (i * step overflows int64 before a + ...) */
    {"{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|list }}", NULL, FERRY_OK,
     "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]"},
    {"{{ range(9223372036854775807, -9223372036854775807, -4611686018427387904)|list }}", NULL, FERRY_OK,
     "[9223372036854775807, 4611686018427387903, -1, -4611686018427387905]"},
    {"", NULL, FERRY_OK, ""},
};

/* ---- errors ------------------------------------------------------------- */

/* template, a part of the message */
static const char *const parse_errors[][2] = {
    {"line1\n{{ x | wordwrap(5) }}", "chat template line 2: filter 'wordwrap' is not supported"},
    {"{{ x | nosuchfilter }}", "line 1: filter 'nosuchfilter' does not exist"},
    {"\n\n{% set y = x is nosuchtest %}", "line 3: test 'nosuchtest' does not exist"},
    {"{% include 'other' %}", "line 1: statement 'include' is not supported"},
    {"{% frobnicate %}", "line 1: unknown statement 'frobnicate'"},
    {"a\nb\n{% for x in y recursive %}{% endfor %}", "line 3: recursive for loops are not supported"},
    {"{{ s.encode('utf-8') }}", "method 'encode' is not supported"},
    {"{{ f(*args) }}", "argument unpacking"},
    {"{% if x %}\nno end", "unexpected end of template, expected 'elif' or 'else' or 'endif'"},
    {"{% for x in y %}{% endif %}", "unexpected 'endif'"},
    {"{{ x ", "line 1: unexpected end of template inside a tag"},
    {"{{ 1 + }}", "unexpected 'end of print statement'"},
    {"{% break %}", "'break' outside loop"},
    {"{% for x in y %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", "'continue' outside loop"},
    {"{# open", "missing end of comment tag"},
    {"{% raw %} open", "missing end of raw directive"},
    {"{{ 'unterminated }}", "unterminated string"},
    {"{{ x['a' }}", "unexpected '}'"},
    {"{{ x | map('wordwrap') }}", "filter 'wordwrap' is not supported"},
    {"{{ 99999999999999999999 }}", "too large"},
    {"{% set 1 = 2 %}", "can't assign"},
    {"ok\xff", "not valid UTF-8 (byte 2)"},
};

static void test_parse_errors(void)
{
    for (size_t i = 0; i < sizeof parse_errors / sizeof parse_errors[0]; i++)
        check_parse_error("parse_errors", i, parse_errors[i][0], parse_errors[i][1]);

    /* nesting past the limit is an error at parse time, not a stack overflow */
    char *deep = malloc(20000);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 5000; i++) strcat(deep + 3 + i, "(");
    size_t n = strlen(deep);
    deep[n] = '1';
    for (int i = 0; i < 5000; i++) deep[n + 1 + i] = ')';
    strcpy(deep + n + 5001, " }}");
    check_parse_error("deep", 0, deep, "nested too deeply");
    free(deep);
    char *chain = malloc(60000);
    strcpy(chain, "{{ 1");
    for (int i = 0; i < 10000; i++) strcat(chain + 4 + 4 * i, " + 1");
    strcat(chain, " }}");
    check_parse_error("chain", 0, chain, "nested too deeply");
    free(chain);

    /* thousands of distinct names: a bound on every per-name table */
    strbuf names;
    sb_init(&names);
    for (int i = 0; i < 5000; i++) sb_printf(&names, "{{ n%d }}", i);
    check_parse_error("names", 0, names.data, "too many distinct names (limit 4096)");
    sb_free(&names);

    /* a source past the limit is refused before anything else */
    size_t big = (1u << 20) + 1;
    char *src = malloc(big);
    memset(src, 'a', big);
    chat_template *t = NULL;
    CHECK_STATUS(tmpl_parse(src, big, "chat template", &t), FERRY_ERR_TOO_LARGE);
    CHECK(t == NULL);
    free(src);
}

static const render_case render_errors[] = {
    /* raise_exception carries the template's own words */
    {"{% if messages|length > 1 %}{{ raise_exception('Roles must alternate!') }}{% endif %}", "{\"messages\": [1, 2]}",
     FERRY_ERR_INVALID, "Roles must alternate!"},
    {"\n{{ 'a' + 1 }}", NULL, FERRY_ERR_INVALID, "chat template line 2: unsupported operand type(s) for +: 'str' and 'int'"},
    {"{{ 1 / 0 }}", NULL, FERRY_ERR_INVALID, "division by zero"},
    {"{{ 1 < 'a' }}", NULL, FERRY_ERR_INVALID, "'<' not supported between instances of 'int' and 'str'"},
    {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, FERRY_ERR_INVALID, "too many values to unpack (expected 2, got 3)"},
    {"{{ [1].append(2) }}", NULL, FERRY_ERR_INVALID, "'append' is unsafe"},
    {"{% set d.x = 1 %}", "{\"d\": {}}", FERRY_ERR_INVALID, "cannot assign attribute on non-namespace object"},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, FERRY_ERR_INVALID, "macro 'm' takes not more than 1 argument(s)"},
    {"{{ x|select('odd') }}", "{\"x\": [1]}", FERRY_ERR_UNSUPPORTED, "printing a generator"},
    {"{{ cycler(1) }}", NULL, FERRY_ERR_UNSUPPORTED, "function 'cycler' is not supported"},
    {"{{ 9223372036854775807 + 1 }}", NULL, FERRY_ERR_UNSUPPORTED, "integer overflow"},
    /* inside an if (or a conditional expression) an unknown filter fails only when it runs, as in jinja */
    {"{% if 'markdown' is filter %}{{ x|markdown }}{% else %}plain{% endif %}", NULL, FERRY_OK, "plain"},
    {"{% if true %}\n{{ x|markdown }}{% endif %}", NULL, FERRY_ERR_INVALID, "line 2: no filter named 'markdown'"},
    {"{{ x|nosuch if false else 'ok' }}", NULL, FERRY_OK, "ok"},
};

static void test_render_errors(void)
{
    CHECK_CASES(render_errors);
    /* the message is the template's words and nothing else */
    char *out;
    CHECK_STATUS(render("{{ raise_exception('exact') }}", NULL, MAX_OUT, &out), FERRY_ERR_INVALID);
    CHECK_EQ_STR(ferry_errmsg(), "exact");
}

/* jinja2's default Undefined: printable and iterable, fails on any other use */
static const render_case undefined[] = {
    {"[{{ missing }}]", NULL, FERRY_OK, "[]"},
    {"{% for x in missing %}x{% else %}empty{% endfor %}", NULL, FERRY_OK, "empty"},
    {"{{ missing is defined }}{{ missing is undefined }}{{ not missing }}{{ missing|length }}", NULL, FERRY_OK,
     "FalseTrueTrue0"},
    {"{{ missing|default('d') }}{{ missing == other }}{{ missing ~ 'x' }}{{ 'a' in missing }}", NULL, FERRY_OK,
     "dTruexFalse"},
    {"{{ d.nokey }}|{{ d['nokey'] }}|{{ l[10] }}|{{ n.attr }}", "{\"d\": {}, \"l\": [], \"n\": null}", FERRY_OK, "|||"},
    {"{{ (d.nokey) is defined }}", "{\"d\": {}}", FERRY_OK, "False"},
    {"{{ missing.attr }}", NULL, FERRY_ERR_INVALID, "'missing' is undefined"},
    {"{{ d.nokey.deeper }}", "{\"d\": {}}", FERRY_ERR_INVALID, "nokey"},
    {"{{ missing + 1 }}", NULL, FERRY_ERR_INVALID, "'missing' is undefined"},
    {"{{ missing() }}", NULL, FERRY_ERR_INVALID, "'missing' is undefined"},
    {"{{ missing < 1 }}", NULL, FERRY_ERR_INVALID, "'missing' is undefined"},
    {"{{ missing|tojson }}", NULL, FERRY_ERR_INVALID, "not JSON serializable"},
};

/* ---- limits --------------------------------------------------------------- */

/* every operation on two 4 MB strings is charged by the bytes it reads:
 * 2000 of them (16 GB read) end at the work limit */
#define TWO_LONG "{% set a = 'x' * 4000000 %}{% set b = 'x' * 4000000 %}{% set d = {b: 1} %}{% set l = [b] %}" \
                 "{% for i in range(2000) %}"

static const render_case limits[] = {
    /* 10^10 iterations end at the iteration cap */
    {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE,
     "loop iterations"},
    /* unbounded recursion ends at the macro depth limit */
    {"{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, FERRY_ERR_INVALID, "nested too deeply"},
    /* a string doubling 60 times passes the memory budget */
    {"{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL,
     FERRY_ERR_TOO_LARGE, ""},
    {"{{ 'x' * 100000000000 }}", NULL, FERRY_ERR_TOO_LARGE, "too large"},
    {"{{ range(1000000)|list }}", NULL, FERRY_ERR_TOO_LARGE, "range too big"},
    {TWO_LONG "{% if a == b %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    {TWO_LONG "{% if a < b %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    {TWO_LONG "{% if a.startswith(b) %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    {TWO_LONG "{% if a.endswith(b) %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    {TWO_LONG "{% if a in l %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    {TWO_LONG "{% if a in d %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    {TWO_LONG "{% if a.removeprefix(b) %}{% endif %}{% endfor %}", NULL, FERRY_ERR_TOO_LARGE, "work limit"},
    /* values nested deeper than the printers allow */
    {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}", NULL,
     FERRY_ERR_INVALID, "nested too deeply"},
};

#undef TWO_LONG

static void test_limits(void)
{
    CHECK_CASES(limits);
    /* the output limit */
    char *out;
    CHECK_STATUS(render("{% for i in range(100) %}0123456789{% endfor %}", NULL, 999, &out), FERRY_ERR_TOO_LARGE);
    CHECK_MSG_HAS("exceeds 999 bytes");
    CHECK_STATUS(render("{% for i in range(100) %}0123456789{% endfor %}", NULL, 1000, &out), FERRY_OK);
    CHECK(out && strlen(out) == 1000);
    free(out);
    CHECK_STATUS(render("{{ 'x' * 5000 }}", NULL, 4999, &out), FERRY_ERR_TOO_LARGE);
    /* a long but legitimate conversation renders well within the limits */
    strbuf vars;
    sb_init(&vars);
    sb_puts(&vars, "{\"messages\": [");
    for (int i = 0; i < 2000; i++) sb_printf(&vars, "%s{\"role\": \"%s\", \"content\": \"message %d\"}", i ? ", " : "", i % 2 ? "assistant" : "user", i);
    sb_puts(&vars, "]}");
    CHECK_STATUS(render("{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.role ~ ':' ~ m.content ~ '\\n' %}"
                        "{% endfor %}{{ ns.s|length }}",
                        vars.data, MAX_OUT, &out),
                 FERRY_OK);
    CHECK(out && atoi(out) > 30000);
    free(out);
    sb_free(&vars);

    /* many variables in one frame, set again on every iteration: scopes stay fast */
    strbuf many;
    sb_init(&many);
    sb_puts(&many, "{% for i in range(300) %}");
    for (int i = 0; i < 3000; i++) sb_printf(&many, "{%% set v%d = i %%}", i);
    sb_puts(&many, "{% endfor %}{{ v1 is defined }}");
    CHECK_STATUS(render(many.data, NULL, MAX_OUT, &out), FERRY_OK);
    CHECK_EQ_STR(out, "False");
    free(out);
    sb_free(&many);
}

static void test_api(void)
{
    chat_template *t = NULL;
    CHECK_STATUS(tmpl_parse("{{ x }}", 7, "my template", &t), FERRY_OK);
    json_doc *doc = NULL;
    CHECK_STATUS(json_parse("[1]", 3, &doc), FERRY_OK);
    strbuf sb;
    sb_init(&sb);
    CHECK_STATUS(tmpl_render(t, json_doc_root(doc), MAX_OUT, &sb), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("must be a JSON object");
    json_doc_free(doc);
    tmpl_free(t);
    CHECK_STATUS(tmpl_parse("{{ x.y.z }}", 11, "my template", &t), FERRY_OK);
    CHECK_STATUS(json_parse("{}", 2, &doc), FERRY_OK);
    CHECK_STATUS(tmpl_render(t, json_doc_root(doc), MAX_OUT, &sb), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("my template line 1:");
    /* output is appended to what the buffer holds */
    sb_puts(&sb, "prefix:");
    tmpl_free(t);
    CHECK_STATUS(tmpl_parse("{{ 1 }}", 7, NULL, &t), FERRY_OK);
    CHECK_STATUS(tmpl_render(t, json_doc_root(doc), MAX_OUT, &sb), FERRY_OK);
    CHECK_EQ_STR(sb.data, "prefix:1");
    sb_free(&sb);
    json_doc_free(doc);
    tmpl_free(t);
    tmpl_free(NULL);
}

/* ---- threads ------------------------------------------------------------- */

typedef struct {
    const chat_template *t;
    const json_value *vars;
    const char *want;
    int bad;
} job;

static void *render_many(void *arg)
{
    job *j = arg;
    for (int i = 0; i < 200; i++) {
        strbuf sb;
        sb_init(&sb);
        if (tmpl_render(j->t, j->vars, MAX_OUT, &sb) != FERRY_OK || strcmp(sb.data, j->want) != 0) j->bad++;
        sb_free(&sb);
    }
    return NULL;
}

static void test_threads(void)
{
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "{{ m.role|upper }}:{{ m.content }};{% endfor %}{{ ns.n }}";
    const char *vars = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}";
    chat_template *t = NULL;
    json_doc *doc = NULL;
    CHECK_STATUS(tmpl_parse(src, strlen(src), "chat template", &t), FERRY_OK);
    CHECK_STATUS(json_parse(vars, strlen(vars), &doc), FERRY_OK);
    if (!t || !doc) return;
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, json_doc_root(doc), "USER:a;ASSISTANT:b;2", 0};
        pthread_create(&th[i], NULL, render_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(jobs[i].bad, 0);
    }
    json_doc_free(doc);
    tmpl_free(t);
}

int main(void)
{
    CHECK_CASES(renders);
    test_parse_errors();
    test_render_errors();
    CHECK_CASES(undefined);
    test_limits();
    test_api();
    test_threads();
    /* last: it cannot be undone */
    tmpl_cancel_renders();
    check_case("after tmpl_cancel_renders", 0,
               &(render_case){"{{ 1 }}", NULL, FERRY_ERR_BUSY, "the server is shutting down"});
    return check_report();
}
