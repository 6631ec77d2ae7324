/*
 * tokenizer.h - text <-> token ids, from the tokenizer.json (and
 * tokenizer_config.json) that ship with a Hugging Face checkpoint.
 *
 * Two model families are read, exactly as HF tokenizers runs them:
 * byte-level BPE with a Split regex pre-tokenizer (Llama 3.x, Qwen2/2.5/3,
 * Mistral Nemo) and SentencePiece-style BPE with byte fallback (Llama 2,
 * TinyLlama, Mistral 7B). Added tokens are split out of the text first. The
 * regexes run in PCRE2 as tokenizer.json writes them; utf8proc does the
 * Unicode normal forms. Anything else in a tokenizer.json (another model
 * type, normalizer, pre-tokenizer, decoder or post-processor) is an error
 * naming it, never an approximation.
 *
 * A loaded tokenizer is immutable: any number of threads may encode and
 * decode with it at once (a tok_stream belongs to one thread at a time).
 *
 * The reference is HF tokenizers 0.23's Tokenizer.from_file(...).encode()
 * and .decode(); the choices it leaves open, and where ferry departs:
 *  - BOS/EOS come from tokenizer.json's post_processor only. HF tokenizers
 *    does not read tokenizer_config.json's add_bos_token / add_eos_token
 *    (transformers' LlamaTokenizerFast rewrites the post-processor from
 *    them); neither does ferry.
 *  - Added tokens get the ids HF gives them: the vocabulary's id for a
 *    content in it, else the next id after the vocabulary, in file order.
 *    The "id" field is not what decides (real files agree with it).
 *  - decode(skip_special) drops a token whose text, as decode finds it, is
 *    a special token's content. An added token with "normalized": true is
 *    decoded as its normalized form, so HF 0.23 keeps Llama 2's <s> and </s>
 *    (seen as "▁<s>") even with skip_special. ferry does the same;
 *    tok_is_special answers by id.
 *  - A string merge that does not split at exactly one space is skipped,
 *    where HF refuses the file: Llama 2's tokenizer.json holds three ("▁  ")
 *    that only tokens with a literal space could use, which a normalizer
 *    that turns spaces into ▁ never produces.
 *  - truncation and padding are ignored (transformers sets them per call).
 *  - Regexes run in PCRE2 10.42 (Unicode 14) where HF runs Oniguruma
 *    (Unicode 15.1): characters assigned since Unicode 14 are no letters
 *    here, and case-insensitive matching does not fold "ß" into "SS".
 *  - A vocabulary string holding U+0000 is refused (json.h has no NUL in
 *    strings); token ids must be below 2^24.
 *  - An id outside the vocabulary is an error (HF drops it silently); a file
 *    HF would panic on gives an error or a plain result instead.
 */
#ifndef FERRY_TOKENIZER_H
#define FERRY_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/base/json.h"
#include "../engine/base/status.h"

typedef struct tokenizer tokenizer;

/* Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json.
 * FERRY_ERR_NOT_FOUND when dir has no tokenizer.json. */
ferry_status tok_load(const char *dir, tokenizer **out);
/* Parses the text of a tokenizer.json alone (no tokenizer_config.json: no
 * BOS/EOS token names, no chat template); label names it in errors. */
ferry_status tok_parse(const char *json, size_t len, const char *label, tokenizer **out);
void tok_free(tokenizer *t);

/* Highest token id + 1 (added tokens included). */
int tok_vocab_size(const tokenizer *t);

/* Encodes text[0..len) (any bytes; invalid UTF-8 is encoded as HF does:
 * each ill-formed sequence as U+FFFD, what Python's
 * bytes.decode('utf-8', 'replace') hands HF).
 * add_special: the post-processor's tokens (BOS/EOS) are added.
 * parse_special: the text of a special added token becomes its id; when
 * false it is encoded as ordinary text (user text must not smuggle control
 * tokens in). Non-special added tokens are always matched.
 * *ids is malloc'd; the caller frees it. */
ferry_status tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, int *n);

/* An upper bound on the bytes of text tok_encode works on for
 * text[0..len): the text after each ill-formed sequence becomes U+FFFD (3
 * bytes) and the normalizers have run. Each character is followed through
 * the Unicode forms at its full decomposition (NFC turns U+1D160 into 3
 * characters of 4 bytes; NFKC U+FDFA into 18), lowercase, and a Replace of
 * one character by its content (Llama 2's space to U+2581); a Prepend adds
 * its text once a stretch between added tokens; a Replace of any other
 * pattern multiplies by its content's length (and adds it at every position
 * when the pattern may match ""). A front end reserves by this, not len:
 * the text the encoder holds, and the ids it makes, grow with it. O(len),
 * a table lookup a character outside ASCII. */
size_t tok_encode_size(const tokenizer *t, const char *text, size_t len);

/* Appends the text of ids to out, as HF's decode(skip_special_tokens) does.
 * An id outside the vocabulary is FERRY_ERR_INVALID naming it. */
ferry_status tok_decode(const tokenizer *t, const int32_t *ids, int n, bool skip_special, strbuf *out);

/* Id of a token by its exact content (vocabulary or added token), or -1. */
int32_t tok_token_id(const tokenizer *t, const char *content);
/* Whether id is a special added token. */
bool tok_is_special(const tokenizer *t, int32_t id);

/* tokenizer_config.json's values ("" / NULL when absent). */
const char *tok_bos_token(const tokenizer *t);      /* e.g. "<s>", "<|begin_of_text|>", "" */
const char *tok_eos_token(const tokenizer *t);      /* e.g. "</s>", "<|im_end|>", "" */
const char *tok_chat_template(const tokenizer *t);  /* the "chat_template" string, NULL when none */

/* Streaming decode: feed generated ids one at a time; each push appends the
 * text that has become final. Bytes of an incomplete UTF-8 sequence are held
 * back until complete. The concatenation of everything pushed and flushed is
 * exactly tok_decode of all the ids (leading-space rules included).
 * (With byte fallback a run of <0xNN> tokens becomes final when a token that
 * is not one follows: HF turns a whole run with one bad byte into U+FFFD.) */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tokenizer *t, bool skip_special);
void tok_stream_free(tok_stream *s);
ferry_status tok_stream_push(tok_stream *s, int32_t id, strbuf *out);
/* At the end of generation: what is still held (an incomplete sequence
 * becomes U+FFFD, as decode would write it). */
void tok_stream_flush(tok_stream *s, strbuf *out);

#endif
