/* attention.c: torch.nn.MultiheadAttention (eval, dropout 0) in C11 with libc and libm only, as a program
 * for tparity's any-language protocol:
 *
 *     cc -std=c11 -O2 -Wall -Wextra -o attention attention.c -lm
 *     tparity exec -- ./attention {problem} {out} {dtype}
 *
 * `attention PROBLEM OUT DTYPE` reads the problem file (tparity's fixture format, version 1 or 2, tensors
 * inline), computes the module in DTYPE ("float32": C float throughout, accumulating in float; "float64":
 * double) and writes OUT, through OUT.tmp and a rename:
 *
 *     {"format": "tparity.outputs", "version": 1, "dtype": DTYPE,
 *      "outputs": {"output": T, "attn_weights": T}}          (attn_weights only when need_weights)
 *
 * or, for a module or an option it does not implement (exit status 0 as well):
 *
 *     {"format": "tparity.outputs", "version": 1, "unsupported": "one line why"}
 *
 * Exit status: 0 written, 1 the problem could not be read or computed or OUT not written (one line on
 * stderr naming the file and the field), 2 bad usage.
 *
 * Implemented: the packed in-projection (kdim == vdim == embed_dim), with or without bias; batched input,
 * batch-first or sequence-first, and unbatched; attn_mask (L, S) or (B*H, L, S), key_padding_mask (B, S)
 * or (S) unbatched, each bool (true = masked out) or float (added); need_weights, average_attn_weights.
 * Not implemented (answered "unsupported"): kdim or vdim other than embed_dim, add_bias_kv, add_zero_attn,
 * dropout other than 0, any other config or forward key, tensors in a safetensors file ("tensor_file").
 *
 * Semantics: those of the torch that produced the problem's reference (reference.torch; a version 1
 * problem: 1.13) where torch 1.13 and 2.x differ (tparity's README, "Semantics: torch 1.13 and 2.13"):
 * how attn_mask and key_padding_mask merge, and a row whose every key is masked with need_weights=false
 * (2.x: zero weights, hence a zero context; 1.13: NaN).
 *
 * The file has three parts: (1) a JSON parser and the problem reader, (2) the ops, written once over the
 * type REAL and compiled twice: this file includes itself with REAL defined as float, then as double,
 * (3) main. Errors end the program where they are found (die, unsupported): it is a short-lived program.
 */
#ifndef REAL /* ======== part 1: JSON, the problem, the outputs file ======================================= */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_problem = "(problem)"; /* the problem file's path: every message about it names it */
static const char *g_out = "(out)";         /* the outputs file's path */

/* One line on stderr, "attention: " and the message, then exit 1. */
static _Noreturn void fatal(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "attention: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

/* An error in the problem file, at field (e.g. "inputs.query.shape"; NULL: the file as a whole). */
static _Noreturn void die(const char *field, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "attention: %s: ", g_problem);
  if (field) fprintf(stderr, "%s: ", field);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

/* a * b, or the program ends: the sizes come from the problem file. */
static size_t checked_mul(size_t a, size_t b) {
  if (a != 0 && b > SIZE_MAX / a) fatal("%s: the tensors' sizes overflow", g_problem);
  return a * b;
}

/* count objects of size bytes (at least one byte, so that an empty tensor is a pointer too). */
static void *xmalloc(size_t count, size_t size) {
  size_t bytes = checked_mul(count, size);
  void *p = malloc(bytes ? bytes : 1);
  if (!p) fatal("out of memory (%zu bytes)", bytes);
  return p;
}

static void *xrealloc(void *p, size_t count, size_t size) {
  size_t bytes = checked_mul(count, size);
  void *q = realloc(p, bytes ? bytes : 1);
  if (!q) fatal("out of memory (%zu bytes)", bytes);
  return q;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xmalloc(n, 1), s, n);
}

/* ---- JSON ---------------------------------------------------------------------------------------------- */

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct Json {
  JsonType type;
  double number;      /* JSON_NUMBER */
  char *string;       /* JSON_STRING: UTF-8, NUL-terminated (\u0000 is refused) */
  size_t count;       /* JSON_ARRAY, JSON_OBJECT: how many items */
  struct Json *items; /* JSON_ARRAY: the elements; JSON_OBJECT: the values */
  char **keys;        /* JSON_OBJECT: keys[i] names items[i]; no key twice */
} Json;

typedef struct {
  const char *text; /* the whole file, NUL-terminated */
  size_t length, pos;
  int depth;
} Parser;

enum { JSON_MAX_DEPTH = 256 };

/* A syntax error at the parser's position: "attention: FILE:LINE:COLUMN: malformed JSON: ...". */
static _Noreturn void parse_fail(const Parser *p, const char *fmt, ...) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < p->pos && i < p->length; i++) {
    if (p->text[i] == '\n') line++, column = 1;
    else column++;
  }
  va_list ap;
  fprintf(stderr, "attention: %s:%zu:%zu: malformed JSON: ", g_problem, line, column);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

static int peek(const Parser *p) { return p->pos < p->length ? (unsigned char)p->text[p->pos] : EOF; }

static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* How a character reads in a message: 'x', byte 0x01, or end of file. */
static const char *show_char(int c) {
  static char buf[32];
  if (c == EOF) return "end of file";
  if (c >= 0x20 && c < 0x7f) snprintf(buf, sizeof buf, "'%c'", c);
  else snprintf(buf, sizeof buf, "byte 0x%02x", (unsigned)c);
  return buf;
}

static void skip_space(Parser *p) {
  for (int c = peek(p); c == ' ' || c == '\t' || c == '\n' || c == '\r'; c = peek(p)) p->pos++;
}

static void expect_char(Parser *p, int want, const char *context) {
  if (peek(p) != want) parse_fail(p, "expected '%c' %s, got %s", want, context, show_char(peek(p)));
  p->pos++;
}

static void parse_value(Parser *p, Json *out);

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, its value read by strtod (the C locale's '.'). */
static void parse_number(Parser *p, Json *out) {
  size_t start = p->pos;
  if (peek(p) == '-') p->pos++;
  if (peek(p) == '0') p->pos++;
  else if (is_digit(peek(p)))
    while (is_digit(peek(p))) p->pos++;
  else parse_fail(p, "expected a digit, got %s", show_char(peek(p)));
  if (peek(p) == '.') {
    p->pos++;
    if (!is_digit(peek(p))) parse_fail(p, "expected a digit after '.', got %s", show_char(peek(p)));
    while (is_digit(peek(p))) p->pos++;
  }
  if (peek(p) == 'e' || peek(p) == 'E') {
    p->pos++;
    if (peek(p) == '+' || peek(p) == '-') p->pos++;
    if (!is_digit(peek(p))) parse_fail(p, "expected a digit in the exponent, got %s", show_char(peek(p)));
    while (is_digit(peek(p))) p->pos++;
  }
  /* strtod stops where the JSON number stops: what follows (space , ] }) takes no part in a number */
  out->type = JSON_NUMBER;
  out->number = strtod(p->text + start, NULL);
  if (isinf(out->number)) {
    size_t end = p->pos;
    p->pos = start;
    parse_fail(p, "the number %.*s is beyond double's range (infinities are written \"inf\" and \"-inf\")",
               (int)(end - start), p->text + start);
  }
}

static void push_char(char **s, size_t *n, size_t *cap, char c) {
  if (*n == *cap) *s = xrealloc(*s, *cap *= 2, 1);
  (*s)[(*n)++] = c;
}

static unsigned parse_hex4(Parser *p) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int c = peek(p);
    int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) parse_fail(p, "expected 4 hex digits after \\u, got %s", show_char(c));
    v = v * 16 + (unsigned)d;
    p->pos++;
  }
  return v;
}

/* A string, at its opening quote; returns it UTF-8 encoded, NUL-terminated. */
static char *parse_string(Parser *p) {
  size_t n = 0, cap = 16;
  char *s = xmalloc(cap, 1);
  expect_char(p, '"', "to open a string");
  for (;;) {
    int c = peek(p);
    if (c == EOF) parse_fail(p, "unterminated string");
    if (c < 0x20) parse_fail(p, "a control character (%s) in a string: it must be escaped", show_char(c));
    p->pos++;
    if (c == '"') break;
    if (c != '\\') {
      push_char(&s, &n, &cap, (char)c);
      continue;
    }
    c = peek(p);
    p->pos++;
    switch (c) {
      case '"': case '\\': case '/': push_char(&s, &n, &cap, (char)c); break;
      case 'b': push_char(&s, &n, &cap, '\b'); break;
      case 'f': push_char(&s, &n, &cap, '\f'); break;
      case 'n': push_char(&s, &n, &cap, '\n'); break;
      case 'r': push_char(&s, &n, &cap, '\r'); break;
      case 't': push_char(&s, &n, &cap, '\t'); break;
      case 'u': {
        unsigned cp = parse_hex4(p);
        if (cp >= 0xDC00 && cp <= 0xDFFF) parse_fail(p, "a lone low surrogate \\u%04X", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair: \uD8xx\uDCxx */
          if (peek(p) != '\\' || p->pos + 1 >= p->length || p->text[p->pos + 1] != 'u')
            parse_fail(p, "a high surrogate \\u%04X not followed by a low one", cp);
          p->pos += 2;
          unsigned low = parse_hex4(p);
          if (low < 0xDC00 || low > 0xDFFF) parse_fail(p, "\\u%04X does not follow the high surrogate \\u%04X", low, cp);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        if (cp == 0) parse_fail(p, "\\u0000 in a string is not supported");
        if (cp < 0x80) {
          push_char(&s, &n, &cap, (char)cp);
        } else if (cp < 0x800) {
          push_char(&s, &n, &cap, (char)(0xC0 | (cp >> 6)));
          push_char(&s, &n, &cap, (char)(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
          push_char(&s, &n, &cap, (char)(0xE0 | (cp >> 12)));
          push_char(&s, &n, &cap, (char)(0x80 | ((cp >> 6) & 0x3F)));
          push_char(&s, &n, &cap, (char)(0x80 | (cp & 0x3F)));
        } else {
          push_char(&s, &n, &cap, (char)(0xF0 | (cp >> 18)));
          push_char(&s, &n, &cap, (char)(0x80 | ((cp >> 12) & 0x3F)));
          push_char(&s, &n, &cap, (char)(0x80 | ((cp >> 6) & 0x3F)));
          push_char(&s, &n, &cap, (char)(0x80 | (cp & 0x3F)));
        }
        break;
      }
      default:
        p->pos--;
        parse_fail(p, "expected an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX) after '\\', got %s", show_char(c));
    }
  }
  push_char(&s, &n, &cap, '\0');
  return s;
}

static int compare_keys(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* An array or an object, at its opening bracket. */
static void parse_container(Parser *p, Json *out, int object) {
  size_t cap = 4;
  out->type = object ? JSON_OBJECT : JSON_ARRAY;
  out->count = 0;
  out->items = xmalloc(cap, sizeof(Json));
  out->keys = object ? xmalloc(cap, sizeof(char *)) : NULL;
  if (++p->depth > JSON_MAX_DEPTH) parse_fail(p, "nested deeper than %d arrays and objects", JSON_MAX_DEPTH);
  p->pos++; /* [ or { */
  skip_space(p);
  const int close = object ? '}' : ']';
  if (peek(p) == close) {
    p->pos++;
  } else {
    for (;;) {
      if (out->count == cap) {
        cap *= 2;
        out->items = xrealloc(out->items, cap, sizeof(Json));
        if (object) out->keys = xrealloc(out->keys, cap, sizeof(char *));
      }
      if (object) {
        if (peek(p) != '"') parse_fail(p, "expected a key (a string) in an object, got %s", show_char(peek(p)));
        out->keys[out->count] = parse_string(p);
        skip_space(p);
        expect_char(p, ':', "after a key");
        skip_space(p);
      }
      parse_value(p, &out->items[out->count++]);
      skip_space(p);
      if (peek(p) == close) {
        p->pos++;
        break;
      }
      if (peek(p) != ',')
        parse_fail(p, "expected ',' or '%c' in %s, got %s", close, object ? "an object" : "an array", show_char(peek(p)));
      p->pos++;
      skip_space(p);
    }
  }
  p->depth--;
  if (object && out->count > 1) { /* a repeated key: sorted copies of the keys, neighbours compared */
    char **sorted = xmalloc(out->count, sizeof(char *));
    memcpy(sorted, out->keys, out->count * sizeof(char *));
    qsort(sorted, out->count, sizeof(char *), compare_keys);
    for (size_t i = 1; i < out->count; i++)
      if (strcmp(sorted[i - 1], sorted[i]) == 0) {
        p->pos--; /* at the object's closing brace */
        parse_fail(p, "the key \"%s\" appears twice in the object that ends here", sorted[i]);
      }
    free(sorted);
  }
}

static void parse_literal(Parser *p, const char *word, JsonType type, Json *out) {
  size_t n = strlen(word);
  if (p->length - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
    parse_fail(p, "expected a value (an object, array, string, number, true, false or null), got %s",
               show_char(peek(p)));
  p->pos += n;
  out->type = type;
}

static void parse_value(Parser *p, Json *out) {
  memset(out, 0, sizeof *out);
  switch (peek(p)) {
    case '{': parse_container(p, out, 1); break;
    case '[': parse_container(p, out, 0); break;
    case '"': out->type = JSON_STRING, out->string = parse_string(p); break;
    case 't': parse_literal(p, "true", JSON_TRUE, out); break;
    case 'f': parse_literal(p, "false", JSON_FALSE, out); break;
    case 'n': parse_literal(p, "null", JSON_NULL, out); break;
    default:
      if (peek(p) != '-' && !is_digit(peek(p)))
        parse_fail(p, "expected a value (an object, array, string, number, true, false or null), got %s",
                   show_char(peek(p)));
      parse_number(p, out);
  }
}

/* The whole text as one JSON value. */
static void parse_json(const char *text, size_t length, Json *out) {
  Parser p = {text, length, 0, 0};
  skip_space(&p);
  parse_value(&p, out);
  skip_space(&p);
  if (p.pos != p.length) parse_fail(&p, "unexpected %s after the JSON value", show_char(peek(&p)));
}

static void free_json(Json *v) {
  for (size_t i = 0; i < v->count; i++) {
    free_json(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->string);
}

/* obj's value under key, or NULL. */
static const Json *member(const Json *obj, const char *key) {
  for (size_t i = 0; i < obj->count; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

/* A value as a message shows it: a number, a string (cut short), or its kind. */
static const char *describe(const Json *v) {
  static char buf[96];
  switch (v->type) {
    case JSON_NULL: return "null";
    case JSON_FALSE: return "false";
    case JSON_TRUE: return "true";
    case JSON_NUMBER: snprintf(buf, sizeof buf, "%.17g", v->number); return buf;
    case JSON_STRING: snprintf(buf, sizeof buf, "the string \"%.60s%s\"", v->string, strlen(v->string) > 60 ? "..." : ""); return buf;
    case JSON_ARRAY: snprintf(buf, sizeof buf, "an array of %zu", v->count); return buf;
    case JSON_OBJECT: return "an object";
  }
  return "?";
}

/* ---- the problem --------------------------------------------------------------------------------------- */

typedef enum { DT_FLOAT32, DT_FLOAT64, DT_BOOL, DT_INT64 } DType;

enum { MAX_DIMS = 8 };

typedef struct {
  char *field; /* where it was read, for messages: "inputs.query" */
  DType dtype;
  int ndim;
  size_t shape[MAX_DIMS];
  size_t numel;
  double *data; /* row-major; floats as read (float32 ones are exact), bools 0 or 1, int64 exact to 2^53 */
} Tensor;

typedef struct {
  int torch2;                      /* 1: torch 2.x's semantics; 0: torch 1.13's */
  size_t E, H;                     /* embed_dim, num_heads */
  int bias, batch_first;           /* config */
  int need_weights, average_attn_weights; /* forward */
  Tensor *in_proj_weight;          /* (3E, E): W_q, W_k, W_v stacked */
  Tensor *in_proj_bias;            /* (3E), NULL without bias */
  Tensor *out_proj_weight;         /* (E, E) */
  Tensor *out_proj_bias;           /* (E), NULL without bias */
  Tensor *query, *key, *value;     /* (B, L|S, E) batch_first, (L|S, B, E) sequence-first, (L|S, E) unbatched */
  Tensor *attn_mask;               /* (L, S) or (B*H, L, S), NULL when absent */
  Tensor *key_padding_mask;        /* (B, S), (S) unbatched, NULL when absent */
  int batched;                     /* query is 3-D */
  size_t B, L, S;                  /* batch (1 unbatched), queries, keys */
} Problem;

static const char *dtype_name(DType d) {
  static const char *names[] = {"float32", "float64", "bool", "int64"};
  return names[d];
}

static int is_float(const Tensor *t) { return t->dtype == DT_FLOAT32 || t->dtype == DT_FLOAT64; }

/* "[2, 100, 64]" */
static const char *shape_str(const Tensor *t) {
  static char buf[256];
  size_t n = 0;
  n += (size_t)snprintf(buf + n, sizeof buf - n, "[");
  for (int i = 0; i < t->ndim && n < sizeof buf; i++)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%zu", i ? ", " : "", t->shape[i]);
  if (n < sizeof buf) snprintf(buf + n, sizeof buf - n, "]");
  return buf;
}

static int has_shape(const Tensor *t, int ndim, size_t d0, size_t d1, size_t d2) {
  const size_t want[3] = {d0, d1, d2};
  if (t->ndim != ndim) return 0;
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != want[i]) return 0;
  return 1;
}

/* Writes OUT = {"format": "tparity.outputs", "version": 1, "unsupported": why} and exits 0. */
static _Noreturn void unsupported(const char *fmt, ...);

static int read_bool(const Json *v, const char *field) {
  if (v->type != JSON_TRUE && v->type != JSON_FALSE) die(field, "expected true or false, got %s", describe(v));
  return v->type == JSON_TRUE;
}

/* A non-negative integer up to 2^31 (a dimension, a count). */
static size_t read_size(const Json *v, const char *field) {
  if (v->type != JSON_NUMBER || v->number != floor(v->number) || v->number < 0 || v->number > 2147483648.0)
    die(field, "expected an integer from 0 to 2^31, got %s", describe(v));
  return (size_t)v->number;
}

/* One element of a tensor's data as a double, or 0 when x is not a value of dtype. */
static int element_value(const Json *x, DType dtype, double *value) {
  switch (dtype) {
    case DT_FLOAT32:
    case DT_FLOAT64:
      if (x->type == JSON_NUMBER) return *value = x->number, 1;
      if (x->type != JSON_STRING) return 0;
      if (!strcmp(x->string, "inf")) return *value = INFINITY, 1;
      if (!strcmp(x->string, "-inf")) return *value = -INFINITY, 1;
      if (!strcmp(x->string, "nan")) return *value = NAN, 1;
      return 0;
    case DT_BOOL:
      if (x->type != JSON_TRUE && x->type != JSON_FALSE) return 0;
      return *value = x->type == JSON_TRUE, 1;
    case DT_INT64:
      if (x->type != JSON_NUMBER || x->number != floor(x->number) || fabs(x->number) > 9007199254740992.0) return 0;
      return *value = x->number, 1;
  }
  return 0;
}

/* A tensor {"dtype", "shape", "data"} at field ("state_dict.in_proj_weight"), checked whole before anything
 * is allocated. */
static Tensor *read_tensor(const Json *v, const char *field) {
  char where[320];
  if (v->type != JSON_OBJECT) die(field, "expected a tensor {\"dtype\", \"shape\", \"data\"}, got %s", describe(v));
  if (member(v, "file"))
    unsupported("%s is stored in a safetensors file (\"file\"); this program reads inline tensors only", field);
  for (size_t i = 0; i < v->count; i++)
    if (strcmp(v->keys[i], "dtype") && strcmp(v->keys[i], "shape") && strcmp(v->keys[i], "data")) {
      snprintf(where, sizeof where, "%s.%s", field, v->keys[i]);
      die(where, "unexpected key (a tensor has \"dtype\", \"shape\" and \"data\")");
    }
  Tensor t;
  memset(&t, 0, sizeof t);

  const Json *dtype = member(v, "dtype"), *shape = member(v, "shape"), *data = member(v, "data");
  snprintf(where, sizeof where, "%s.dtype", field);
  if (!dtype) die(where, "missing");
  if (dtype->type != JSON_STRING) die(where, "expected a string, got %s", describe(dtype));
  if (!strcmp(dtype->string, "float32")) t.dtype = DT_FLOAT32;
  else if (!strcmp(dtype->string, "float64")) t.dtype = DT_FLOAT64;
  else if (!strcmp(dtype->string, "bool")) t.dtype = DT_BOOL;
  else if (!strcmp(dtype->string, "int64")) t.dtype = DT_INT64;
  else die(where, "expected \"float32\", \"float64\", \"bool\" or \"int64\", got %s", describe(dtype));

  snprintf(where, sizeof where, "%s.shape", field);
  if (!shape) die(where, "missing");
  if (shape->type != JSON_ARRAY) die(where, "expected an array of dimensions, got %s", describe(shape));
  if (shape->count > MAX_DIMS) die(where, "%zu dimensions; this program reads at most %d", shape->count, MAX_DIMS);
  t.ndim = (int)shape->count;
  t.numel = 1;
  for (int i = 0; i < t.ndim; i++) {
    snprintf(where, sizeof where, "%s.shape[%d]", field, i);
    t.shape[i] = read_size(&shape->items[i], where);
    if (t.shape[i] && t.numel > SIZE_MAX / t.shape[i]) die(where, "the shape's product overflows");
    t.numel *= t.shape[i];
  }

  snprintf(where, sizeof where, "%s.data", field);
  if (!data) die(where, "missing");
  if (data->type != JSON_ARRAY) die(where, "expected a flat array of values, got %s", describe(data));
  if (data->count != t.numel)
    die(where, "expected %zu values (the product of shape %s), got %zu", t.numel, shape_str(&t), data->count);
  for (size_t i = 0; i < t.numel; i++) {
    double value;
    if (!element_value(&data->items[i], t.dtype, &value)) {
      snprintf(where, sizeof where, "%s.data[%zu]", field, i);
      die(where, "expected %s (dtype %s), got %s",
          t.dtype == DT_BOOL    ? "true or false"
          : t.dtype == DT_INT64 ? "an integer within +-2^53"
                                : "a number or \"inf\", \"-inf\", \"nan\"",
          dtype_name(t.dtype), describe(&data->items[i]));
    }
  }
  t.data = xmalloc(t.numel, sizeof(double));
  for (size_t i = 0; i < t.numel; i++) element_value(&data->items[i], t.dtype, &t.data[i]);
  t.field = xstrdup(field);
  return memcpy(xmalloc(1, sizeof t), &t, sizeof t);
}

static void free_tensor(Tensor *t) {
  if (!t) return;
  free(t->field);
  free(t->data);
  free(t);
}

/* The semantics of the torch that produced the reference: "1.13..." or "2.x" (tparity's own rule). */
static int read_semantics(const Json *root, long version) {
  if (version == 1) return 0; /* every version 1 fixture came from torch 1.13 */
  const Json *ref = member(root, "reference");
  if (!ref) die("reference", "missing (version 2: what produced the reference, with \"torch\")");
  if (ref->type != JSON_OBJECT) die("reference", "expected an object, got %s", describe(ref));
  const Json *torch = member(ref, "torch");
  if (!torch) die("reference.torch", "missing (the torch version that produced the reference)");
  if (torch->type != JSON_STRING) die("reference.torch", "expected a string, got %s", describe(torch));
  if (!strncmp(torch->string, "1.13", 4)) return 0;
  if (!strncmp(torch->string, "2.", 2)) return 1;
  unsupported("reference.torch \"%.40s\": this program knows the semantics of torch 1.13 and 2.x", torch->string);
}

/* config: torch.nn.MultiheadAttention's constructor arguments, torch's defaults for absent ones. */
static void read_config(const Json *config, Problem *p) {
  if (!config) die("config", "missing");
  if (config->type != JSON_OBJECT) die("config", "expected an object, got %s", describe(config));
  static const char *known[] = {"embed_dim", "num_heads", "bias", "add_bias_kv", "add_zero_attn",
                                "kdim", "vdim", "batch_first", "dropout"};
  for (size_t i = 0; i < config->count; i++) {
    size_t k = 0;
    while (k < sizeof known / sizeof *known && strcmp(config->keys[i], known[k])) k++;
    if (k == sizeof known / sizeof *known)
      unsupported("config.%.60s is not implemented by this program (it knows %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                  config->keys[i], known[0], known[1], known[2], known[3], known[4], known[5], known[6], known[7],
                  known[8]);
  }
  const Json *v;
  if (!(v = member(config, "embed_dim"))) die("config.embed_dim", "missing");
  p->E = read_size(v, "config.embed_dim");
  if (!(v = member(config, "num_heads"))) die("config.num_heads", "missing");
  p->H = read_size(v, "config.num_heads");
  if (p->E == 0) die("config.embed_dim", "expected a positive integer, got 0");
  if (p->H == 0) die("config.num_heads", "expected a positive integer, got 0");
  if (p->E % p->H) die("config.num_heads", "embed_dim %zu is not divisible by num_heads %zu", p->E, p->H);
  p->bias = (v = member(config, "bias")) ? read_bool(v, "config.bias") : 1;
  p->batch_first = (v = member(config, "batch_first")) ? read_bool(v, "config.batch_first") : 0;
  if ((v = member(config, "dropout"))) {
    if (v->type != JSON_NUMBER) die("config.dropout", "expected a number, got %s", describe(v));
    if (v->number != 0) unsupported("config.dropout %g: this program computes eval mode, dropout 0", v->number);
  }
  if ((v = member(config, "add_bias_kv")) && read_bool(v, "config.add_bias_kv"))
    unsupported("config.add_bias_kv true (bias_k, bias_v) is not implemented by this program");
  if ((v = member(config, "add_zero_attn")) && read_bool(v, "config.add_zero_attn"))
    unsupported("config.add_zero_attn true is not implemented by this program");
  const char *dims[] = {"kdim", "vdim"};
  for (int i = 0; i < 2; i++) { /* None (null or absent) means embed_dim */
    char where[32];
    snprintf(where, sizeof where, "config.%s", dims[i]);
    if (!(v = member(config, dims[i])) || v->type == JSON_NULL) continue;
    size_t d = read_size(v, where);
    if (d != p->E)
      unsupported("%s %zu differs from embed_dim %zu: the separate q/k/v projections are not implemented", where, d,
                  p->E);
  }
}

/* forward: need_weights and average_attn_weights, both true by default. */
static void read_forward(const Json *forward, Problem *p) {
  p->need_weights = p->average_attn_weights = 1;
  if (!forward) return;
  if (forward->type != JSON_OBJECT) die("forward", "expected an object, got %s", describe(forward));
  for (size_t i = 0; i < forward->count; i++) {
    const char *key = forward->keys[i];
    char where[96];
    snprintf(where, sizeof where, "forward.%.80s", key);
    if (!strcmp(key, "need_weights")) p->need_weights = read_bool(&forward->items[i], where);
    else if (!strcmp(key, "average_attn_weights")) p->average_attn_weights = read_bool(&forward->items[i], where);
    else unsupported("%s is not implemented by this program (it knows need_weights, average_attn_weights)", where);
  }
}

/* state_dict: exactly in_proj_weight (3E, E), out_proj.weight (E, E) and, with bias, in_proj_bias (3E) and
 * out_proj.bias (E); float32 or float64. */
static void read_state_dict(const Json *sd, Problem *p) {
  if (!sd) die("state_dict", "missing");
  if (sd->type != JSON_OBJECT) die("state_dict", "expected an object, got %s", describe(sd));
  struct { const char *name; Tensor **slot; size_t d0, d1; int ndim, wanted; } entries[] = {
      {"in_proj_weight", &p->in_proj_weight, 3 * p->E, p->E, 2, 1},
      {"in_proj_bias", &p->in_proj_bias, 3 * p->E, 0, 1, p->bias},
      {"out_proj.weight", &p->out_proj_weight, p->E, p->E, 2, 1},
      {"out_proj.bias", &p->out_proj_bias, p->E, 0, 1, p->bias},
  };
  const size_t n = sizeof entries / sizeof *entries;
  char where[320];
  for (size_t i = 0; i < sd->count; i++) {
    size_t k = 0;
    while (k < n && !(entries[k].wanted && !strcmp(sd->keys[i], entries[k].name))) k++;
    snprintf(where, sizeof where, "state_dict.%.200s", sd->keys[i]);
    if (k == n)
      die(where, "not an entry of MultiheadAttention(embed_dim=%zu, bias=%s) with kdim = vdim = embed_dim "
                 "(expected in_proj_weight, %sout_proj.weight%s)",
          p->E, p->bias ? "True" : "False", p->bias ? "in_proj_bias, " : "", p->bias ? ", out_proj.bias" : "");
    Tensor *t = *entries[k].slot = read_tensor(&sd->items[i], where);
    if (!is_float(t)) die(where, "expected dtype float32 or float64, got %s", dtype_name(t->dtype));
    if (!has_shape(t, entries[k].ndim, entries[k].d0, entries[k].d1, 0)) {
      char want[64];
      if (entries[k].ndim == 2) snprintf(want, sizeof want, "[%zu, %zu]", entries[k].d0, entries[k].d1);
      else snprintf(want, sizeof want, "[%zu]", entries[k].d0);
      die(where, "expected shape %s (embed_dim %zu), got %s", want, p->E, shape_str(t));
    }
  }
  for (size_t k = 0; k < n; k++)
    if (entries[k].wanted && !*entries[k].slot) {
      snprintf(where, sizeof where, "state_dict.%s", entries[k].name);
      die(where, "missing");
    }
}

/* inputs: query, key, value; attn_mask and key_padding_mask optional. Sets B, L, S and batched. */
static void read_inputs(const Json *inputs, Problem *p) {
  if (!inputs) die("inputs", "missing");
  if (inputs->type != JSON_OBJECT) die("inputs", "expected an object, got %s", describe(inputs));
  static const char *names[] = {"query", "key", "value", "attn_mask", "key_padding_mask"};
  Tensor **slots[] = {&p->query, &p->key, &p->value, &p->attn_mask, &p->key_padding_mask};
  char where[320];
  for (size_t i = 0; i < inputs->count; i++) {
    size_t k = 0;
    while (k < 5 && strcmp(inputs->keys[i], names[k])) k++;
    snprintf(where, sizeof where, "inputs.%.200s", inputs->keys[i]);
    if (k == 5) die(where, "not an input of MultiheadAttention.forward (expected query, key, value, attn_mask, key_padding_mask)");
    *slots[k] = read_tensor(&inputs->items[i], where);
  }
  for (size_t k = 0; k < 3; k++) {
    snprintf(where, sizeof where, "inputs.%s", names[k]);
    if (!*slots[k]) die(where, "missing");
    if (!is_float(*slots[k])) die(where, "expected dtype float32 or float64, got %s", dtype_name((*slots[k])->dtype));
  }
  const Tensor *q = p->query, *k = p->key, *v = p->value;
  const char *layout = p->batch_first ? "(B, L, E) (batch_first)" : "(L, B, E) (sequence-first)";
  if ((q->ndim != 2 && q->ndim != 3) || q->shape[q->ndim - 1] != p->E)
    die("inputs.query.shape", "expected %s or unbatched (L, E), with E = embed_dim %zu, got %s", layout, p->E,
        shape_str(q));
  p->batched = q->ndim == 3;
  const int bdim = p->batch_first ? 0 : 1, tdim = 1 - bdim; /* batched: where B and the tokens are */
  p->B = p->batched ? q->shape[bdim] : 1;
  p->L = p->batched ? q->shape[tdim] : q->shape[0];
  p->S = p->batched ? k->shape[tdim] : k->shape[0];
  for (int i = 0; i < 2; i++) {
    const Tensor *t = i ? v : k;
    snprintf(where, sizeof where, "inputs.%s.shape", i ? "value" : "key");
    int ok = t->ndim == q->ndim && t->shape[t->ndim - 1] == p->E &&
             (p->batched ? t->shape[bdim] == p->B && t->shape[tdim] == p->S : t->shape[0] == p->S);
    if (!ok) {
      if (p->batched)
        die(where, "expected %s with B = %zu (the query's), S = %zu (the key's), E = %zu, got %s",
            p->batch_first ? "(B, S, E)" : "(S, B, E)", p->B, p->S, p->E, shape_str(t));
      die(where, "expected (S, E) as the query is unbatched, with S = %zu (the key's), E = %zu, got %s", p->S, p->E,
          shape_str(t));
    }
  }
  if (p->attn_mask) {
    const Tensor *m = p->attn_mask;
    if (!is_float(m) && m->dtype != DT_BOOL)
      die("inputs.attn_mask", "expected dtype bool or float, got %s", dtype_name(m->dtype));
    if (!has_shape(m, 2, p->L, p->S, 0) && !has_shape(m, 3, p->B * p->H, p->L, p->S))
      die("inputs.attn_mask.shape", "expected (L, S) = [%zu, %zu] or (B*H, L, S) = [%zu, %zu, %zu], got %s", p->L,
          p->S, p->B * p->H, p->L, p->S, shape_str(m));
  }
  if (p->key_padding_mask) {
    const Tensor *m = p->key_padding_mask;
    if (!is_float(m) && m->dtype != DT_BOOL)
      die("inputs.key_padding_mask", "expected dtype bool or float, got %s", dtype_name(m->dtype));
    if (p->batched ? !has_shape(m, 2, p->B, p->S, 0) : !has_shape(m, 1, p->S, 0, 0))
      die("inputs.key_padding_mask.shape", "expected %s, got %s", p->batched ? "(B, S)" : "(S) (unbatched)",
          shape_str(m));
  }
  if (!p->torch2 && p->attn_mask && p->key_padding_mask && is_float(p->attn_mask) && is_float(p->key_padding_mask))
    unsupported("a float key_padding_mask beside a float attn_mask under torch 1.13, whose masked_fill reads the "
                "floats as a byte mask and ignores most values (torch 2.x adds them)");
}

/* The whole problem file. Returns only for a problem this program computes. */
static void read_problem(const Json *root, Problem *p) {
  memset(p, 0, sizeof *p);
  if (root->type != JSON_OBJECT) die(NULL, "expected a JSON object at the top level, got %s", describe(root));
  const Json *v = member(root, "format");
  if (!v) die("format", "missing");
  if (v->type != JSON_STRING || strcmp(v->string, "tparity.fixture"))
    die("format", "expected \"tparity.fixture\", got %s", describe(v));
  if (!(v = member(root, "version"))) die("version", "missing");
  if (v->type != JSON_NUMBER || (v->number != 1 && v->number != 2)) die("version", "expected 1 or 2, got %s", describe(v));
  const long version = (long)v->number;
  if (!(v = member(root, "module"))) die("module", "missing");
  if (v->type != JSON_STRING) die("module", "expected a string, got %s", describe(v));
  if (strcmp(v->string, "MultiheadAttention"))
    unsupported("module %.60s: this program implements MultiheadAttention only", v->string);
  if ((v = member(root, "tensor_file")))
    unsupported("the tensors are in a safetensors file (tensor_file); this program reads inline tensors only");
  p->torch2 = read_semantics(root, version);
  read_config(member(root, "config"), p);
  read_forward(member(root, "forward"), p);
  read_state_dict(member(root, "state_dict"), p);
  read_inputs(member(root, "inputs"), p);
  /* the rest (name, outputs, components, reference's other keys, description) is tparity's, not ours */
}

static void free_problem(Problem *p) {
  Tensor *all[] = {p->in_proj_weight, p->in_proj_bias, p->out_proj_weight, p->out_proj_bias, p->query,
                   p->key, p->value, p->attn_mask, p->key_padding_mask};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) free_tensor(all[i]);
}

/* ---- the outputs file ---------------------------------------------------------------------------------- */

static char *g_tmp; /* OUT.tmp while it is being written */

static FILE *open_output(void) {
  g_tmp = xmalloc(strlen(g_out) + 5, 1);
  sprintf(g_tmp, "%s.tmp", g_out);
  FILE *f = fopen(g_tmp, "w");
  if (!f) fatal("%s: cannot write: %s", g_tmp, strerror(errno));
  return f;
}

/* Closes OUT.tmp and renames it to OUT: the outputs file appears whole or not at all. */
static void close_output(FILE *f) {
  int failed = ferror(f);
  failed |= fclose(f) != 0;
  if (failed) {
    int e = errno;
    remove(g_tmp);
    fatal("%s: cannot write: %s", g_tmp, strerror(e));
  }
  if (rename(g_tmp, g_out) != 0) {
    int e = errno;
    remove(g_tmp);
    fatal("%s: cannot rename to %s: %s", g_tmp, g_out, strerror(e));
  }
  free(g_tmp);
  g_tmp = NULL;
}

static void write_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static _Noreturn void unsupported(const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  for (char *c = why; *c; c++) /* one line, whatever the problem's keys held */
    if ((unsigned char)*c < 0x20) *c = ' ';
  FILE *f = open_output();
  fprintf(f, "{\"format\": \"tparity.outputs\", \"version\": 1, \"unsupported\": ");
  write_json_string(f, why);
  fprintf(f, "}\n");
  close_output(f);
  exit(0);
}

/* ======== part 2, compiled twice: the ops in REAL ========================================================= */

#define JOIN_(a, b) a##_##b
#define JOIN(a, b) JOIN_(a, b)
#define OP(name) JOIN(name, SUFFIX) /* OP(linear) is linear_f32 or linear_f64 */

#define REAL float
#define SUFFIX f32
#define REAL_DTYPE "float32"
#define REAL_FORMAT "%.9g"
#define REAL_EXP expf
#include "attention.c"
#undef REAL
#undef SUFFIX
#undef REAL_DTYPE
#undef REAL_FORMAT
#undef REAL_EXP

#define REAL double
#define SUFFIX f64
#define REAL_DTYPE "float64"
#define REAL_FORMAT "%.17g"
#define REAL_EXP exp
#include "attention.c"
#undef REAL
#undef SUFFIX
#undef REAL_DTYPE
#undef REAL_FORMAT
#undef REAL_EXP

/* ======== part 3: main ====================================================================================== */

static char *read_file(const char *path, size_t *length) {
  FILE *f = fopen(path, "rb");
  if (!f) fatal("%s: cannot open the problem file: %s", path, strerror(errno));
  size_t n = 0, cap = 1 << 16;
  char *text = xmalloc(cap, 1);
  for (;;) {
    n += fread(text + n, 1, cap - 1 - n, f);
    if (ferror(f)) fatal("%s: cannot read the problem file: %s", path, strerror(errno));
    if (feof(f)) break;
    if (n == cap - 1) text = xrealloc(text, cap *= 2, 1);
  }
  fclose(f);
  text[n] = '\0';
  *length = n;
  return text;
}

int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[3], "float32") && strcmp(argv[3], "float64"))) {
    fprintf(stderr, "usage: attention PROBLEM OUT DTYPE   (DTYPE: float32 or float64)\n"
                    "  computes torch.nn.MultiheadAttention on the problem file and writes the outputs file\n");
    return 2;
  }
  g_problem = argv[1];
  g_out = argv[2];
  size_t length;
  char *text = read_file(g_problem, &length);
  Json root;
  parse_json(text, length, &root);
  free(text);
  Problem p;
  read_problem(&root, &p); /* writes "unsupported" and exits for what it does not implement */
  free_json(&root);
  if (!strcmp(argv[3], "float32")) mha_f32(&p);
  else mha_f64(&p);
  free_problem(&p);
  return 0;
}

#else /* ======== part 2 (included twice by part 1): the ops, in REAL ===================================== */

/* Conventions: every array is row-major REAL; inside, every activation is batch-first, (B, T, C), B = 1 for
 * unbatched input; shapes are given as (dims) in the comments. Each op allocates its result. */

/* A problem's tensor as REAL (float32 values widen exactly; float64 ones round to nearest in float32). */
static REAL *OP(to_real)(const Tensor *t) {
  REAL *x = xmalloc(t->numel, sizeof *x);
  for (size_t i = 0; i < t->numel; i++) x[i] = (REAL)t->data[i];
  return x;
}

/* t in the module's layout, (B, T, C) batch_first, (T, B, C) sequence-first or (T, C) unbatched;
 * out (B, T, C). */
static REAL *OP(to_batch_first)(const Tensor *t, size_t B, size_t T, size_t C, int seq_first) {
  REAL *x = xmalloc(checked_mul(checked_mul(B, T), C), sizeof *x);
  for (size_t b = 0; b < B; b++)
    for (size_t i = 0; i < T; i++)
      for (size_t c = 0; c < C; c++)
        x[(b * T + i) * C + c] = (REAL)t->data[seq_first ? (i * B + b) * C + c : (b * T + i) * C + c];
  return x;
}

/* to_batch_first's inverse: x (B, T, C); out (T, B, C) when seq_first, else (B, T, C) (also unbatched:
 * B = 1, (T, C)). */
static REAL *OP(from_batch_first)(const REAL *x, size_t B, size_t T, size_t C, int seq_first) {
  REAL *y = xmalloc(checked_mul(checked_mul(B, T), C), sizeof *y);
  for (size_t b = 0; b < B; b++)
    for (size_t i = 0; i < T; i++)
      for (size_t c = 0; c < C; c++) y[seq_first ? (i * B + b) * C + c : (b * T + i) * C + c] = x[(b * T + i) * C + c];
  return y;
}

/* torch.nn.functional.linear: y = x W^T + b. x (N, IN), W (OUT, IN), b (OUT) or NULL; out (N, OUT). */
static REAL *OP(linear)(const REAL *x, size_t N, size_t IN, const REAL *W, size_t OUT, const REAL *b) {
  REAL *y = xmalloc(checked_mul(N, OUT), sizeof *y);
  for (size_t n = 0; n < N; n++)
    for (size_t o = 0; o < OUT; o++) {
      REAL acc = 0;
      for (size_t i = 0; i < IN; i++) acc += x[n * IN + i] * W[o * IN + i];
      y[n * OUT + o] = b ? acc + b[o] : acc;
    }
  return y;
}

/* x (B, T, H*D); out (B, H, T, D): head h holds features h*D .. h*D + D-1. */
static REAL *OP(split_heads)(const REAL *x, size_t B, size_t T, size_t H, size_t D) {
  REAL *y = xmalloc(checked_mul(checked_mul(B, T), H * D), sizeof *y);
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < H; h++)
      for (size_t i = 0; i < T; i++)
        for (size_t d = 0; d < D; d++) y[((b * H + h) * T + i) * D + d] = x[(b * T + i) * H * D + h * D + d];
  return y;
}

/* x (B, H, T, D); out (B, T, H*D): the heads concatenated. */
static REAL *OP(merge_heads)(const REAL *x, size_t B, size_t H, size_t T, size_t D) {
  REAL *y = xmalloc(checked_mul(checked_mul(B, T), H * D), sizeof *y);
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < H; h++)
      for (size_t i = 0; i < T; i++)
        for (size_t d = 0; d < D; d++) y[(b * T + i) * H * D + h * D + d] = x[((b * H + h) * T + i) * D + d];
  return y;
}

/* Element i of a mask as an additive value: bool true (masked out) -inf, false 0; a float as it is. */
static REAL OP(additive)(const Tensor *m, size_t i) {
  if (m->dtype == DT_BOOL) return m->data[i] != 0 ? -(REAL)INFINITY : (REAL)0;
  return (REAL)m->data[i];
}

/* attn_mask and key_padding_mask as the one additive mask multi_head_attention_forward adds to the scores.
 * attn_mask (L, S) or (B*H, L, S), key_padding_mask (B, S) ((S) unbatched: B = 1), either NULL; bool
 * (true = masked out) or float (added). Out (B, H, L, S), or NULL when there is no mask.
 * torch 2.x (_canonical_mask): each made additive on its own (bool: -inf where true), then summed.
 * torch 1.13, both given: a bool attn_mask ORed with the key padding mask (a nonzero float counts as true),
 * a float attn_mask filled with -inf where a bool key padding mask is true (float beside float: refused by
 * read_inputs). One mask alone is made additive in both. */
static REAL *OP(merge_masks)(const Tensor *am, const Tensor *kpm, size_t B, size_t H, size_t L, size_t S, int torch2) {
  if (!am && !kpm) return NULL;
  REAL *m = xmalloc(checked_mul(checked_mul(B, H), checked_mul(L, S)), sizeof *m);
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < H; h++)
      for (size_t l = 0; l < L; l++)
        for (size_t s = 0; s < S; s++) {
          const size_t ia = am && am->ndim == 3 ? ((b * H + h) * L + l) * S + s : l * S + s, ik = b * S + s;
          REAL value;
          if (!am) value = OP(additive)(kpm, ik);
          else if (!kpm) value = OP(additive)(am, ia);
          else if (torch2) value = OP(additive)(am, ia) + OP(additive)(kpm, ik);
          else if (am->dtype == DT_BOOL) value = am->data[ia] != 0 || kpm->data[ik] != 0 ? -(REAL)INFINITY : (REAL)0;
          else value = kpm->data[ik] != 0 ? -(REAL)INFINITY : (REAL)am->data[ia]; /* kpm is bool here */
          m[((b * H + h) * L + l) * S + s] = value;
        }
  return m;
}

/* The queries scaled, in place: x (N), D a head's width. torch 2.x: q * sqrt(1 / D); torch 1.13: q / sqrt(D)
 * (the same up to rounding). The factor is a double rounded to REAL, as torch rounds a Python float. */
static void OP(scale_queries)(REAL *q, size_t N, size_t D, int torch2) {
  const REAL factor = (REAL)(torch2 ? sqrt(1.0 / (double)D) : sqrt((double)D));
  for (size_t i = 0; i < N; i++) q[i] = torch2 ? q[i] * factor : q[i] / factor;
}

/* scores = q k^T + mask (baddbmm). q (B, H, L, D) already scaled, k (B, H, S, D), mask (B, H, L, S) or NULL;
 * out (B, H, L, S). */
static REAL *OP(scores)(const REAL *q, const REAL *k, const REAL *mask, size_t B, size_t H, size_t L, size_t S,
                        size_t D) {
  REAL *y = xmalloc(checked_mul(checked_mul(B, H), checked_mul(L, S)), sizeof *y);
  for (size_t g = 0; g < B * H; g++) /* g = b*H + h */
    for (size_t l = 0; l < L; l++)
      for (size_t s = 0; s < S; s++) {
        REAL acc = 0;
        for (size_t d = 0; d < D; d++) acc += q[(g * L + l) * D + d] * k[(g * S + s) * D + d];
        const size_t i = (g * L + l) * S + s;
        y[i] = mask ? acc + mask[i] : acc;
      }
  return y;
}

/* torch.softmax(x, dim=-1) in place: x (ROWS, S). A row whose every entry is -inf gives NaN, as torch's
 * softmax does, or, when safe, zeros: torch 2.x's _safe_softmax, which scaled_dot_product_attention (2.x's
 * path for need_weights=False) applies (its CPU flash kernel agrees). */
static void OP(softmax_rows)(REAL *x, size_t rows, size_t S, int safe) {
  for (size_t r = 0; r < rows; r++) {
    REAL *row = x + r * S;
    int all_masked = 1;
    REAL max = -(REAL)INFINITY;
    for (size_t s = 0; s < S; s++) {
      if (row[s] != -(REAL)INFINITY) all_masked = 0;
      if (row[s] > max) max = row[s];
    }
    if (safe && all_masked) {
      for (size_t s = 0; s < S; s++) row[s] = 0;
      continue;
    }
    REAL sum = 0;
    for (size_t s = 0; s < S; s++) { /* all masked: -inf - -inf is NaN, and so is the row */
      row[s] = REAL_EXP(row[s] - max);
      sum += row[s];
    }
    for (size_t s = 0; s < S; s++) row[s] /= sum;
  }
}

/* context = weights v. w (B, H, L, S), v (B, H, S, D); out (B, H, L, D). */
static REAL *OP(weighted_sum)(const REAL *w, const REAL *v, size_t B, size_t H, size_t L, size_t S, size_t D) {
  REAL *y = xmalloc(checked_mul(checked_mul(B, H), checked_mul(L, D)), sizeof *y);
  for (size_t g = 0; g < B * H; g++)
    for (size_t l = 0; l < L; l++)
      for (size_t d = 0; d < D; d++) {
        REAL acc = 0;
        for (size_t s = 0; s < S; s++) acc += w[(g * L + l) * S + s] * v[(g * S + s) * D + d];
        y[(g * L + l) * D + d] = acc;
      }
  return y;
}

/* weights.mean(dim=1): w (B, H, L, S); out (B, L, S), the sum over the heads divided by H. */
static REAL *OP(mean_over_heads)(const REAL *w, size_t B, size_t H, size_t L, size_t S) {
  REAL *y = xmalloc(checked_mul(B, checked_mul(L, S)), sizeof *y);
  for (size_t b = 0; b < B; b++)
    for (size_t i = 0; i < L * S; i++) {
      REAL acc = 0;
      for (size_t h = 0; h < H; h++) acc += w[(b * H + h) * L * S + i];
      y[b * L * S + i] = acc / (REAL)H;
    }
  return y;
}

/* "name": {"dtype": REAL_DTYPE, "shape": [...], "data": [...]}, non-finite values as "inf", "-inf", "nan". */
static void OP(write_tensor)(FILE *f, const char *name, const REAL *x, const size_t *shape, int ndim) {
  size_t n = 1;
  fprintf(f, "\"%s\": {\"dtype\": \"%s\", \"shape\": [", name, REAL_DTYPE);
  for (int i = 0; i < ndim; i++) {
    fprintf(f, "%s%zu", i ? ", " : "", shape[i]);
    n *= shape[i];
  }
  fprintf(f, "], \"data\": [");
  for (size_t i = 0; i < n; i++) {
    if (i) fputs(i % 16 ? ", " : ",\n  ", f);
    if (isnan(x[i])) fputs("\"nan\"", f);
    else if (isinf(x[i])) fputs(x[i] > 0 ? "\"inf\"" : "\"-inf\"", f);
    else fprintf(f, REAL_FORMAT, (double)x[i]);
  }
  fprintf(f, "]}");
}

/* torch.nn.MultiheadAttention(E, H, bias, batch_first=...).forward(query, key, value, key_padding_mask,
 * need_weights, attn_mask, average_attn_weights), eval, as multi_head_attention_forward computes it, in REAL;
 * writes the outputs file. */
static void OP(mha)(const Problem *p) {
  const size_t B = p->B, L = p->L, S = p->S, E = p->E, H = p->H, D = E / H;
  const int seq_first = p->batched && !p->batch_first;

  /* the projections: q (B, L, E), k and v (B, S, E); in_proj_weight's rows are W_q, W_k, W_v */
  REAL *query = OP(to_batch_first)(p->query, B, L, E, seq_first);
  REAL *key = OP(to_batch_first)(p->key, B, S, E, seq_first);
  REAL *value = OP(to_batch_first)(p->value, B, S, E, seq_first);
  REAL *w_in = OP(to_real)(p->in_proj_weight), *b_in = p->bias ? OP(to_real)(p->in_proj_bias) : NULL;
  REAL *q = OP(linear)(query, B * L, E, w_in, E, b_in);
  REAL *k = OP(linear)(key, B * S, E, w_in + E * E, E, b_in ? b_in + E : NULL);
  REAL *v = OP(linear)(value, B * S, E, w_in + 2 * E * E, E, b_in ? b_in + 2 * E : NULL);

  /* per head: (B, H, L|S, D) */
  REAL *qh = OP(split_heads)(q, B, L, H, D), *kh = OP(split_heads)(k, B, S, H, D), *vh = OP(split_heads)(v, B, S, H, D);
  OP(scale_queries)(qh, B * H * L * D, D, p->torch2);
  REAL *mask = OP(merge_masks)(p->attn_mask, p->key_padding_mask, B, H, L, S, p->torch2);
  REAL *weights = OP(scores)(qh, kh, mask, B, H, L, S, D); /* (B, H, L, S), softmax in place: */
  OP(softmax_rows)(weights, B * H * L, S, p->torch2 && !p->need_weights);
  REAL *ctx_heads = OP(weighted_sum)(weights, vh, B, H, L, S, D); /* (B, H, L, D) */
  REAL *context = OP(merge_heads)(ctx_heads, B, H, L, D);         /* (B, L, E) */

  /* out_proj, then the query's layout */
  REAL *w_out = OP(to_real)(p->out_proj_weight), *b_out = p->bias ? OP(to_real)(p->out_proj_bias) : NULL;
  REAL *out = OP(linear)(context, B * L, E, w_out, E, b_out); /* (B, L, E) */
  REAL *output = OP(from_batch_first)(out, B, L, E, seq_first);

  FILE *f = open_output();
  fprintf(f, "{\"format\": \"tparity.outputs\", \"version\": 1, \"dtype\": \"%s\", \"outputs\": {\n", REAL_DTYPE);
  /* output: (B, L, E) batch_first, (L, B, E) sequence-first, (L, E) unbatched */
  const size_t out_shape[3] = {p->batched ? (seq_first ? L : B) : L, p->batched ? (seq_first ? B : L) : E, E};
  OP(write_tensor)(f, "output", output, out_shape, p->batched ? 3 : 2);
  if (p->need_weights) {
    /* attn_weights: averaged (B, L, S), or per head (B, H, L, S); unbatched without B */
    const int off = p->batched ? 0 : 1;
    REAL *avg = p->average_attn_weights ? OP(mean_over_heads)(weights, B, H, L, S) : NULL;
    const size_t avg_shape[3] = {B, L, S}, head_shape[4] = {B, H, L, S};
    fprintf(f, ",\n");
    if (avg) OP(write_tensor)(f, "attn_weights", avg, avg_shape + off, 3 - off);
    else OP(write_tensor)(f, "attn_weights", weights, head_shape + off, 4 - off);
    free(avg);
  }
  fprintf(f, "}}\n");
  close_output(f);

  REAL *all[] = {query, key, value, w_in, b_in, q, k, v, qh, kh, vh, mask, weights, ctx_heads, context, w_out,
                 b_out, out, output};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

#endif /* REAL */
