/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): The UUID layout, what configure() is given, Envelope fields, UUIDs of messages.
 */

/* -- arguments by keyword ------------------------------------------------ */

/* Bind the arguments of a METH_FASTCALL | METH_KEYWORDS method as Python binds
 * those of `def fname(self, names[0], ..., names[n - 1])`: out[i] is the
 * (borrowed) value of names[i], given by position or by keyword. Returns 0,
 * or -1 with a TypeError worded as Python's. The methods call it only when
 * their arguments are not exactly n positional ones. */
static int
bind_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
          const char *const *names, Py_ssize_t n, PyObject **out)
{
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments but %zd were given",
                     fname, n, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t j = 0;
        while (j < n && PyUnicode_CompareWithASCIIString(key, names[j]) != 0) {
            j++;
        }
        if (j == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                         fname, key);
            return -1;
        }
        if (out[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                         fname, names[j]);
            return -1;
        }
        out[j] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument: '%s'",
                         fname, names[i]);
            return -1;
        }
    }
    return 0;
}

/* -- the UUID layout (message/layout.py) -------------------------------- */

#define PRODUCER_MASK 0xFFFFFFFFFFFFULL
#define FLAGS_SHIFT 48
#define FLAGS_MASK 0x3FF
#define COUNTER_SHIFT 58
#define OUTSIDE_TXN 0
#define CONTINUE_TXN 1
#define ACK_TXN 2
#define UUID_EPOCH_OFFSET 122192928000000000ULL

/* A UUID as two 64-bit halves: hi = bits 127..64, lo = bits 63..0. */
static inline uint64_t
clock_of(uint64_t hi, uint64_t lo)
{
    return ((hi & 0x0FFF) << 52) | (((hi >> 16) & 0xFFFF) << 36) | ((hi >> 32) << 4)
           | ((lo >> COUNTER_SHIFT) & 0xF);
}

static inline unsigned
flags_of(uint64_t lo)
{
    return (unsigned)((lo >> FLAGS_SHIFT) & FLAGS_MASK);
}

/* -- what the components count (journal.metrics reads it through counts()) --

 * Plain integers, touched under the GIL, per message where that is where
 * they happen; message/_counts.py counts the same for the Python
 * implementation, in the same order of fields. */
static struct {
    unsigned long long published, begun, committed, rolled_back, duplicates, rollbacks;
} COUNTS;

/* -- across Python versions ---------------------------------------------- */

/* getattr(obj, name, None) without raising AttributeError: 1 and *out set,
 * 0 (not found) or -1 (error). */
#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#else
#define lookup_attr _PyObject_LookupAttr
#endif

/* -- what configure() is given ------------------------------------------ */

typedef struct {
    int ready;
    PyTypeObject *envelope_type;
    PyObject *d_journal, *d_begin, *d_end, *d_message; /* Envelope's member descriptors */
    PyObject *producer_state;                          /* ProducerState */
    PyObject *must_start_replay, *replay_error;        /* the error classes */
    PyObject *uuid_int_of;   /* dict: message type -> function giving the UUID as an int */
    PyObject *json_uuid_int; /* that function of documents with their UUID at json_uuid_path */
    PyObject *horizon_units; /* horizon_units(h) -> int | None */
    PyObject *warn_unknown_flags, *warn_old_ack;
    PyObject *str_meta, *str_uuid, *str_get_uuid, *str_int, *str_name, *str_getitem;
    PyObject *str_journal, *str_begin, *str_end, *str_message, *str_producer, *str_last_ack;
    PyObject *str_get, *int_zero;
    PyObject *dict_getitem; /* dict.__getitem__ */
} Config;

static Config C;

static PyObject *
member_descriptor(PyTypeObject *type, const char *name)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name); /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field", type->tp_name, name);
        return NULL;
    }
    return Py_NewRef(d);
}

/* The hooks the Sequencer and the readers take from Python (see configure()
 * in message/_native.c, the one entry point): 0, or -1 with an exception. */
static int
core_setup(PyTypeObject *env, PyObject *ps, PyObject *msr, PyObject *rerr, PyObject *uio,
           PyObject *jui, PyObject *jup, PyObject *hu, PyObject *wuf, PyObject *woa)
{
    /* message._types.DEFAULT_UUID_PATH: the two keys of the default path,
     * which the fast paths of reading and publishing look up. */
    if (PyTuple_GET_SIZE(jup) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(jup, 0))
        || !PyUnicode_Check(PyTuple_GET_ITEM(jup, 1))) {
        PyErr_SetString(PyExc_TypeError, "json_uuid_path must be two keys");
        return -1;
    }
    if (C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "message._native is configured already");
        return -1;
    }
    Config c = {0};
    c.d_journal = member_descriptor(env, "journal");
    c.d_begin = c.d_journal ? member_descriptor(env, "begin") : NULL;
    c.d_end = c.d_begin ? member_descriptor(env, "end") : NULL;
    c.d_message = c.d_end ? member_descriptor(env, "message") : NULL;
    if (c.d_message == NULL) {
        return -1;
    }
#define INTERN(field, text) \
    if ((c.field = PyUnicode_InternFromString(text)) == NULL) return -1;
    c.str_meta = Py_NewRef(PyTuple_GET_ITEM(jup, 0));
    PyUnicode_InternInPlace(&c.str_meta);
    c.str_uuid = Py_NewRef(PyTuple_GET_ITEM(jup, 1));
    PyUnicode_InternInPlace(&c.str_uuid);
    INTERN(str_get_uuid, "get_uuid");
    INTERN(str_int, "int");
    INTERN(str_name, "name");
    INTERN(str_getitem, "__getitem__");
    INTERN(str_journal, "journal");
    INTERN(str_begin, "begin");
    INTERN(str_end, "end");
    INTERN(str_message, "message");
    INTERN(str_producer, "producer");
    INTERN(str_last_ack, "last_ack");
    INTERN(str_get, "get");
#undef INTERN
    c.int_zero = PyLong_FromLong(0);
    c.dict_getitem = PyObject_GetAttr((PyObject *)&PyDict_Type, c.str_getitem);
    if (c.int_zero == NULL || c.dict_getitem == NULL) {
        return -1;
    }
    c.envelope_type = (PyTypeObject *)Py_NewRef(env);
    c.producer_state = Py_NewRef(ps);
    c.must_start_replay = Py_NewRef(msr);
    c.replay_error = Py_NewRef(rerr);
    c.uuid_int_of = Py_NewRef(uio);
    c.json_uuid_int = Py_NewRef(jui);
    c.horizon_units = Py_NewRef(hu);
    c.warn_unknown_flags = Py_NewRef(wuf);
    c.warn_old_ack = Py_NewRef(woa);
    c.ready = 1;
    C = c; /* once per process: nothing to release */
    return 0;
}

static int
check_ready(void)
{
    if (!C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "message._native is not configured");
        return -1;
    }
    return 0;
}

/* -- Envelope fields ------------------------------------------------------ */

/* env.<field> (a new reference): through the dataclass's member descriptor
 * for an Envelope, through getattr for anything else. */
static inline PyObject *
env_get(PyObject *env, PyObject *descr, PyObject *name)
{
    if (Py_TYPE(env) == C.envelope_type) {
        return Py_TYPE(descr)->tp_descr_get(descr, env, (PyObject *)C.envelope_type);
    }
    return PyObject_GetAttr(env, name);
}

static int
env_get_ll(PyObject *env, PyObject *descr, PyObject *name, long long *out)
{
    PyObject *v = env_get(env, descr, name);
    if (v == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Envelope(spec, begin, end, msg), as its dataclass __init__ makes it. */
static PyObject *
new_envelope(PyObject *spec, long long begin, long long end, PyObject *msg)
{
    PyTypeObject *t = C.envelope_type;
    PyObject *b = PyLong_FromLongLong(begin);
    PyObject *e = b ? PyLong_FromLongLong(end) : NULL;
    PyObject *env = e ? t->tp_alloc(t, 0) : NULL;
    if (env == NULL) {
        Py_XDECREF(b);
        Py_XDECREF(e);
        return NULL;
    }
    descrsetfunc set = Py_TYPE(C.d_journal)->tp_descr_set;
    int rc = set(C.d_journal, env, spec) | set(C.d_begin, env, b) | set(C.d_end, env, e)
             | set(C.d_message, env, msg);
    Py_DECREF(b);
    Py_DECREF(e);
    if (rc != 0) {
        Py_DECREF(env);
        return NULL;
    }
    return env;
}

/* -- UUIDs of messages ---------------------------------------------------- */

#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HEX_SWAR 1
#endif

#ifdef HEX_SWAR
/* The value of the 8 hex digits (either case) held in x, the first in its
 * low byte, as one integer; 0 if any byte is no hex digit. All 8 at once in
 * a 64-bit word: each byte's range is tested by an addition that sets its
 * high bit (no byte carries into the next, as none is above 0x7F). */
static inline int
hex8_word(uint64_t x, uint32_t *out)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    if (x & high) {
        return 0;
    }
    uint64_t lower = x | (0x20 * ones); /* 'A'-'F' as 'a'-'f'; digits unchanged */
    uint64_t digit = (x + (0x80 - '0') * ones) & ~(x + (0x7F - '9') * ones);
    uint64_t alpha = (lower + (0x80 - 'a') * ones) & ~(lower + (0x7F - 'f') * ones);
    if (((digit | alpha) & high) != high) {
        return 0;
    }
    /* Each byte's value: its low nibble, plus 9 for a letter. */
    uint64_t v = (x & (0x0F * ones)) + ((alpha & high) >> 7) * 9;
    /* Two nibbles to a byte, then the four bytes together, first highest. */
    v = ((v << 4) | (v >> 8)) & 0x00FF00FF00FF00FFULL;
    v = (v | (v >> 8)) & 0x0000FFFF0000FFFFULL;
    v = (v | (v >> 16)) & 0xFFFFFFFFULL;
    *out = __builtin_bswap32((uint32_t)v);
    return 1;
}

static inline uint64_t
load8(const unsigned char *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* The 8 bytes of the two groups of 4 at p and q, as one word. */
static inline uint64_t
load4_4(const unsigned char *p, const unsigned char *q)
{
    uint32_t a, b;
    memcpy(&a, p, 4);
    memcpy(&b, q, 4);
    return (uint64_t)a | ((uint64_t)b << 32);
}

/* The canonical 8-4-4-4-12 text at p as halves; 0 if it is not one. */
static inline int
parse_canonical36(const unsigned char *p, uint64_t *hi, uint64_t *lo)
{
    uint32_t a, b, c, d;
    if (p[8] != '-' || p[13] != '-' || p[18] != '-' || p[23] != '-'
        || !hex8_word(load8(p), &a) || !hex8_word(load4_4(p + 9, p + 14), &b)
        || !hex8_word(load4_4(p + 19, p + 24), &c) || !hex8_word(load8(p + 28), &d)) {
        return 0;
    }
    *hi = ((uint64_t)a << 32) | b;
    *lo = ((uint64_t)c << 32) | d;
    return 1;
}
#else
/* The value of hex digit c (either case), or -1. */
static inline int
hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    c |= 0x20; /* 'A'-'F' as 'a'-'f' */
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The value of 4 (8) hex digits at p; a byte that is no hex digit ORs a
 * negative value into *bad. */
static inline uint32_t
hex4(const unsigned char *p, int *bad)
{
    int a = hex_value(p[0]), b = hex_value(p[1]), c = hex_value(p[2]), d = hex_value(p[3]);
    *bad |= a | b | c | d;
    return (uint32_t)(((a & 0xF) << 12) | ((b & 0xF) << 8) | ((c & 0xF) << 4) | (d & 0xF));
}

static inline uint32_t
hex8(const unsigned char *p, int *bad)
{
    return (hex4(p, bad) << 16) | hex4(p + 4, bad);
}

/* The canonical 8-4-4-4-12 text at p as halves; 0 if it is not one. */
static inline int
parse_canonical36(const unsigned char *p, uint64_t *hi, uint64_t *lo)
{
    int bad = 0;
    uint64_t vh = ((uint64_t)hex8(p, &bad) << 32) | ((uint64_t)hex4(p + 9, &bad) << 16)
                  | hex4(p + 14, &bad);
    uint64_t vl = ((uint64_t)hex4(p + 19, &bad) << 48) | ((uint64_t)hex4(p + 24, &bad) << 32)
                  | hex8(p + 28, &bad);
    if (bad < 0 || p[8] != '-' || p[13] != '-' || p[18] != '-' || p[23] != '-') {
        return 0;
    }
    *hi = vh;
    *lo = vl;
    return 1;
}
#endif

/* The canonical UUID string s (a str) as halves; 0 if it is not one. */
static int
parse_uuid36(PyObject *s, uint64_t *hi, uint64_t *lo)
{
    return PyUnicode_CheckExact(s) && PyUnicode_GET_LENGTH(s) == 36
           && PyUnicode_IS_COMPACT_ASCII(s) && parse_canonical36(PyUnicode_1BYTE_DATA(s), hi, lo);
}

/* A UUID's int as two halves (its low 128 bits); -1 if it is no int. */
static int
split_uuid_int(PyObject *v, uint64_t *hi, uint64_t *lo)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a UUID's int must be an int, not %.100s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    unsigned char b[16];
#if PY_VERSION_HEX >= 0x030D0000
    if (PyLong_AsNativeBytes(v, b, 16, Py_ASNATIVEBYTES_BIG_ENDIAN
                             | Py_ASNATIVEBYTES_UNSIGNED_BUFFER) < 0) {
        return -1;
    }
#else
    if (_PyLong_AsByteArray((PyLongObject *)v, b, 16, 0, 0) < 0) {
        /* More than 128 bits: no UUID. Keep the low 128, as a mask would. */
        PyErr_Clear();
        PyObject *mask = PyLong_FromString("ffffffffffffffffffffffffffffffff", NULL, 16);
        PyObject *low = mask ? PyNumber_And(v, mask) : NULL;
        Py_XDECREF(mask);
        if (low == NULL) {
            return -1;
        }
        int rc = _PyLong_AsByteArray((PyLongObject *)low, b, 16, 0, 0);
        Py_DECREF(low);
        if (rc < 0) {
            return -1;
        }
    }
#endif
    uint64_t h = 0, l = 0;
    for (int i = 0; i < 8; i++) {
        h = (h << 8) | b[i];
        l = (l << 8) | b[8 + i];
    }
    *hi = h;
    *lo = l;
    return 0;
}

/* The exception being raised, normalized, with its traceback (and the
 * error indicator cleared): PyErr_GetRaisedException before Python 3.12. */
static PyObject *
fetch_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

enum { KIND_JSON = 1, KIND_FUNC = 2, KIND_GET_UUID = 3 };

/* How to get the UUID of messages of one type: the last type seen. */
typedef struct {
    PyTypeObject *type;
    int kind;
    PyObject *func; /* KIND_JSON, KIND_FUNC: UUID_INT_OF[type] */
    /* KIND_JSON: the "_meta" and "uuid" key objects of decoded documents
     * (see value_of) */
    PyObject *meta_key, *uuid_key;
} UuidOf;

static void
uuid_of_clear(UuidOf *u)
{
    Py_CLEAR(u->type);
    Py_CLEAR(u->func);
    Py_CLEAR(u->meta_key);
    Py_CLEAR(u->uuid_key);
}

/* dict[key] (borrowed; NULL, with or without an exception, if missing)
 * for a str `key`, looked up by the key object that the dicts hold. A
 * decoder reusing its key strings (orjson does) puts the same "_meta"
 * object in every document: `*seen` is that object, learned from the first
 * document that has the key. Looked up by it, the dict finds its entry by
 * identity, without comparing characters. Any str equal to `key` finds the
 * same entry, so the answer is dict[key] whichever object is used. */
static inline PyObject *
value_of(PyObject *dict, PyObject *key, PyObject **seen)
{
    if (*seen != NULL) {
        if (PyDict_GET_SIZE(dict) == 1) {
            /* {"uuid": ...} alone, as _meta mostly is: its one entry, when
             * its key is that object, is dict[key]; quicker than a lookup. */
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            if (PyDict_Next(dict, &pos, &k, &v) && k == *seen) {
                return v;
            }
        }
        return PyDict_GetItemWithError(dict, *seen);
    }
    PyObject *found = PyDict_GetItemWithError(dict, key);
    if (found != NULL) {
        /* Learn the dict's own key object, once. */
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(dict, &pos, &k, &v)) {
            if (v == found && PyUnicode_CheckExact(k) && PyUnicode_Compare(k, key) == 0) {
                *seen = Py_NewRef(k);
                break;
            }
        }
    }
    return found;
}

/* The UUID of `msg` as two halves, as Sequencer.queue_uncommitted gets it:
 * UUID_INT_OF[type(msg)](msg) if the type is registered, else
 * msg.get_uuid().int. Documents with their UUID at _meta/uuid (a plain dict
 * lookup) and in the canonical form are parsed here; any other case calls
 * the registered function, which gives the same answer. -1 on error. */
static int
message_uuid(UuidOf *u, PyObject *msg, uint64_t *hi, uint64_t *lo)
{
    PyTypeObject *t = Py_TYPE(msg);
    if (t != u->type) {
        PyObject *func = PyDict_GetItemWithError(C.uuid_int_of, (PyObject *)t);
        if (func == NULL && PyErr_Occurred()) {
            return -1;
        }
        int kind = func == NULL ? KIND_GET_UUID : KIND_FUNC;
        if (func == C.json_uuid_int && PyDict_Check(msg)) {
            PyObject *own = PyObject_GetAttr((PyObject *)t, C.str_getitem);
            if (own == NULL) {
                return -1;
            }
            if (own == C.dict_getitem) {
                kind = KIND_JSON;
            }
            Py_DECREF(own);
        }
        Py_XSETREF(u->func, Py_XNewRef(func));
        Py_XSETREF(u->type, (PyTypeObject *)Py_NewRef(t));
        u->kind = kind;
    }
    if (u->kind == KIND_JSON) {
        /* message._types.json_uuid_int: doc[path[0]][path[1]], canonical string. */
        PyObject *meta = value_of(msg, C.str_meta, &u->meta_key);
        if (meta != NULL && PyDict_CheckExact(meta)) {
            PyObject *s = value_of(meta, C.str_uuid, &u->uuid_key);
            if (s != NULL && parse_uuid36(s, hi, lo)) {
                return 0;
            }
            if (s == Py_None || (s == NULL && !PyErr_Occurred())) {
                *hi = *lo = 0; /* {"uuid": null}, or no "uuid": no UUID (0), as json_uuid_int */
                return 0;
            }
        }
        else if (meta == NULL && !PyErr_Occurred()) {
            *hi = *lo = 0; /* no "_meta": no UUID (0), as json_uuid_int */
            return 0;
        }
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    PyObject *v;
    if (u->kind != KIND_GET_UUID) {
        v = PyObject_Vectorcall(u->func, &msg, 1, NULL);
    }
    else {
        PyObject *uu = PyObject_CallMethodNoArgs(msg, C.str_get_uuid);
        v = uu ? PyObject_GetAttr(uu, C.str_int) : NULL;
        Py_XDECREF(uu);
    }
    if (v == NULL) {
        return -1;
    }
    int rc = split_uuid_int(v, hi, lo);
    Py_DECREF(v);
    return rc;
}
