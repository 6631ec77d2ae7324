/*
 * test_json.c - the strict JSON reader and the strbuf writer (engine/json.h).
 *
 * Covers: well-formed documents (nesting, exact int64 integers, fractions and
 * exponents, every escape, \u escapes and surrogate pairs decoded to UTF-8,
 * raw multibyte UTF-8); the inputs RFC 8259 or ferry's stricter rules reject,
 * each with FERRY_ERR_INVALID and a byte offset in the message; the typed
 * json_get_* accessors; and the writer's output reading back unchanged.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "../../engine/base/json.h"
#include "check.h"

/* Length of a string literal, embedded NULs and all. */
#define LIT(s) (s), (sizeof(s) - 1)

static const json_value *root;
static json_doc *doc;

/* Parses text into the globals; NULL root on failure (with a message). */
static const json_value *parse(const char *text, size_t len)
{
    json_doc_free(doc);
    doc = NULL;
    root = NULL;
    ferry_status st = json_parse(text, len, &doc);
    if (st != FERRY_OK) {
        fprintf(stderr, "parse of %.*s failed: %s\n", (int)len, text, ferry_errmsg());
        return NULL;
    }
    root = json_doc_root(doc);
    return root;
}

/* ---- valid documents ---------------------------------------------------- */

static void test_nested(void)
{
    const char *t = " {\"a\": {\"b\": [1, [2, {\"c\": null}], true, false]}, \"s\": \"x\", \"e\": {}, \"ea\": []}\n";
    if (!parse(t, strlen(t))) { CHECK(!"nested document parses"); return; }
    CHECK_EQ_INT(root->type, JSON_OBJECT);
    CHECK_EQ_INT(root->len, 4);
    CHECK_EQ_STR(root->members[0].key, "a");
    CHECK_EQ_STR(root->members[3].key, "ea");
    const json_value *b = json_get(json_get(root, "a"), "b");
    CHECK(b && b->type == JSON_ARRAY);
    if (!b) return;
    CHECK_EQ_INT(b->len, 4);
    CHECK_EQ_INT(b->items[0].integer, 1);
    CHECK_EQ_INT(b->items[1].type, JSON_ARRAY);
    CHECK_EQ_INT(b->items[1].len, 2);
    CHECK_EQ_INT(b->items[1].items[1].type, JSON_OBJECT);
    CHECK_EQ_INT(json_get(&b->items[1].items[1], "c")->type, JSON_NULL);
    CHECK(b->items[2].type == JSON_BOOL && b->items[2].boolean);
    CHECK(b->items[3].type == JSON_BOOL && !b->items[3].boolean);
    CHECK_EQ_STR(json_get(root, "s")->str, "x");
    CHECK(json_get(root, "e")->type == JSON_OBJECT && json_get(root, "e")->len == 0);
    CHECK(json_get(root, "ea")->type == JSON_ARRAY && json_get(root, "ea")->len == 0);

    /* scalars are valid roots too */
    CHECK(parse(LIT("null")) && root->type == JSON_NULL);
    CHECK(parse(LIT("\"s\"")) && root->type == JSON_STRING);
    CHECK(parse(LIT(" 7 ")) && root->type == JSON_NUMBER);

    /* 100 levels is well under the limit */
    char deep[201];
    for (int i = 0; i < 100; i++) deep[i] = '[', deep[200 - 1 - i] = ']';
    CHECK(parse(deep, 200) != NULL);
}

/* Parses one number and checks is_int / integer / number. */
static void check_int(const char *text, int64_t want, int line)
{
    if (!parse(text, strlen(text)) || root->type != JSON_NUMBER || !root->is_int || root->integer != want) {
        fprintf(stderr, "%s:%d: %s: expected exact integer %" PRId64 ", got %s %" PRId64 "\n", __FILE__, line, text,
                want, root && root->is_int ? "integer" : "non-integer", root ? root->integer : 0);
        check_failures++;
    }
    check_count++;
}

static void check_real(const char *text, double want, int line)
{
    if (!parse(text, strlen(text)) || root->type != JSON_NUMBER || root->is_int || root->number != want) {
        fprintf(stderr, "%s:%d: %s: expected non-integer number %.17g, got is_int=%d number=%.17g\n", __FILE__,
                line, text, want, root ? root->is_int : -1, root ? root->number : 0.0);
        check_failures++;
    }
    check_count++;
}

static void test_numbers(void)
{
    check_int("0", 0, __LINE__);
    check_int("-0", 0, __LINE__);
    check_int("42", 42, __LINE__);
    check_int("-17", -17, __LINE__);
    check_int("9007199254740993", 9007199254740993LL, __LINE__); /* 2^53 + 1: not a double */
    check_int("9223372036854775807", INT64_MAX, __LINE__);
    check_int("-9223372036854775808", INT64_MIN, __LINE__);
    check_real("3.25", 3.25, __LINE__);
    check_real("-0.5", -0.5, __LINE__);
    check_real("1.0", 1.0, __LINE__);
    check_real("1e3", 1000.0, __LINE__);
    check_real("1E3", 1000.0, __LINE__);
    check_real("1.5e+2", 150.0, __LINE__);
    check_real("25e-2", 0.25, __LINE__);
    check_real("-1.25E-1", -0.125, __LINE__);

    /* one past int64: still a valid number, just not an exact integer */
    CHECK(parse(LIT("9223372036854775808")));
    if (root) {
        CHECK_EQ_INT(root->type, JSON_NUMBER);
        CHECK(!root->is_int);
        CHECK(root->number == 9223372036854775808.0);
    }
    CHECK(parse(LIT("-9223372036854775809")) && !root->is_int && root->number < -9.2e18);
    CHECK(parse(LIT("123456789012345678901234567890")) && !root->is_int && root->number > 1.2e29);

    /* the integer is exact inside a document as well */
    CHECK(parse(LIT("{\"n\": [9007199254740993]}")));
    if (root) CHECK_EQ_INT(json_get(root, "n")->items[0].integer, 9007199254740993LL);
}

/* Parses one JSON string literal and compares its decoded bytes. */
static void check_string(const char *text, size_t len, const char *want, size_t want_len, int line)
{
    check_count++;
    if (!parse(text, len) || root->type != JSON_STRING) {
        fprintf(stderr, "%s:%d: expected %.*s to parse as a string\n", __FILE__, line, (int)len, text);
        check_failures++;
        return;
    }
    if (root->len != want_len || memcmp(root->str, want, want_len) != 0 || root->str[want_len] != '\0') {
        fprintf(stderr, "%s:%d: %.*s: decoded to %zu bytes:", __FILE__, line, (int)len, text, root->len);
        for (size_t i = 0; i < root->len; i++) fprintf(stderr, " %02x", (unsigned char)root->str[i]);
        fprintf(stderr, " (expected %zu bytes)\n", want_len);
        check_failures++;
    }
}

#define CHECK_STRING(json, want) check_string(LIT(json), LIT(want), __LINE__)

static void test_strings(void)
{
    CHECK_STRING("\"\"", "");
    CHECK_STRING("\"plain\"", "plain");
    CHECK_STRING("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\" \\ / \b \f \n \r \t");
    CHECK_STRING("\"\\u00e9\"", "\xC3\xA9");
    CHECK_STRING("\"\\u00E9\"", "\xC3\xA9");
    CHECK_STRING("\"\\u0041\\u07ff\\u0800\\uffff\"", "A\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF");
    CHECK_STRING("\"\\ud83d\\ude00\"", "\xF0\x9F\x98\x80"); /* U+1F600 */
    CHECK_STRING("\"\\uDBFF\\uDFFF\"", "\xF4\x8F\xBF\xBF"); /* U+10FFFF */
    CHECK_STRING("\"h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80\"", "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80");
    CHECK_STRING("\"\x7F\"", "\x7F"); /* DEL is not a control character in JSON */

    /* keys are decoded the same way */
    CHECK(parse(LIT("{\"k\\u00e9\\n\": 1}")));
    if (root) {
        CHECK_EQ_STR(root->members[0].key, "k\xC3\xA9\n");
        CHECK_EQ_INT(root->members[0].key_len, 4);
        CHECK(json_get(root, "k\xC3\xA9\n") != NULL);
    }
}

/* ---- rejections --------------------------------------------------------- */

static void check_reject(const char *text, size_t len, const char *why, int line)
{
    json_doc *d = (json_doc *)1;
    ferry_status st = json_parse(text, len, &d);
    check_count++;
    if (st != FERRY_ERR_INVALID || d != NULL) {
        fprintf(stderr, "%s:%d: %s: expected FERRY_ERR_INVALID and no document for \"", __FILE__, line, why);
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)text[i];
            fprintf(stderr, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x", c);
        }
        fprintf(stderr, "\", got '%s' (%s)\n", ferry_status_name(st), ferry_errmsg());
        check_failures++;
        if (st == FERRY_OK) json_doc_free(d);
    } else if (!strstr(ferry_errmsg(), "at byte")) {
        fprintf(stderr, "%s:%d: %s: message lacks a byte offset: %s\n", __FILE__, line, why, ferry_errmsg());
        check_failures++;
    }
}

#define CHECK_REJECT(json, why) check_reject(LIT(json), why, __LINE__)

static void test_rejections(void)
{
    CHECK_REJECT("", "empty input");
    CHECK_REJECT("   \n", "only whitespace");
    CHECK_REJECT("{\"a\":1} x", "trailing garbage");
    CHECK_REJECT("1 2", "two values");
    CHECK_REJECT("[1,2,]", "trailing comma in array");
    CHECK_REJECT("{\"a\":1,}", "trailing comma in object");
    CHECK_REJECT("[,1]", "leading comma");
    CHECK_REJECT("[1 2]", "missing comma");
    CHECK_REJECT("{\"a\" 1}", "missing colon");
    CHECK_REJECT("{a:1}", "unquoted key");
    CHECK_REJECT("{1:1}", "number key");
    CHECK_REJECT("01", "leading zero");
    CHECK_REJECT("-01", "leading zero after minus");
    CHECK_REJECT("-", "lone minus");
    CHECK_REJECT(".5", "no integer part");
    CHECK_REJECT("+1", "plus sign");
    CHECK_REJECT("1.", "empty fraction");
    CHECK_REJECT("1e", "empty exponent");
    CHECK_REJECT("1e+", "signed empty exponent");
    CHECK_REJECT("0x10", "hex number");
    CHECK_REJECT("NaN", "NaN");
    CHECK_REJECT("Infinity", "Infinity");
    CHECK_REJECT("tru", "truncated literal");
    CHECK_REJECT("nulls", "literal with trailing letter");
    CHECK_REJECT("\"abc", "unterminated string");
    CHECK_REJECT("\"abc\\\"", "string ending in an escaped quote");
    CHECK_REJECT("\"abc\\", "string ending in a backslash");
    CHECK_REJECT("[1,2", "unterminated array");
    CHECK_REJECT("[", "lone bracket");
    CHECK_REJECT("{\"a\":1", "unterminated object");
    CHECK_REJECT("{\"a\":", "object missing its value");
    CHECK_REJECT("\"a\x01z\"", "control character in string");
    CHECK_REJECT("\"a\nz\"", "raw newline in string");
    CHECK_REJECT("\"a\x1Fz\"", "unit separator in string");
    CHECK_REJECT("\"\\x41\"", "unknown escape");
    CHECK_REJECT("\"\\u12G4\"", "bad hex digit");
    CHECK_REJECT("\"\\u12\"", "short \\u escape");
    CHECK_REJECT("\"\xC0\x80\"", "overlong NUL (C0 80)");
    CHECK_REJECT("\"\xC1\xBF\"", "overlong C1");
    CHECK_REJECT("\"\xE0\x80\xAF\"", "overlong three-byte");
    CHECK_REJECT("\"\xF0\x80\x80\xAF\"", "overlong four-byte");
    CHECK_REJECT("\"\xED\xA0\x80\"", "UTF-8 encoded surrogate (ED A0 80)");
    CHECK_REJECT("\"\xF5\x80\x80\x80\"", "F5 lead byte");
    CHECK_REJECT("\"\xF4\x90\x80\x80\"", "above U+10FFFF");
    CHECK_REJECT("\"\xFF\"", "FF byte");
    CHECK_REJECT("\"\x80\"", "lone continuation byte");
    CHECK_REJECT("\"\xE2\x82\"", "truncated three-byte sequence");
    CHECK_REJECT("\"\xF0\x9F\x98\"", "truncated four-byte sequence");
    CHECK_REJECT("\"\xC3", "truncated sequence at end of input");
    CHECK_REJECT("{\"\xC3\":1}", "invalid UTF-8 in a key");
    CHECK_REJECT("\"\\ud83d\"", "lone high surrogate");
    CHECK_REJECT("\"\\ude00\"", "lone low surrogate");
    CHECK_REJECT("\"\\ud83dx\"", "high surrogate followed by a letter");
    CHECK_REJECT("\"\\ud83d\\u0041\"", "high surrogate followed by a non-surrogate");
    CHECK_REJECT("\"\\ud83d\\ud83d\"", "two high surrogates");
    CHECK_REJECT("\"\\u0000\"", "\\u0000");
    CHECK_REJECT("\"a\\u0000b\"", "\\u0000 inside a string");
    CHECK_REJECT("\x00", "NUL byte");
    CHECK_REJECT("[1]\x00", "NUL after the value");

    char deep[400];
    for (int i = 0; i < 200; i++) deep[i] = '[', deep[400 - 1 - i] = ']';
    check_reject(deep, sizeof deep, "nesting depth 200", __LINE__);
    for (int i = 0; i < 200; i++) deep[i] = '[';
    check_reject(deep, 200, "200 unclosed brackets", __LINE__);

    /* the message says where */
    json_doc *d;
    CHECK_STATUS(json_parse(LIT("[1, x]"), &d), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("at byte 4");
}

/* ---- json_get and the typed accessors ----------------------------------- */

static void test_get(void)
{
    const char *t = "{\"i\": 5, \"f\": 2.5, \"b\": true, \"s\": \"hi\", \"n\": null, \"d\": 1, \"d\": 2, \"big\": 1e400}";
    if (!parse(t, strlen(t))) { CHECK(!"accessor document parses"); return; }
    CHECK(json_get(root, "i") != NULL);
    CHECK(json_get(root, "absent") == NULL);
    CHECK(json_get(NULL, "i") == NULL);
    CHECK_EQ_INT(json_get(root, "d")->integer, 2); /* the last of duplicates, as in Python */
    CHECK(json_get(json_get(root, "i"), "i") == NULL); /* not an object */

    int64_t i = -1;
    double f = -1;
    bool b = false, bad = false;
    CHECK(json_get_int(root, "i", &i, &bad) && i == 5 && !bad);
    i = -1;
    CHECK(!json_get_int(root, "absent", &i, &bad) && i == -1 && !bad);
    CHECK(!json_get_int(root, "n", &i, &bad) && i == -1 && !bad);
    CHECK(!json_get_int(root, "s", &i, &bad) && bad);
    bad = false;
    CHECK(!json_get_int(root, "f", &i, &bad) && bad); /* a fraction is not an int */
    bad = false;
    CHECK(!json_get_int(root, "big", &i, &bad) && bad);
    bad = false;

    CHECK(json_get_num(root, "f", &f, &bad) && f == 2.5 && !bad);
    CHECK(json_get_num(root, "i", &f, &bad) && f == 5.0 && !bad);
    f = -1;
    CHECK(!json_get_num(root, "absent", &f, &bad) && f == -1 && !bad);
    CHECK(!json_get_num(root, "n", &f, &bad) && !bad);
    CHECK(!json_get_num(root, "b", &f, &bad) && bad);
    bad = false;

    CHECK(json_get_bool(root, "b", &b, &bad) && b && !bad);
    CHECK(!json_get_bool(root, "absent", &b, &bad) && !bad);
    CHECK(!json_get_bool(root, "n", &b, &bad) && !bad);
    CHECK(!json_get_bool(root, "i", &b, &bad) && bad);
    bad = false;

    CHECK_EQ_STR(json_get_str(root, "s", &bad), "hi");
    CHECK(!bad);
    CHECK(json_get_str(root, "absent", &bad) == NULL && !bad);
    CHECK(json_get_str(root, "n", &bad) == NULL && !bad);
    CHECK(json_get_str(root, "i", &bad) == NULL && bad);
}

/* ---- writer ------------------------------------------------------------- */

static void check_str_roundtrip(const char *s, int line)
{
    strbuf sb;
    sb_init(&sb);
    sb_json_str(&sb, s);
    check_count++;
    if (sb.oom || !parse(sb.data, sb.len) || root->type != JSON_STRING || strcmp(root->str, s) != 0) {
        fprintf(stderr, "%s:%d: sb_json_str output %s did not read back as the original\n", __FILE__, line,
                sb.data ? sb.data : "(null)");
        check_failures++;
    }
    sb_free(&sb);
}

static void check_f32_roundtrip(float v, int line)
{
    strbuf sb;
    sb_init(&sb);
    sb_json_f32(&sb, v);
    check_count++;
    if (!parse(sb.data, sb.len) || root->type != JSON_NUMBER || (float)root->number != v ||
        signbit((float)root->number) != signbit(v)) {
        fprintf(stderr, "%s:%d: sb_json_f32(%.9g) wrote %s, which reads back as %.9g\n", __FILE__, line, (double)v,
                sb.data, root ? root->number : 0.0);
        check_failures++;
    }
    sb_free(&sb);
}

static void test_writer(void)
{
    char all_controls[32];
    for (int i = 1; i < 32; i++) all_controls[i - 1] = (char)i;
    all_controls[31] = '\0';
    check_str_roundtrip("", __LINE__);
    check_str_roundtrip("plain", __LINE__);
    check_str_roundtrip("quote \" backslash \\ slash / tab \t nl \n cr \r", __LINE__);
    check_str_roundtrip(all_controls, __LINE__);
    check_str_roundtrip("\x7F h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", __LINE__);

    strbuf sb;
    sb_init(&sb);
    sb_json_str(&sb, "a\"\\\n\x01");
    CHECK_EQ_STR(sb.data, "\"a\\\"\\\\\\n\\u0001\"");
    sb_free(&sb);

    /* a long build through sb_printf, sb_putc and sb_append */
    sb_init(&sb);
    sb_putc(&sb, '[');
    for (int i = 0; i < 1000; i++) sb_printf(&sb, "%s%d", i ? "," : "", i);
    sb_append(&sb, "]", 1);
    CHECK(!sb.oom && sb.len == strlen(sb.data));
    CHECK(parse(sb.data, sb.len) && root->len == 1000 && root->items[999].integer == 999);
    sb_free(&sb);

    check_f32_roundtrip(0.1f, __LINE__);
    check_f32_roundtrip(1.0f / 3.0f, __LINE__);
    check_f32_roundtrip(-0.0f, __LINE__);
    check_f32_roundtrip(FLT_MAX, __LINE__);
    check_f32_roundtrip(FLT_MIN, __LINE__);
    check_f32_roundtrip(1e-45f, __LINE__); /* smallest subnormal */
    check_f32_roundtrip(16777217.0f, __LINE__);

    sb_init(&sb);
    sb_json_f32(&sb, NAN);
    sb_putc(&sb, ' ');
    sb_json_f32(&sb, -INFINITY);
    CHECK_EQ_STR(sb.data, "null null");
    sb_free(&sb);
}

int main(void)
{
    test_nested();
    test_numbers();
    test_strings();
    test_rejections();
    test_get();
    test_writer();
    json_doc_free(doc);
    return check_report();
}
