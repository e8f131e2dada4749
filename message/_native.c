/*
 * message._native: the native core of the message package.
 *
 * message/_sequencer.py and message/_reader.py are the readable definition
 * of the behaviour; this module implements the same thing, owning its own
 * state, and message/_core.py binds the public names to it when it is built:
 *
 * - Sequencer: the whole state machine of message/_sequencer.py (queue,
 *   dequeue, transactions, roll-backs, replays, producer states, pruning,
 *   checkpoints), with the same methods and the same results. Its state is
 *   plain C: a table of producers (last_ack, max_clock, begin, and the open
 *   span's envelopes), the envelopes ready to dequeue, the replay under way.
 * - EnvelopeReader: frames in, Envelopes out (the loop of a
 *   ReadUncommittedIter): new_message(spec), decode (orjson.loads and a dict
 *   merge for plain JSON documents, else the framing's unmarshal_frame),
 *   Envelope.
 * - CommittedReader: an EnvelopeReader feeding a Sequencer (the loop of a
 *   ReadCommittedIter), which asks Python for a replay iterator when the
 *   Sequencer needs one.
 * - parse_uuids, format_uuids: UUID columns of the Spark source.
 *
 * What it takes from Python is handed to configure() once, by
 * message/_core.py: the public classes it builds (Envelope, ProducerState,
 * the errors), the UUID_INT_OF registry, and the small functions both
 * implementations share (the prune horizon, the two log messages). Envelope
 * fields are read and written through the dataclass's own member
 * descriptors, as `env.begin` would; nothing here touches another class's
 * private state.
 *
 * The UUID bit layout below is message/layout.py's; tests/test_layout.py
 * checks layout() against it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <pythread.h>

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

/* -- what configure() is given ------------------------------------------ */

typedef struct {
    int ready;
    PyTypeObject *envelope_type;
    PyObject *d_journal, *d_begin, *d_end, *d_message; /* Envelope's member descriptors */
    PyObject *producer_state;                          /* ProducerState */
    PyObject *must_start_replay, *replay_error;        /* the error classes */
    PyObject *uuid_int_of;   /* dict: message type -> function giving the UUID as an int */
    PyObject *json_uuid_int; /* that function of documents with their UUID at _meta/uuid */
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

static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"envelope", "producer_state", "must_start_replay",
                             "replay_error", "uuid_int_of", "json_uuid_int",
                             "horizon_units", "warn_unknown_flags", "warn_old_ack", NULL};
    PyTypeObject *env;
    PyObject *ps, *msr, *rerr, *uio, *jui, *hu, *wuf, *woa;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOO!OOOO:configure", kwlist, &PyType_Type,
                                     &env, &ps, &msr, &rerr, &PyDict_Type, &uio, &jui, &hu,
                                     &wuf, &woa)) {
        return NULL;
    }
    if (C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "message._native is configured already");
        return NULL;
    }
    Config c = {0};
    c.d_journal = member_descriptor(env, "journal");
    c.d_begin = c.d_journal ? member_descriptor(env, "begin") : NULL;
    c.d_end = c.d_begin ? member_descriptor(env, "end") : NULL;
    c.d_message = c.d_end ? member_descriptor(env, "message") : NULL;
    if (c.d_message == NULL) {
        return NULL;
    }
#define INTERN(field, text) \
    if ((c.field = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(str_meta, "_meta");
    INTERN(str_uuid, "uuid");
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
        return NULL;
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
    Py_RETURN_NONE;
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

/* Hex digit values, -1 for other bytes. */
static signed char HEX[256];

static void
init_hex(void)
{
    for (int i = 0; i < 256; i++) {
        HEX[i] = -1;
    }
    for (int i = 0; i < 10; i++) {
        HEX['0' + i] = (signed char)i;
    }
    for (int i = 0; i < 6; i++) {
        HEX['a' + i] = HEX['A' + i] = (signed char)(10 + i);
    }
}

/* The canonical 8-4-4-4-12 form only; 1 if parsed. */
static int
parse_uuid36(PyObject *s, uint64_t *hi, uint64_t *lo)
{
    if (!PyUnicode_CheckExact(s) || PyUnicode_GET_LENGTH(s) != 36
        || !PyUnicode_IS_COMPACT_ASCII(s)) {
        return 0;
    }
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(s);
    if (p[8] != '-' || p[13] != '-' || p[18] != '-' || p[23] != '-') {
        return 0;
    }
    static const unsigned char pos[32] = {
        0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17,
        19, 20, 21, 22, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35};
    uint64_t h = 0, l = 0;
    int bad = 0;
    for (int i = 0; i < 16; i++) {
        int v = HEX[p[pos[i]]];
        bad |= v;
        h = (h << 4) | (uint64_t)(v & 0xF);
    }
    for (int i = 16; i < 32; i++) {
        int v = HEX[p[pos[i]]];
        bad |= v;
        l = (l << 4) | (uint64_t)(v & 0xF);
    }
    if (bad < 0) {
        return 0;
    }
    *hi = h;
    *lo = l;
    return 1;
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
} UuidOf;

static void
uuid_of_clear(UuidOf *u)
{
    Py_CLEAR(u->type);
    Py_CLEAR(u->func);
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
        /* JsonDocument._uuid_int: self["_meta"]["uuid"], canonical string. */
        PyObject *meta = PyDict_GetItemWithError(msg, C.str_meta);
        if (meta != NULL && PyDict_CheckExact(meta)) {
            PyObject *s = PyDict_GetItemWithError(meta, C.str_uuid);
            if (s != NULL && parse_uuid36(s, hi, lo)) {
                return 0;
            }
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

/* -- Sequencer ------------------------------------------------------------ */
/*
 * The state machine of message/_sequencer.py, step for step (its docstring
 * explains the rules and the virtual ring). Names follow the Python code.
 */

/* A kept envelope of an open span: its ring number, clock and offset. */
typedef struct {
    uint64_t seq;
    uint64_t clock;
    long long begin;
    PyObject *env;
} Entry;

/* A producer's state within a journal (the Python _Partial). */
typedef struct {
    Py_ssize_t journal; /* index in Sequencer.journals */
    uint64_t producer;
    uint64_t last_ack;
    uint64_t max_clock;
    long long begin;    /* offset of the open span, or -1 */
    Entry *entries;     /* the open span's kept envelopes: [head, len) */
    Py_ssize_t head, len, cap;
} Partial;

/* A committed span that must be (partly) re-read before it is emitted. */
typedef struct {
    int active;
    Py_ssize_t journal;
    uint64_t producer;
    long long begin;   /* advances as replayed envelopes are consumed */
    long long end;     /* begin of the span's first envelope still in the ring */
    uint64_t running;  /* the largest clock of the span seen so far */
    uint64_t emitted;  /* the largest clock of the span emitted so far */
    uint64_t ack;
    Entry *tail;       /* the span's part still in the ring, then the ACK */
    Py_ssize_t ntail;
    PyObject *it;      /* the replay iterator, once started */
} Replay;

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;       /* the ring's size */
    uint64_t seq;          /* kept envelopes so far: the ring is (seq - size, seq] */
    uint64_t sweep_at;     /* when to drop entries that left the ring */
    /* Journals seen, by index: names, and a dict name -> index. */
    PyObject *journal_names; /* list */
    PyObject *journal_index; /* dict */
    PyObject *last_spec;     /* the last envelope's journal spec, and its index */
    Py_ssize_t last_journal;
    /* Producers, in the order they were first seen, and a hash index of
     * them: slots hold (index + 1), 0 is empty; open addressing. */
    Partial *partials;
    Py_ssize_t npartials, pcap;
    int32_t *slots;
    size_t nslots; /* a power of 2, at least twice npartials */
    /* Committed envelopes ready to dequeue: out[out_pos:out_n], with clocks. */
    PyObject **out;
    uint64_t *out_clock;
    Py_ssize_t out_n, out_pos, out_cap;
    Replay replay;
    /* The sequence being dequeued: its partial (-1: a message with no
     * clock; -2: forgotten since) and the envelope that committed it. */
    Py_ssize_t inflight_p;
    PyObject *inflight_env;
    UuidOf uuid_of;
} Sequencer;

static PyTypeObject SequencerType;

static inline size_t
producer_hash(Py_ssize_t journal, uint64_t producer)
{
    uint64_t h = (producer ^ ((uint64_t)journal << 48)) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h ^ (h >> 29));
}

/* The slot of (journal, producer): its partial's, or the empty one where
 * it would go. */
static inline int32_t *
find_slot(Sequencer *s, Py_ssize_t journal, uint64_t producer)
{
    size_t mask = s->nslots - 1;
    size_t i = producer_hash(journal, producer) & mask;
    for (;;) {
        int32_t *slot = &s->slots[i];
        if (*slot == 0) {
            return slot;
        }
        Partial *p = &s->partials[*slot - 1];
        if (p->producer == producer && p->journal == journal) {
            return slot;
        }
        i = (i + 1) & mask;
    }
}

/* Rebuild the hash index (after growing, or after partials were removed). */
static int
reindex(Sequencer *s)
{
    size_t n = 16;
    while (n < (size_t)s->npartials * 2 + 2) {
        n *= 2;
    }
    int32_t *slots = PyMem_Calloc(n, sizeof(int32_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(s->slots);
    s->slots = slots;
    s->nslots = n;
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        *find_slot(s, s->partials[k].journal, s->partials[k].producer) = (int32_t)(k + 1);
    }
    return 0;
}

static void
entries_clear(Partial *p)
{
    for (Py_ssize_t k = p->head; k < p->len; k++) {
        Py_CLEAR(p->entries[k].env);
    }
    p->head = p->len = 0;
}

static void
partial_free(Partial *p)
{
    entries_clear(p);
    PyMem_Free(p->entries);
    p->entries = NULL;
    p->cap = 0;
}

static int
entries_append(Partial *p, uint64_t seq, uint64_t clock, long long begin, PyObject *env)
{
    if (p->len == p->cap) {
        if (p->head > 0) {
            /* Slide the live entries down before growing. */
            memmove(p->entries, p->entries + p->head, (p->len - p->head) * sizeof(Entry));
            p->len -= p->head;
            p->head = 0;
        }
        if (p->len == p->cap) {
            Py_ssize_t cap = p->cap ? p->cap * 2 : 4;
            Entry *e = PyMem_Realloc(p->entries, cap * sizeof(Entry));
            if (e == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            p->entries = e;
            p->cap = cap;
        }
    }
    p->entries[p->len++] = (Entry){seq, clock, begin, Py_NewRef(env)};
    return 0;
}

/* The index of a journal name (added if new); -1 on error. */
static Py_ssize_t
journal_of_name(Sequencer *s, PyObject *name)
{
    PyObject *idx = PyDict_GetItemWithError(s->journal_index, name);
    if (idx != NULL) {
        return PyLong_AsSsize_t(idx);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "a journal name must be a str, not %.100s",
                     Py_TYPE(name)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(s->journal_names);
    PyObject *nobj = PyLong_FromSsize_t(n);
    if (nobj == NULL || PyDict_SetItem(s->journal_index, name, nobj) < 0
        || PyList_Append(s->journal_names, name) < 0) {
        Py_XDECREF(nobj);
        return -1;
    }
    Py_DECREF(nobj);
    return n;
}

/* The journal index of a JournalSpec (spec.name); -1 on error. */
static Py_ssize_t
journal_of_spec(Sequencer *s, PyObject *spec)
{
    if (spec == s->last_spec) {
        return s->last_journal;
    }
    PyObject *name = PyObject_GetAttr(spec, C.str_name);
    Py_ssize_t j = name ? journal_of_name(s, name) : -1;
    Py_XDECREF(name);
    if (j < 0) {
        return -1;
    }
    /* A JournalSpec is frozen: its name stays that of the index. */
    Py_XSETREF(s->last_spec, Py_NewRef(spec));
    s->last_journal = j;
    return j;
}

static inline PyObject *
journal_name(Sequencer *s, Py_ssize_t j)
{
    return PyList_GET_ITEM(s->journal_names, j); /* borrowed */
}

/* The partial of (journal, producer), made with `last_ack` if new. */
static Partial *
get_partial(Sequencer *s, Py_ssize_t journal, uint64_t producer, uint64_t last_ack, int *created)
{
    int32_t *slot = find_slot(s, journal, producer);
    if (*slot != 0) {
        *created = 0;
        return &s->partials[*slot - 1];
    }
    if (s->npartials == s->pcap) {
        Py_ssize_t cap = s->pcap ? s->pcap * 2 : 16;
        Partial *ps = PyMem_Realloc(s->partials, cap * sizeof(Partial));
        if (ps == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        s->partials = ps;
        s->pcap = cap;
    }
    Py_ssize_t k = s->npartials++;
    s->partials[k] = (Partial){journal, producer, last_ack, last_ack, -1, NULL, 0, 0, 0};
    if ((size_t)s->npartials * 2 + 2 > s->nslots) {
        if (reindex(s) < 0) {
            s->npartials--;
            return NULL;
        }
    }
    else {
        *slot = (int32_t)(k + 1);
    }
    *created = 1;
    return &s->partials[k];
}

static void
out_clear(Sequencer *s)
{
    for (Py_ssize_t k = s->out_pos; k < s->out_n; k++) {
        Py_CLEAR(s->out[k]);
    }
    s->out_n = s->out_pos = 0;
}

static int
out_reserve(Sequencer *s, Py_ssize_t n)
{
    if (n <= s->out_cap) {
        return 0;
    }
    Py_ssize_t cap = s->out_cap ? s->out_cap : 8;
    while (cap < n) {
        cap *= 2;
    }
    PyObject **out = PyMem_Realloc(s->out, cap * sizeof(PyObject *));
    uint64_t *clocks = out ? PyMem_Realloc(s->out_clock, cap * sizeof(uint64_t)) : NULL;
    if (out != NULL) {
        s->out = out;
    }
    if (clocks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->out_clock = clocks;
    s->out_cap = cap;
    return 0;
}

/* Append to out (the caller reserved room). */
static inline void
out_push(Sequencer *s, PyObject *env, uint64_t clock)
{
    s->out[s->out_n] = Py_NewRef(env);
    s->out_clock[s->out_n] = clock;
    s->out_n++;
}

static void
replay_clear(Replay *r)
{
    for (Py_ssize_t k = 0; k < r->ntail; k++) {
        Py_CLEAR(r->tail[k].env);
    }
    PyMem_Free(r->tail);
    r->tail = NULL;
    r->ntail = 0;
    Py_CLEAR(r->it);
    r->active = 0;
}

static void
set_inflight(Sequencer *s, Py_ssize_t p, PyObject *env)
{
    s->inflight_p = p;
    Py_XSETREF(s->inflight_env, Py_NewRef(env));
}

/* Drop the entries that have left the ring, so that memory stays bounded by
 * it even for spans that never end (abandoned producers). */
static void
sweep(Sequencer *s)
{
    uint64_t cutoff = s->seq > (uint64_t)s->size ? s->seq - (uint64_t)s->size : 0;
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        Partial *p = &s->partials[k];
        while (p->head < p->len && p->entries[p->head].seq <= cutoff) {
            Py_CLEAR(p->entries[p->head].env);
            p->head++;
        }
        if (p->head == p->len) {
            p->head = p->len = 0;
        }
    }
    s->sweep_at = s->seq + (uint64_t)s->size;
}

static int
warn_call(PyObject *fn, PyObject *a, PyObject *b, long long offset)
{
    PyObject *off = PyLong_FromLongLong(offset);
    if (off == NULL) {
        return -1;
    }
    PyObject *args[3] = {a, b, off};
    PyObject *res = PyObject_Vectorcall(fn, args, 3, NULL);
    Py_DECREF(off);
    Py_XDECREF(res);
    return res ? 0 : -1;
}

/* Emit p's span, committed by ack_env (ring number seq): into out if it is
 * wholly in the ring, else as a replay. */
static int
commit_span(Sequencer *s, Partial *p, uint64_t ack, PyObject *ack_env, long long ack_begin,
            uint64_t seq)
{
    uint64_t cutoff = seq > (uint64_t)s->size ? seq - (uint64_t)s->size : 0;
    Entry *first = p->head < p->len ? &p->entries[p->head] : NULL;
    if (first != NULL && first->seq > cutoff && first->begin == p->begin) {
        /* Wholly in the ring, where clocks strictly increase (duplicates
         * were never kept): emit all but those beyond the ACK's clock, then
         * the ACK unless the last emitted had its clock. */
        if (out_reserve(s, p->len - p->head + 1) < 0) {
            return -1;
        }
        uint64_t emitted = p->last_ack;
        for (Py_ssize_t k = p->head; k < p->len; k++) {
            if (p->entries[k].clock <= ack) {
                out_push(s, p->entries[k].env, p->entries[k].clock);
                emitted = p->entries[k].clock;
            }
        }
        if (ack > emitted) {
            out_push(s, ack_env, ack);
        }
        return 0;
    }
    Replay *r = &s->replay;
    Py_ssize_t n = 0;
    for (Py_ssize_t k = p->head; k < p->len; k++) {
        n += p->entries[k].seq > cutoff;
    }
    r->tail = PyMem_Malloc((n + 1) * sizeof(Entry));
    if (r->tail == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = p->head; k < p->len; k++) {
        if (p->entries[k].seq > cutoff) {
            r->tail[r->ntail] = p->entries[k];
            Py_INCREF(r->tail[r->ntail].env);
            r->ntail++;
        }
    }
    r->tail[r->ntail++] = (Entry){seq, ack, ack_begin, Py_NewRef(ack_env)};
    r->active = 1;
    r->journal = p->journal;
    r->producer = p->producer;
    r->begin = p->begin;
    r->end = r->tail[0].begin;
    r->running = r->emitted = p->last_ack;
    r->ack = ack;
    return 0;
}

static int seq_queue_parts(Sequencer *s, PyObject *env, PyObject *msg, PyObject *spec,
                           long long begin);

/* queue_uncommitted: 1 (True), 0 (False), -1 on error. */
static int
seq_queue(Sequencer *s, PyObject *env)
{
    if (s->out_pos < s->out_n || s->replay.active) {
        PyErr_SetString(PyExc_RuntimeError, "committed messages remain to dequeue");
        return -1;
    }
    PyObject *msg = env_get(env, C.d_message, C.str_message);
    PyObject *spec = msg ? env_get(env, C.d_journal, C.str_journal) : NULL;
    long long begin = 0;
    int rc = spec ? env_get_ll(env, C.d_begin, C.str_begin, &begin) : -1;
    if (rc == 0) {
        rc = seq_queue_parts(s, env, msg, spec, begin);
    }
    Py_XDECREF(msg);
    Py_XDECREF(spec);
    return rc;
}

/* queue_uncommitted of env, whose message, journal spec and begin offset
 * are given (borrowed): what a reader that made env knows already. */
static int
seq_queue_parts(Sequencer *s, PyObject *env, PyObject *msg, PyObject *spec, long long begin)
{
    if (s->out_pos < s->out_n || s->replay.active) {
        PyErr_SetString(PyExc_RuntimeError, "committed messages remain to dequeue");
        return -1;
    }
    s->out_n = s->out_pos = 0;
    uint64_t hi, lo;
    if (message_uuid(&s->uuid_of, msg, &hi, &lo) < 0) {
        return -1;
    }
    uint64_t clock = clock_of(hi, lo);
    uint64_t seq = s->seq + 1; /* if kept; a drop returns before using it */
    if (clock == 0) {
        /* No clock: at-least-once. Commits at once, and is never tracked. */
        if (out_reserve(s, 1) < 0) {
            return -1;
        }
        s->seq = seq;
        out_push(s, env, 0);
        set_inflight(s, -1, env);
        return 1;
    }
    unsigned flags = flags_of(lo);
    Py_ssize_t j = journal_of_spec(s, spec);
    if (j < 0) {
        return -1;
    }
    int created;
    Partial *p = get_partial(s, j, lo & PRODUCER_MASK, clock - 1, &created);
    if (p == NULL) {
        return -1;
    }
    if (flags == CONTINUE_TXN) {
        if (clock <= p->max_clock) {
            return 1; /* duplicate: dropped, takes no slot (max_clock >= last_ack) */
        }
        if (entries_append(p, seq, clock, begin, env) < 0) {
            return -1;
        }
        s->seq = seq;
        if (p->begin == -1) {
            p->begin = begin;
        }
        p->max_clock = clock;
        if (seq >= s->sweep_at) {
            sweep(s);
        }
        return 0;
    }
    if (out_reserve(s, 1) < 0) {
        return -1;
    }
    if (flags == ACK_TXN) {
        if (clock <= p->last_ack) {
            /* Roll-back: dropped, takes no slot. */
            if (clock < p->last_ack) {
                PyObject *pid = PyLong_FromUnsignedLongLong(p->producer);
                int w = pid ? warn_call(C.warn_old_ack, pid, journal_name(s, j), begin) : -1;
                Py_XDECREF(pid);
                if (w < 0) {
                    return -1;
                }
            }
            p->last_ack = p->max_clock = clock;
            p->begin = -1;
            entries_clear(p);
            return 1;
        }
        if (p->begin != -1) {
            if (commit_span(s, p, clock, env, begin, seq) < 0) {
                return -1;
            }
        }
        else {
            out_push(s, env, clock); /* an ACK with no span commits alone */
        }
    }
    else {
        if (flags != OUTSIDE_TXN) {
            PyObject *f = PyLong_FromUnsignedLong(flags);
            int w = f ? warn_call(C.warn_unknown_flags, f, journal_name(s, j), begin) : -1;
            Py_XDECREF(f);
            if (w < 0) {
                return -1;
            }
        }
        if (clock <= p->last_ack) {
            return 1; /* duplicate: dropped, takes no slot */
        }
        /* Commits itself; an open span (mixed committed and transactional
         * publishing by one producer) is discarded. */
        out_push(s, env, clock);
    }
    s->seq = seq;
    set_inflight(s, p - s->partials, env);
    p->last_ack = p->max_clock = clock;
    if (p->begin != -1) {
        p->begin = -1;
        entries_clear(p);
    }
    return 1;
}

static PyObject *
replay_error(Replay *r, PyObject *journal, const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *problem = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (problem == NULL) {
        return NULL;
    }
    PyObject *kw = Py_BuildValue("{sOsLsL}", "journal", journal, "begin", r->begin, "end",
                                 r->end);
    PyObject *args = kw ? PyTuple_Pack(1, problem) : NULL;
    PyObject *exc = args ? PyObject_Call(C.replay_error, args, kw) : NULL;
    Py_DECREF(problem);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    return exc;
}

/* Raise ReplayError(problem) (chained to the exception being raised, if
 * any), and stop reading the replay iterator. */
static void
raise_replay_error(Sequencer *s, PyObject *problem_exc, PyObject *cause)
{
    Py_CLEAR(s->replay.it);
    if (problem_exc == NULL) {
        Py_XDECREF(cause);
        return;
    }
    if (cause != NULL) {
        PyException_SetCause(problem_exc, cause); /* steals */
        PyException_SetContext(problem_exc, Py_NewRef(cause));
    }
    PyErr_SetObject((PyObject *)Py_TYPE(problem_exc), problem_exc);
    Py_DECREF(problem_exc);
}

/* The next replayed envelope to emit (1, *env set), the end of the replay
 * (0), or an error (-1). */
static int
next_replayed(Sequencer *s, PyObject **out)
{
    Replay *r = &s->replay;
    PyObject *journal = journal_name(s, r->journal);
    for (;;) {
        PyObject *env = PyIter_Next(r->it);
        if (env == NULL) {
            if (!PyErr_Occurred()) {
                return 0;
            }
            PyObject *exc = fetch_exception();
            PyObject *repr = PyObject_Repr(exc);
            PyObject *err = repr ? replay_error(r, journal, "the replay iterator failed: %U",
                                                repr) : NULL;
            Py_XDECREF(repr);
            raise_replay_error(s, err, exc);
            return -1;
        }
        PyObject *spec = env_get(env, C.d_journal, C.str_journal);
        PyObject *name = spec ? PyObject_GetAttr(spec, C.str_name) : NULL;
        Py_XDECREF(spec);
        long long begin, end;
        if (name == NULL || env_get_ll(env, C.d_begin, C.str_begin, &begin) < 0
            || env_get_ll(env, C.d_end, C.str_end, &end) < 0) {
            Py_XDECREF(name);
            Py_DECREF(env);
            return -1;
        }
        int same = PyObject_RichCompareBool(name, journal, Py_EQ);
        if (same < 0) {
            Py_DECREF(name);
            Py_DECREF(env);
            return -1;
        }
        PyObject *err = NULL;
        if (!same) {
            err = replay_error(r, journal, "it read journal %S", name);
        }
        else if (begin < r->begin) {
            err = replay_error(r, journal, "an envelope begins at %lld, before %lld", begin,
                               r->begin);
        }
        else if (end > r->end) {
            err = replay_error(r, journal, "an envelope ends at %lld, after %lld", end, r->end);
        }
        Py_DECREF(name);
        if (err != NULL || PyErr_Occurred()) {
            Py_DECREF(env);
            raise_replay_error(s, err, NULL);
            return -1;
        }
        r->begin = end;
        PyObject *msg = env_get(env, C.d_message, C.str_message);
        uint64_t hi, lo;
        if (msg == NULL || message_uuid(&s->uuid_of, msg, &hi, &lo) < 0) {
            Py_XDECREF(msg);
            Py_DECREF(env);
            return -1;
        }
        Py_DECREF(msg);
        uint64_t clock = clock_of(hi, lo);
        if ((lo & PRODUCER_MASK) != r->producer || clock <= r->running) {
            /* Another producer's message in the same range; or a duplicate,
             * or a clock-less message emitted before. */
            Py_DECREF(env);
            continue;
        }
        int emits = clock <= r->ack; /* span_emits: running < clock <= ack */
        r->running = clock;
        if (!emits) {
            Py_DECREF(env); /* written after the ACK was decided: not committed */
            continue;
        }
        r->emitted = clock;
        *out = env;
        return 1;
    }
}

/* deque_committed: 1 with *env set, 0 when none remain, 2 when a replay
 * must start (the iterator is not set), -1 on error. */
static int
seq_next(Sequencer *s, PyObject **env)
{
    for (;;) {
        if (s->out_pos < s->out_n) {
            *env = s->out[s->out_pos];
            s->out[s->out_pos++] = NULL; /* the reference goes to the caller */
            if (s->out_pos == s->out_n && !s->replay.active) {
                s->out_pos = s->out_n = 0;
            }
            return 1;
        }
        Replay *r = &s->replay;
        if (!r->active) {
            s->out_pos = s->out_n = 0;
            return 0;
        }
        if (r->it == NULL) {
            return 2;
        }
        int rc = next_replayed(s, env);
        if (rc != 0) {
            return rc;
        }
        /* The replay is done: the rest of the span is in the ring. */
        s->out_pos = s->out_n = 0;
        if (out_reserve(s, r->ntail) < 0) {
            return -1;
        }
        uint64_t running = r->running, emitted = r->emitted, ack = r->ack;
        for (Py_ssize_t k = 0; k + 1 < r->ntail; k++) {
            uint64_t clock = r->tail[k].clock;
            if (running < clock && clock <= ack) { /* span_emits */
                out_push(s, r->tail[k].env, clock);
                emitted = clock;
            }
            if (clock > running) {
                running = clock;
            }
        }
        if (ack > emitted) { /* ack_emits */
            out_push(s, r->tail[r->ntail - 1].env, ack);
        }
        replay_clear(r);
    }
}

static int
sequencer_init(Sequencer *s, PyObject *args, PyObject *kwds);

static PyObject *
sequencer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (check_ready() < 0) {
        return NULL;
    }
    Sequencer *s = (Sequencer *)type->tp_alloc(type, 0);
    if (s == NULL) {
        return NULL;
    }
    s->journal_names = PyList_New(0);
    s->journal_index = PyDict_New();
    s->inflight_p = -1;
    if (s->journal_names == NULL || s->journal_index == NULL || reindex(s) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static void
partials_clear(Sequencer *s)
{
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        partial_free(&s->partials[k]);
    }
    s->npartials = 0;
}

/* Replace the producers by `states` (ProducerStates). */
static int
load_states(Sequencer *s, PyObject *states)
{
    PyObject *it = PyObject_GetIter(states);
    if (it == NULL) {
        return -1;
    }
    partials_clear(s);
    if (reindex(s) < 0) {
        Py_DECREF(it);
        return -1;
    }
    PyObject *st;
    while ((st = PyIter_Next(it)) != NULL) {
        PyObject *journal = PyObject_GetAttr(st, C.str_journal);
        PyObject *producer = journal ? PyObject_GetAttr(st, C.str_producer) : NULL;
        PyObject *last_ack = producer ? PyObject_GetAttr(st, C.str_last_ack) : NULL;
        PyObject *begin = last_ack ? PyObject_GetAttr(st, C.str_begin) : NULL;
        Py_DECREF(st);
        int ok = begin != NULL;
        Py_buffer view = {0};
        uint64_t pid = 0, ack = 0;
        long long b = 0;
        Py_ssize_t j = -1;
        if (ok && PyObject_GetBuffer(producer, &view, PyBUF_SIMPLE) == 0) {
            if (view.len > 6) {
                PyErr_SetString(PyExc_ValueError, "a ProducerState's producer is 6 bytes");
                ok = 0;
            }
            for (Py_ssize_t k = 0; ok && k < view.len; k++) {
                pid = (pid << 8) | ((unsigned char *)view.buf)[k];
            }
            PyBuffer_Release(&view);
        }
        else {
            ok = 0;
        }
        if (ok) {
            ack = PyLong_AsUnsignedLongLong(last_ack);
            b = PyLong_AsLongLong(begin);
            ok = !PyErr_Occurred() && (j = journal_of_name(s, journal)) >= 0;
        }
        Py_XDECREF(journal);
        Py_XDECREF(producer);
        Py_XDECREF(last_ack);
        Py_XDECREF(begin);
        int created;
        Partial *p = ok ? get_partial(s, j, pid, ack, &created) : NULL;
        if (p == NULL) {
            Py_DECREF(it);
            return -1;
        }
        p->last_ack = p->max_clock = ack;
        p->begin = b;
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static int
sequencer_init(Sequencer *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"states", "buffer", NULL};
    PyObject *states = NULL;
    Py_ssize_t buffer = 4096;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|On:Sequencer", kwlist, &states, &buffer)) {
        return -1;
    }
    s->size = buffer < 1 ? 1 : buffer;
    s->sweep_at = (uint64_t)s->size;
    return states == NULL ? 0 : load_states(s, states);
}

static int
sequencer_traverse(Sequencer *s, visitproc visit, void *arg)
{
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        Partial *p = &s->partials[k];
        for (Py_ssize_t e = p->head; e < p->len; e++) {
            Py_VISIT(p->entries[e].env);
        }
    }
    for (Py_ssize_t k = s->out_pos; k < s->out_n; k++) {
        Py_VISIT(s->out[k]);
    }
    for (Py_ssize_t k = 0; k < s->replay.ntail; k++) {
        Py_VISIT(s->replay.tail[k].env);
    }
    Py_VISIT(s->replay.it);
    Py_VISIT(s->inflight_env);
    Py_VISIT(s->last_spec);
    Py_VISIT(s->uuid_of.type);
    Py_VISIT(s->uuid_of.func);
    Py_VISIT(s->journal_names);
    Py_VISIT(s->journal_index);
    return 0;
}

static int
sequencer_clear(Sequencer *s)
{
    partials_clear(s);
    out_clear(s);
    replay_clear(&s->replay);
    Py_CLEAR(s->inflight_env);
    Py_CLEAR(s->last_spec);
    uuid_of_clear(&s->uuid_of);
    return 0;
}

static void
sequencer_dealloc(Sequencer *s)
{
    PyObject_GC_UnTrack(s);
    sequencer_clear(s);
    Py_CLEAR(s->journal_names);
    Py_CLEAR(s->journal_index);
    PyMem_Free(s->partials);
    PyMem_Free(s->slots);
    PyMem_Free(s->out);
    PyMem_Free(s->out_clock);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *
sequencer_queue_uncommitted(Sequencer *s, PyObject *env)
{
    int rc = seq_queue(s, env);
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}

static PyObject *
must_start_replay(Sequencer *s)
{
    Replay *r = &s->replay;
    PyObject *exc = PyObject_CallFunction(C.must_start_replay, "OLL",
                                          journal_name(s, r->journal), r->begin, r->end);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *
sequencer_deque_committed(Sequencer *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *env;
    switch (seq_next(s, &env)) {
    case 1:
        return env;
    case 0:
        Py_RETURN_NONE;
    case 2:
        return must_start_replay(s);
    default:
        return NULL;
    }
}

static PyObject *
sequencer_replay_range(Sequencer *s, PyObject *Py_UNUSED(ignored))
{
    if (!s->replay.active) {
        PyErr_SetString(PyExc_RuntimeError, "no replay is needed");
        return NULL;
    }
    return Py_BuildValue("(LL)", s->replay.begin, s->replay.end);
}

static PyObject *
sequencer_start_replay(Sequencer *s, PyObject *iterable)
{
    if (!s->replay.active) {
        PyErr_SetString(PyExc_RuntimeError, "no replay is needed");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(iterable);
    if (it == NULL) {
        return NULL;
    }
    Py_XSETREF(s->replay.it, it);
    Py_RETURN_NONE;
}

static PyObject *
sequencer_has_pending(Sequencer *s, PyObject *since)
{
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        Partial *p = &s->partials[k];
        if (p->begin == -1) {
            continue;
        }
        PyObject *name = journal_name(s, p->journal);
        PyObject *v;
        if (PyDict_CheckExact(since)) {
            v = PyDict_GetItemWithError(since, name);
            if (v == NULL && PyErr_Occurred()) {
                return NULL;
            }
            v = Py_NewRef(v ? v : C.int_zero);
        }
        else {
            v = PyObject_CallMethodObjArgs(since, C.str_get, name, C.int_zero, NULL);
            if (v == NULL) {
                return NULL;
            }
        }
        PyObject *b = PyLong_FromLongLong(p->begin);
        int ge = b ? PyObject_RichCompareBool(b, v, Py_GE) : -1;
        Py_XDECREF(b);
        Py_DECREF(v);
        if (ge != 0) {
            return ge < 0 ? NULL : Py_NewRef(Py_True);
        }
    }
    Py_RETURN_FALSE;
}

/* Forget producers whose last_ack is more than `horizon` older than the
 * newest of their journal, but `keep` (an index, or -1). */
static int
prune(Sequencer *s, PyObject *horizon, Py_ssize_t *keep)
{
    PyObject *units_obj = PyObject_CallOneArg(C.horizon_units, horizon);
    if (units_obj == NULL) {
        return -1;
    }
    if (units_obj == Py_None) {
        Py_DECREF(units_obj);
        return 0;
    }
    int overflow;
    long long u = PyLong_AsLongLongAndOverflow(units_obj, &overflow);
    Py_DECREF(units_obj);
    if (u == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow > 0) {
        return 0; /* older than anything: nothing is stale */
    }
    uint64_t units = (uint64_t)u;
    Py_ssize_t nj = PyList_GET_SIZE(s->journal_names);
    uint64_t *newest = PyMem_Calloc(nj ? nj : 1, sizeof(uint64_t));
    if (newest == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        Partial *p = &s->partials[k];
        if (p->last_ack > newest[p->journal]) {
            newest[p->journal] = p->last_ack;
        }
    }
    Py_ssize_t n = 0, removed = 0;
    for (Py_ssize_t k = 0; k < s->npartials; k++) {
        Partial *p = &s->partials[k];
        uint64_t top = newest[p->journal];
        int stale = k != *keep && units < top && p->last_ack < top - units;
        if (stale) {
            partial_free(p);
            removed++;
            if (s->inflight_p == k) {
                s->inflight_p = -2;
            }
            continue;
        }
        if (k == *keep) {
            *keep = n;
        }
        if (s->inflight_p == k) {
            s->inflight_p = n;
        }
        s->partials[n++] = *p;
    }
    PyMem_Free(newest);
    s->npartials = n;
    return removed ? reindex(s) : 0;
}

static PyObject *
state_of(Sequencer *s, Partial *p, uint64_t last_ack, long long begin)
{
    unsigned char b[6];
    for (int i = 0; i < 6; i++) {
        b[i] = (unsigned char)(p->producer >> (8 * (5 - i)));
    }
    return PyObject_CallFunction(C.producer_state, "Oy#KL", journal_name(s, p->journal), b,
                                 (Py_ssize_t)6, (unsigned long long)last_ack, begin);
}

static PyObject *
states_list(Sequencer *s, Py_ssize_t except)
{
    PyObject *out = PyList_New(0);
    for (Py_ssize_t k = 0; out != NULL && k < s->npartials; k++) {
        if (k == except) {
            continue;
        }
        Partial *p = &s->partials[k];
        PyObject *st = state_of(s, p, p->last_ack, p->begin);
        if (st == NULL || PyList_Append(out, st) < 0) {
            Py_XDECREF(st);
            Py_CLEAR(out);
        }
        Py_XDECREF(st);
    }
    return out;
}

static int
drained(Sequencer *s)
{
    return s->out_pos >= s->out_n && !s->replay.active;
}

static PyObject *
sequencer_producer_states(Sequencer *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"prune_horizon", NULL};
    PyObject *horizon = C.int_zero;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:producer_states", kwlist, &horizon)) {
        return NULL;
    }
    if (!drained(s)) {
        PyErr_SetString(PyExc_RuntimeError, "committed messages remain to dequeue");
        return NULL;
    }
    Py_ssize_t keep = -1;
    if (prune(s, horizon, &keep) < 0) {
        return NULL;
    }
    return states_list(s, -1);
}

static PyObject *
sequencer_checkpoint_states(Sequencer *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"prune_horizon", NULL};
    PyObject *horizon = C.int_zero;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:checkpoint_states", kwlist, &horizon)) {
        return NULL;
    }
    if (drained(s) || s->inflight_env == NULL) {
        Py_ssize_t keep = -1;
        if (prune(s, horizon, &keep) < 0) {
            return NULL;
        }
        PyObject *states = states_list(s, -1);
        return states ? Py_BuildValue("(NO)", states, Py_None) : NULL;
    }
    Py_ssize_t keep = s->inflight_p;
    if (prune(s, horizon, &keep) < 0) {
        return NULL;
    }
    PyObject *states = states_list(s, keep);
    if (states == NULL) {
        return NULL;
    }
    if (keep >= 0) {
        Partial *p = &s->partials[keep];
        uint64_t ack = p->last_ack; /* the committing envelope's clock */
        Replay *r = &s->replay;
        uint64_t last_ack;
        long long begin;
        if (r->active && !(ack > r->emitted)) {
            /* Replaying, and the span message with the ACK's clock is out:
             * nothing is left to emit, not even the ACK. */
            last_ack = ack;
            begin = -1;
        }
        else if (r->active && r->running < ack) {
            /* Replaying: the span up to r->begin is consumed, and
             * r->running is the largest clock seen in it. */
            last_ack = r->running;
            begin = r->begin;
        }
        else if (r->active) {
            /* Only the committing envelope is left: keep its clock above
             * last_ack so that it commits again. */
            last_ack = ack - 1;
            begin = -1;
        }
        else {
            /* The rest is out[out_pos:]: resume just before its first. */
            PyObject *nxt = s->out[s->out_pos];
            last_ack = s->out_clock[s->out_pos] - 1;
            if (nxt == s->inflight_env) {
                begin = -1;
            }
            else if (env_get_ll(nxt, C.d_begin, C.str_begin, &begin) < 0) {
                Py_DECREF(states);
                return NULL;
            }
        }
        PyObject *st = state_of(s, p, last_ack, begin);
        if (st == NULL || PyList_Append(states, st) < 0) {
            Py_XDECREF(st);
            Py_DECREF(states);
            return NULL;
        }
        Py_DECREF(st);
    }
    PyObject *env = s->inflight_env;
    PyObject *spec = env_get(env, C.d_journal, C.str_journal);
    PyObject *name = spec ? PyObject_GetAttr(spec, C.str_name) : NULL;
    PyObject *b = name ? env_get(env, C.d_begin, C.str_begin) : NULL;
    Py_XDECREF(spec);
    if (b == NULL) {
        Py_XDECREF(name);
        Py_DECREF(states);
        return NULL;
    }
    return Py_BuildValue("(N(NN))", states, name, b);
}

static PyObject *
sequencer_restore(Sequencer *s, PyObject *states)
{
    if (s->seq != 0 || s->out_n != 0 || s->replay.active) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot restore producer states into a Sequencer that has queued");
        return NULL;
    }
    if (load_states(s, states) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
sequencer_committed_by(Sequencer *s, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(s->inflight_env ? s->inflight_env : Py_None);
}

static PyObject *
sequencer_get_buffer(Sequencer *s, void *closure)
{
    return PyLong_FromSsize_t(s->size);
}

static PyMethodDef sequencer_methods[] = {
    {"queue_uncommitted", (PyCFunction)sequencer_queue_uncommitted, METH_O,
     "queue_uncommitted($self, env, /)\n--\n\n"
     "Apply the next read-uncommitted envelope: True if it completes a sequence (commits, "
     "or is a duplicate or a roll-back), False if it extends a transaction still pending."},
    {"deque_committed", (PyCFunction)sequencer_deque_committed, METH_NOARGS,
     "deque_committed($self, /)\n--\n\n"
     "The next committed envelope, or None; raises MustStartReplay when the rest of the "
     "sequence must be re-read first."},
    {"replay_range", (PyCFunction)sequencer_replay_range, METH_NOARGS,
     "replay_range($self, /)\n--\n\n[begin, end) offsets of the journal to replay."},
    {"start_replay", (PyCFunction)sequencer_start_replay, METH_O,
     "start_replay($self, it, /)\n--\n\nRead the envelopes of replay_range() from the given iterable (read-uncommitted)."},
    {"has_pending", (PyCFunction)sequencer_has_pending, METH_O,
     "has_pending($self, since, /)\n--\n\nTrue if a transaction still open began at or after the offset given for its journal "
     "(0 for a journal not in since)."},
    {"producer_states", (PyCFunction)(void (*)(void))sequencer_producer_states,
     METH_VARARGS | METH_KEYWORDS,
     "producer_states($self, prune_horizon=0)\n--\n\n"
     "A snapshot of every producer's state; with a prune horizon above 0, producers idle "
     "that long are first forgotten."},
    {"checkpoint_states", (PyCFunction)(void (*)(void))sequencer_checkpoint_states,
     METH_VARARGS | METH_KEYWORDS,
     "checkpoint_states($self, prune_horizon=0)\n--\n\n"
     "Producer states valid at any moment, and (journal, offset) where reading must resume "
     "when a committed sequence is partly dequeued (else None)."},
    {"restore", (PyCFunction)sequencer_restore, METH_O,
     "restore($self, states, /)\n--\n\n"
     "Replace the producer states of a Sequencer that has queued nothing."},
    {"committed_by", (PyCFunction)sequencer_committed_by, METH_NOARGS,
     "committed_by($self, /)\n--\n\n"
     "The envelope whose queueing committed the sequence being (or last) dequeued, or None."},
    {NULL},
};

static PyGetSetDef sequencer_getset[] = {
    {"buffer", (getter)sequencer_get_buffer, NULL, "The number of envelopes the ring holds.",
     NULL},
    {NULL},
};

static PyTypeObject SequencerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "message._native.Sequencer",
    .tp_doc = "Sequencer(states=(), buffer=4096)\n--\n\n"
              "Sequences read-uncommitted envelopes of one or more journals into "
              "deduplicated, committed ones (the native implementation of "
              "message/_sequencer.py).",
    .tp_basicsize = sizeof(Sequencer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = sequencer_new,
    .tp_init = (initproc)sequencer_init,
    .tp_dealloc = (destructor)sequencer_dealloc,
    .tp_traverse = (traverseproc)sequencer_traverse,
    .tp_clear = (inquiry)sequencer_clear,
    .tp_methods = sequencer_methods,
    .tp_getset = sequencer_getset,
};
/* -- EnvelopeReader ----------------------------------------------------- */

/* lines: bytes read from the source at once (the buffer grows for longer frames). */
#define LINE_CHUNK (1 << 20)

typedef struct {
    PyObject_HEAD
    PyObject *frames;       /* iterator of (begin, end, frame), or of batches; or, with
                             * lines, a source of bytes (its readinto) split here */
    int lines;              /* frames is a source of newline-terminated frames */
    PyObject *buf;          /* lines: a bytearray holding [bstart, blen) unread */
    Py_ssize_t bstart, blen, scanned; /* lines: scanned: no newline in [bstart, scanned) */
    int eof;                /* lines: the source is exhausted */
    iternextfunc frames_next;
    int batched;            /* frames yields (begin, [frame, ...]): contiguous frames */
    PyObject *batch;        /* batched: the list of frames being read, or NULL */
    Py_ssize_t batch_pos;   /* batched: the index of the next frame in it */
    long long pos;          /* batched: the position of that frame */
    PyObject *spec;
    PyObject *new_message;  /* new_message(spec) -> message */
    PyObject *decode;       /* decode(frame, message) */
    PyObject *jumps;        /* sized: non-empty when offsets may jump */
    PyObject *rebase;       /* rebase(begin) -> base, taking the jumps up to begin */
    PyObject *corrupt;      /* corrupt(exc, offset): raises, or returns to skip */
    PyObject *error_type;   /* exceptions of decode that corrupt() handles */
    PyObject *loads;        /* JSON: orjson.loads, or NULL */
    PyObject *plain_types;  /* JSON: set of types decoded as loads + dict merge */
    PyTypeObject *plain_seen; /* last type found in plain_types (the set only grows) */
    PyObject *last;         /* the last envelope returned, or NULL */
    PyObject *on_end;       /* on_end(): called once, at the end, an error or close() */
    PyObject *truncated_type; /* the frames' error when input ends inside a frame */
    PyObject *truncated;    /* truncated(exc): raises, or returns to end quietly */
    long long base;         /* journal offset of position 0 of the frames */
    PyObject *last_msg;     /* the message and begin of `last` (borrowed: it holds them) */
    long long last_begin;
    int done;
} Reader;

static PyTypeObject ReaderType;

static int
reader_traverse(Reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->frames);
    Py_VISIT(r->buf);
    Py_VISIT(r->batch);
    Py_VISIT(r->spec);
    Py_VISIT(r->new_message);
    Py_VISIT(r->decode);
    Py_VISIT(r->jumps);
    Py_VISIT(r->rebase);
    Py_VISIT(r->corrupt);
    Py_VISIT(r->error_type);
    Py_VISIT(r->loads);
    Py_VISIT(r->plain_types);
    Py_VISIT(r->plain_seen);
    Py_VISIT(r->last);
    Py_VISIT(r->on_end);
    Py_VISIT(r->truncated_type);
    Py_VISIT(r->truncated);
    return 0;
}

static int
reader_clear(Reader *r)
{
    Py_CLEAR(r->frames);
    Py_CLEAR(r->buf);
    Py_CLEAR(r->batch);
    r->frames_next = NULL;
    Py_CLEAR(r->spec);
    Py_CLEAR(r->new_message);
    Py_CLEAR(r->decode);
    Py_CLEAR(r->jumps);
    Py_CLEAR(r->rebase);
    Py_CLEAR(r->corrupt);
    Py_CLEAR(r->error_type);
    Py_CLEAR(r->loads);
    Py_CLEAR(r->plain_types);
    Py_CLEAR(r->plain_seen);
    Py_CLEAR(r->last);
    Py_CLEAR(r->on_end);
    Py_CLEAR(r->truncated_type);
    Py_CLEAR(r->truncated);
    return 0;
}

static void
reader_dealloc(Reader *r)
{
    PyObject_GC_UnTrack(r);
    reader_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
reader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"frames", "spec", "new_message", "decode", "jumps", "rebase",
                             "corrupt", "error_type", "base", "on_end", "truncated_type",
                             "truncated", "loads", "plain_types", "batched", "lines", NULL};
    PyObject *frames, *spec, *new_message, *decode, *jumps, *rebase, *corrupt, *error_type;
    PyObject *on_end, *truncated_type, *truncated;
    PyObject *loads = Py_None, *plain_types = Py_None;
    long long base;
    int batched = 0, lines = 0;
    if (check_ready() < 0) {
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOLOOO|OOpp:EnvelopeReader", kwlist,
                                     &frames, &spec, &new_message, &decode, &jumps, &rebase,
                                     &corrupt, &error_type, &base, &on_end, &truncated_type,
                                     &truncated, &loads, &plain_types, &batched, &lines)) {
        return NULL;
    }
    if (!lines && !PyIter_Check(frames)) {
        PyErr_SetString(PyExc_TypeError, "frames must be an iterator");
        return NULL;
    }
    if (!PyType_Check(error_type)
        || !PyType_IsSubtype((PyTypeObject *)error_type, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "error_type must be an exception class");
        return NULL;
    }
    if ((loads == Py_None) != (plain_types == Py_None)
        || (plain_types != Py_None && !PyAnySet_Check(plain_types))) {
        PyErr_SetString(PyExc_TypeError, "loads and plain_types (a set) go together");
        return NULL;
    }
    Reader *r = (Reader *)type->tp_alloc(type, 0);
    if (r == NULL) {
        return NULL;
    }
    r->frames = Py_NewRef(frames);
    r->frames_next = Py_TYPE(frames)->tp_iternext;
    r->batched = batched;
    r->lines = lines;
    if (lines && (r->buf = PyByteArray_FromStringAndSize(NULL, LINE_CHUNK)) == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    r->spec = Py_NewRef(spec);
    r->new_message = Py_NewRef(new_message);
    r->decode = Py_NewRef(decode);
    r->jumps = Py_NewRef(jumps);
    r->rebase = Py_NewRef(rebase);
    r->corrupt = Py_NewRef(corrupt);
    r->error_type = Py_NewRef(error_type);
    r->on_end = Py_NewRef(on_end);
    r->truncated_type = Py_NewRef(truncated_type);
    r->truncated = Py_NewRef(truncated);
    if (loads != Py_None) {
        r->loads = Py_NewRef(loads);
        r->plain_types = Py_NewRef(plain_types);
    }
    r->base = base;
    return (PyObject *)r;
}

/* Decode `frame` into `msg` as the framing's unmarshal_frame does. */
static int
reader_decode(Reader *r, PyObject *frame, PyObject *msg)
{
    PyTypeObject *t = Py_TYPE(msg);
    if (r->loads != NULL && PyDict_Check(msg)) {
        int plain = t == r->plain_seen;
        if (!plain) {
            plain = PySet_Contains(r->plain_types, (PyObject *)t);
            if (plain < 0) {
                return -1;
            }
            if (plain) {
                Py_XSETREF(r->plain_seen, (PyTypeObject *)Py_NewRef(t));
            }
        }
        if (plain) {
            PyObject *doc = PyObject_Vectorcall(r->loads, &frame, 1, NULL);
            if (doc != NULL && PyDict_CheckExact(doc)) {
                if (PyDict_GET_SIZE(msg) != 0) {
                    PyDict_Clear(msg);
                }
                int rc = PyDict_Update(msg, doc);
                Py_DECREF(doc);
                return rc;
            }
            /* Not a JSON object: unmarshal_frame raises the framing's error. */
            Py_XDECREF(doc);
            PyErr_Clear();
        }
    }
    PyObject *call_args[2] = {frame, msg};
    PyObject *res = PyObject_Vectorcall(r->decode, call_args, 2, NULL);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    return 0;
}

/* Hand the exception being raised to `handler(exc[, arg])`, which raises
 * (its exception is then the one set) or returns to let it go. Returns 0
 * if it was let go, -1 with an exception set. */
static int
hand_exception(PyObject *handler, PyObject *arg)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *call_args[2] = {value, arg};
    PyObject *res = PyObject_Vectorcall(handler, call_args, arg ? 2 : 1, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    return 0;
}

/* A frame whose decoding failed: corrupt(exc, offset) raises or skips it.
 * Returns 0 to skip, -1 with an exception set. */
static int
reader_corrupt(Reader *r, long long offset)
{
    PyObject *off = PyLong_FromLongLong(offset);
    if (off == NULL) {
        return -1;
    }
    int rc = hand_exception(r->corrupt, off);
    Py_DECREF(off);
    return rc;
}

/* Ends the iteration: once, call on_end(), keeping any exception being
 * raised (an exception of on_end itself is chained to it). */
static void
finish(PyObject **on_end, int *done)
{
    if (*done) {
        return;
    }
    *done = 1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *res = *on_end ? PyObject_CallNoArgs(*on_end) : Py_NewRef(Py_None);
    if (res == NULL) {
        if (type != NULL) {
            /* As in a finally clause: the new exception, with the old as context. */
            PyObject *type2, *value2, *tb2;
            PyErr_Fetch(&type2, &value2, &tb2);
            PyErr_NormalizeException(&type2, &value2, &tb2);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL) {
                PyException_SetTraceback(value, tb);
            }
            PyException_SetContext(value2, value); /* steals value */
            Py_XDECREF(type);
            Py_XDECREF(tb);
            PyErr_Restore(type2, value2, tb2);
        }
        return;
    }
    Py_DECREF(res);
    PyErr_Restore(type, value, tb);
}

/* The frames iterator ended (NULL from it): a truncated tail goes to
 * truncated(), which raises or lets it go; StopIteration is the end. */
static void
frames_ended(Reader *r)
{
    if (!PyErr_Occurred()) {
        return;
    }
    if (PyErr_ExceptionMatches(r->truncated_type)) {
        hand_exception(r->truncated, NULL);
    }
    else if (PyErr_ExceptionMatches(PyExc_StopIteration)) {
        PyErr_Clear();
    }
}

/* Read more of the source into buf after [bstart, blen): 1 if some came,
 * 0 at its end, -1 on error. */
static int
read_more(Reader *r)
{
    Py_ssize_t cap = PyByteArray_GET_SIZE(r->buf);
    char *data = PyByteArray_AS_STRING(r->buf);
    if (r->bstart > 0) {
        /* Move the unread part to the front: the buffer is reused. */
        memmove(data, data + r->bstart, r->blen - r->bstart);
        r->blen -= r->bstart;
        r->scanned -= r->bstart;
        r->bstart = 0;
    }
    if (r->blen == cap) {
        /* A frame longer than the buffer: grow it. */
        if (PyByteArray_Resize(r->buf, cap * 2) < 0) {
            return -1;
        }
        cap *= 2;
        data = PyByteArray_AS_STRING(r->buf);
    }
    PyObject *view = PyMemoryView_FromMemory(data + r->blen, cap - r->blen, PyBUF_WRITE);
    if (view == NULL) {
        return -1;
    }
    PyObject *n = PyObject_CallMethod(r->frames, "readinto", "O", view);
    /* The source must not keep the buffer: releasing the view makes sure
     * (and raises if it holds an export). */
    PyObject *exc = n == NULL ? fetch_exception() : NULL;
    PyObject *released = PyObject_CallMethod(view, "release", NULL);
    Py_DECREF(view);
    if (exc != NULL) {
        Py_XDECREF(released);
        PyErr_Restore(Py_NewRef(Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
        return -1;
    }
    if (released == NULL) {
        Py_DECREF(n);
        return -1;
    }
    Py_DECREF(released);
    Py_ssize_t got = n == Py_None ? 0 : PyLong_AsSsize_t(n);
    Py_DECREF(n);
    if (got < 0 || got > cap - r->blen) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "readinto returned a bad count");
        }
        return -1;
    }
    r->blen += got;
    return got > 0;
}

/* lines: the next line of the source, through its newline. */
static PyObject *
next_line(Reader *r, long long *begin, long long *end)
{
    for (;;) {
        char *data = PyByteArray_AS_STRING(r->buf);
        char *nl = r->scanned < r->blen
                       ? memchr(data + r->scanned, '\n', r->blen - r->scanned) : NULL;
        if (nl != NULL) {
            Py_ssize_t n = nl + 1 - (data + r->bstart);
            PyObject *line = PyBytes_FromStringAndSize(data + r->bstart, n);
            if (line == NULL) {
                return NULL;
            }
            *begin = r->pos;
            *end = r->pos = r->pos + n;
            r->bstart = r->scanned = nl + 1 - data;
            return line;
        }
        r->scanned = r->blen;
        int rc = r->eof ? 0 : read_more(r);
        if (rc < 0) {
            return NULL;
        }
        if (rc == 0) {
            r->eof = 1;
            if (r->blen > r->bstart) {
                /* Input ended inside a frame: as line_batches raises it. */
                PyObject *kw = Py_BuildValue("{sy#sL}", "data", data + r->bstart,
                                             r->blen - r->bstart, "offset", r->pos);
                PyObject *args = kw ? PyTuple_New(0) : NULL;
                PyObject *exc = args ? PyObject_Call(r->truncated_type, args, kw) : NULL;
                Py_XDECREF(kw);
                Py_XDECREF(args);
                r->bstart = r->blen;
                if (exc != NULL) {
                    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                    Py_DECREF(exc);
                    hand_exception(r->truncated, NULL);
                }
            }
            return NULL;
        }
    }
}

/* The next frame (a new reference) and its [begin, end) in the stream;
 * NULL at the end or on error. */
static PyObject *
next_frame(Reader *r, long long *begin, long long *end)
{
    if (r->lines) {
        return next_line(r, begin, end);
    }
    if (r->batched) {
        while (r->batch == NULL || r->batch_pos >= PyList_GET_SIZE(r->batch)) {
            Py_CLEAR(r->batch);
            PyObject *b = r->frames_next(r->frames);
            if (b == NULL) {
                frames_ended(r);
                return NULL;
            }
            long long first;
            if (!PyTuple_CheckExact(b) || PyTuple_GET_SIZE(b) != 2
                || !PyList_CheckExact(PyTuple_GET_ITEM(b, 1))
                || ((first = PyLong_AsLongLong(PyTuple_GET_ITEM(b, 0))) == -1
                    && PyErr_Occurred())) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError,
                                    "frame batches must be (begin, list of frames) tuples");
                }
                Py_DECREF(b);
                return NULL;
            }
            r->batch = Py_NewRef(PyTuple_GET_ITEM(b, 1));
            r->batch_pos = 0;
            r->pos = first;
            Py_DECREF(b);
        }
        PyObject *frame = Py_NewRef(PyList_GET_ITEM(r->batch, r->batch_pos));
        r->batch_pos++;
        Py_ssize_t n = PyBytes_CheckExact(frame) ? PyBytes_GET_SIZE(frame) : PyObject_Length(frame);
        if (n < 0) {
            Py_DECREF(frame);
            return NULL;
        }
        *begin = r->pos;
        *end = r->pos = r->pos + n;
        return frame;
    }
    PyObject *item = r->frames_next(r->frames);
    if (item == NULL) {
        frames_ended(r);
        return NULL;
    }
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 3) {
        PyErr_SetString(PyExc_TypeError, "frames must yield (begin, end, frame) tuples");
        Py_DECREF(item);
        return NULL;
    }
    *begin = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0));
    *end = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
    if ((*begin == -1 || *end == -1) && PyErr_Occurred()) {
        Py_DECREF(item);
        return NULL;
    }
    PyObject *frame = Py_NewRef(PyTuple_GET_ITEM(item, 2));
    Py_DECREF(item);
    return frame;
}

static PyObject *
reader_step(Reader *r)
{
    for (;;) {
        long long begin, end;
        PyObject *frame = next_frame(r, &begin, &end);
        if (frame == NULL) {
            return NULL;
        }
        Py_ssize_t njumps = PyObject_Length(r->jumps);
        if (njumps < 0) {
            Py_DECREF(frame);
            return NULL;
        }
        if (njumps > 0) {
            /* Retention removed what came next: offsets continue further on. */
            PyObject *res = PyObject_CallFunction(r->rebase, "L", begin);
            long long base = res ? PyLong_AsLongLong(res) : -1;
            Py_XDECREF(res);
            if (base == -1 && PyErr_Occurred()) {
                Py_DECREF(frame);
                return NULL;
            }
            r->base = base;
        }
        PyObject *msg = PyObject_Vectorcall(r->new_message, &r->spec, 1, NULL);
        if (msg == NULL) {
            Py_DECREF(frame);
            return NULL;
        }
        if (reader_decode(r, frame, msg) < 0) {
            Py_DECREF(msg);
            Py_DECREF(frame);
            if (PyErr_ExceptionMatches(r->error_type)
                && reader_corrupt(r, r->base + begin) == 0) {
                continue;
            }
            return NULL;
        }
        Py_DECREF(frame);
        PyObject *env = new_envelope(r->spec, r->base + begin, r->base + end, msg);
        Py_DECREF(msg);
        if (env == NULL) {
            return NULL;
        }
        r->last_msg = msg;
        r->last_begin = r->base + begin;
        Py_XSETREF(r->last, Py_NewRef(env));
        return env;
    }
}

static PyObject *
reader_next(Reader *r)
{
    if (r->done) {
        return NULL;
    }
    PyObject *env = reader_step(r);
    if (env == NULL) {
        finish(&r->on_end, &r->done);
    }
    return env;
}

static PyObject *
reader_close(Reader *r, PyObject *Py_UNUSED(ignored))
{
    finish(&r->on_end, &r->done);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef reader_methods[] = {
    {"close", (PyCFunction)reader_close, METH_NOARGS,
     "End the iteration (calls on_end() if it has not been called)."},
    {NULL},
};

static PyObject *
reader_get_last(Reader *r, void *closure)
{
    return Py_NewRef(r->last ? r->last : Py_None);
}

static PyGetSetDef reader_getset[] = {
    {"last", (getter)reader_get_last, NULL, "the last envelope returned, or None", NULL},
    {NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "message._native.EnvelopeReader",
    .tp_doc = "Envelopes of (begin, end, frame) tuples.",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = reader_new,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)reader_next,
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
};

/* -- CommittedReader ---------------------------------------------------- */
/*
 * The loop of a ReadCommittedIter: each envelope of an EnvelopeReader is
 * queued into a Sequencer, and what it commits is handed out; when the
 * Sequencer needs a replay, replay(begin, end) gives an iterator of that
 * range (a ReadUncommittedIter), as ReadCommittedIter._sequence does.
 */

typedef struct {
    PyObject_HEAD
    Reader *reader;
    Sequencer *seq;
    PyObject *replay; /* replay(begin, end) -> iterator of that range */
    int done;
} Committed;

static int
committed_traverse(Committed *c, visitproc visit, void *arg)
{
    Py_VISIT(c->reader);
    Py_VISIT(c->seq);
    Py_VISIT(c->replay);
    return 0;
}

static int
committed_clear(Committed *c)
{
    Py_CLEAR(c->reader);
    Py_CLEAR(c->seq);
    Py_CLEAR(c->replay);
    return 0;
}

static void
committed_dealloc(Committed *c)
{
    PyObject_GC_UnTrack(c);
    committed_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *
committed_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"reader", "sequencer", "replay", NULL};
    PyObject *reader, *seq, *replay;
    if (check_ready() < 0) {
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O:CommittedReader", kwlist, &ReaderType,
                                     &reader, &SequencerType, &seq, &replay)) {
        return NULL;
    }
    Committed *c = (Committed *)type->tp_alloc(type, 0);
    if (c == NULL) {
        return NULL;
    }
    c->reader = (Reader *)Py_NewRef(reader);
    c->seq = (Sequencer *)Py_NewRef(seq);
    c->replay = Py_NewRef(replay);
    return (PyObject *)c;
}

/* Ends the iteration: the reader is closed (on_end called once). */
static void
committed_finish(Committed *c)
{
    if (c->done) {
        return;
    }
    c->done = 1;
    Reader *r = c->reader;
    finish(&r->on_end, &r->done);
}

static PyObject *
committed_next(Committed *c)
{
    Sequencer *s = c->seq;
    for (;;) {
        PyObject *env;
        int rc = seq_next(s, &env);
        if (rc == 1) {
            return env;
        }
        if (rc == 2) {
            PyObject *it = PyObject_CallFunction(c->replay, "LL", s->replay.begin,
                                                 s->replay.end);
            PyObject *iter = it ? PyObject_GetIter(it) : NULL;
            Py_XDECREF(it);
            if (iter == NULL) {
                committed_finish(c);
                return NULL;
            }
            Py_XSETREF(s->replay.it, iter);
            continue;
        }
        if (rc < 0 || c->done) {
            committed_finish(c);
            return NULL;
        }
        env = reader_next(c->reader);
        if (env == NULL) {
            committed_finish(c);
            return NULL;
        }
        /* Its parts as the reader made them: no attribute read back. */
        rc = seq_queue_parts(s, env, c->reader->last_msg, c->reader->spec,
                             c->reader->last_begin);
        Py_DECREF(env);
        if (rc < 0) {
            committed_finish(c);
            return NULL;
        }
    }
}

static PyObject *
committed_close(Committed *c, PyObject *Py_UNUSED(ignored))
{
    committed_finish(c);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef committed_methods[] = {
    {"close", (PyCFunction)committed_close, METH_NOARGS,
     "End the iteration and close the EnvelopeReader."},
    {NULL},
};

static PyTypeObject CommittedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "message._native.CommittedReader",
    .tp_doc = "Committed envelopes of an EnvelopeReader, sequenced by a Sequencer.",
    .tp_basicsize = sizeof(Committed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = committed_new,
    .tp_dealloc = (destructor)committed_dealloc,
    .tp_traverse = (traverseproc)committed_traverse,
    .tp_clear = (inquiry)committed_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)committed_next,
    .tp_methods = committed_methods,
};

/* -- parse_uuids --------------------------------------------------------- */

/* parse_uuids(data, offsets, hi, lo) -> list of rows not parsed
 *
 * The strings of an Arrow string array (its data buffer, and its n + 1
 * int32 offsets) in the canonical UUID form, as 64-bit halves into the
 * uint64 buffers hi and lo (n items each). Rows whose string is not
 * canonical (or empty: a null) are listed, and left for the caller. */
static PyObject *
parse_uuids(PyObject *module, PyObject *args)
{
    Py_buffer data, offsets, hi, lo;
    if (!PyArg_ParseTuple(args, "y*y*w*w*:parse_uuids", &data, &offsets, &hi, &lo)) {
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = hi.len / (Py_ssize_t)sizeof(uint64_t);
    if (lo.len != hi.len || offsets.len != (n + 1) * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "parse_uuids: buffer sizes do not match");
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL) {
        goto done;
    }
    const int32_t *off = (const int32_t *)offsets.buf;
    const unsigned char *chars = (const unsigned char *)data.buf;
    uint64_t *h = (uint64_t *)hi.buf, *l = (uint64_t *)lo.buf;
    static const unsigned char pos[32] = {
        0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17,
        19, 20, 21, 22, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35};
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = off[i], e = off[i + 1];
        int ok = e - b == 36 && b >= 0 && e <= data.len;
        if (ok) {
            const unsigned char *p = chars + b;
            ok = p[8] == '-' && p[13] == '-' && p[18] == '-' && p[23] == '-';
            uint64_t vh = 0, vl = 0;
            int bad = 0;
            for (int k = 0; ok && k < 16; k++) {
                int v = HEX[p[pos[k]]];
                bad |= v;
                vh = (vh << 4) | (uint64_t)(v & 0xF);
            }
            for (int k = 16; ok && k < 32; k++) {
                int v = HEX[p[pos[k]]];
                bad |= v;
                vl = (vl << 4) | (uint64_t)(v & 0xF);
            }
            ok = ok && bad >= 0;
            if (ok) {
                h[i] = vh;
                l[i] = vl;
            }
        }
        if (!ok) {
            h[i] = l[i] = 0;
            PyObject *row = PyLong_FromSsize_t(i);
            if (row == NULL || PyList_Append(out, row) < 0) {
                Py_XDECREF(row);
                Py_CLEAR(out);
                goto done;
            }
            Py_DECREF(row);
        }
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return out;
}

/* format_uuids(hi, lo) -> (uuids, producers)
 *
 * For n UUIDs given as uint64 halves: their canonical strings, 36 bytes
 * each, and their ProducerIDs (the low 48 bits) as 12 hex digits each,
 * concatenated. */
static PyObject *
format_uuids(PyObject *module, PyObject *args)
{
    Py_buffer hi, lo;
    if (!PyArg_ParseTuple(args, "y*y*:format_uuids", &hi, &lo)) {
        return NULL;
    }
    PyObject *uuids = NULL, *producers = NULL, *out = NULL;
    Py_ssize_t n = hi.len / (Py_ssize_t)sizeof(uint64_t);
    if (lo.len != hi.len) {
        PyErr_SetString(PyExc_ValueError, "format_uuids: buffer sizes do not match");
        goto done;
    }
    uuids = PyBytes_FromStringAndSize(NULL, n * 36);
    producers = uuids ? PyBytes_FromStringAndSize(NULL, n * 12) : NULL;
    if (producers == NULL) {
        goto done;
    }
    static const char digits[] = "0123456789abcdef";
    const uint64_t *h = (const uint64_t *)hi.buf, *l = (const uint64_t *)lo.buf;
    char *u = PyBytes_AS_STRING(uuids), *p = PyBytes_AS_STRING(producers);
    for (Py_ssize_t i = 0; i < n; i++, u += 36, p += 12) {
        uint64_t vh = h[i], vl = l[i];
        int k = 0;
        for (int d = 0; d < 32; d++) {
            if (d == 8 || d == 12 || d == 16 || d == 20) {
                u[k++] = '-';
            }
            uint64_t v = d < 16 ? vh >> (60 - 4 * d) : vl >> (60 - 4 * (d - 16));
            u[k++] = digits[v & 0xF];
        }
        memcpy(p, u + 24, 12);
    }
    out = PyTuple_Pack(2, uuids, producers);
done:
    Py_XDECREF(uuids);
    Py_XDECREF(producers);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return out;
}


/* -- Publisher ----------------------------------------------------------- */
/*
 * message/_publisher.py's Publisher, step for step: validate, map, then
 * under the Publisher's lock tick the clock, stamp the UUID, frame and
 * append; and the ACK (or roll-back) intents of its transactions. It keeps
 * its own state: the clock (when it owns it), the framings it has used,
 * and per journal its last commit and open transaction.
 */

/* Nanoseconds since the Unix epoch, as time.time_ns() gives them. */
static inline uint64_t
now_ns(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    if (PyTime_Time(&t) < 0) {
        PyErr_Clear();
        return 0;
    }
    return (uint64_t)t;
#else
    return (uint64_t)_PyTime_GetSystemClock();
#endif
}

typedef struct {
    int ready;
    PyTypeObject *uuid_type;
    PyObject *d_int, *d_is_safe, *safe_unknown; /* uuid.UUID's fields, SafeUUID.unknown */
    PyObject *clock_type, *new_producer_id, *framing_by_content_type, *ack_intent;
    PyObject *json_document, *json_set_uuid; /* JsonDocument and its own set_uuid */
    PyObject *dict_get, *dict_setitem;       /* dict.get, dict.__setitem__ */
    PyObject *str_validate, *str_set_uuid, *str_marshal, *str_append, *str_tick,
        *str_update, *str_get_, *str_content_type, *str_new_ack, *str_setitem, *str_plain_dumps;
} PubConfig;

static PubConfig P;

static PyObject *
configure_publisher(PyObject *module, PyObject *args)
{
    PyTypeObject *uuid_type;
    PyObject *safe, *clock, *npi, *fbct, *ack, *jd;
    if (!PyArg_ParseTuple(args, "O!OOOOOO:configure_publisher", &PyType_Type, &uuid_type, &safe,
                          &clock, &npi, &fbct, &ack, &jd)) {
        return NULL;
    }
    if (P.ready) {
        PyErr_SetString(PyExc_RuntimeError, "the publisher is configured already");
        return NULL;
    }
    PubConfig p = {0};
    p.d_int = member_descriptor(uuid_type, "int");
    p.d_is_safe = p.d_int ? member_descriptor(uuid_type, "is_safe") : NULL;
    if (p.d_is_safe == NULL) {
        return NULL;
    }
#define INTERN(field, text) \
    if ((p.field = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(str_validate, "validate");
    INTERN(str_set_uuid, "set_uuid");
    INTERN(str_marshal, "marshal");
    INTERN(str_append, "append");
    INTERN(str_tick, "tick");
    INTERN(str_update, "update");
    INTERN(str_get_, "get");
    INTERN(str_content_type, "content_type");
    INTERN(str_new_ack, "new_acknowledgement");
    INTERN(str_setitem, "__setitem__");
    INTERN(str_plain_dumps, "plain_dumps");
#undef INTERN
    p.json_set_uuid = PyObject_GetAttr(jd, p.str_set_uuid);
    p.dict_get = PyObject_GetAttr((PyObject *)&PyDict_Type, p.str_get_);
    p.dict_setitem = PyObject_GetAttr((PyObject *)&PyDict_Type, p.str_setitem);
    if (p.json_set_uuid == NULL || p.dict_get == NULL || p.dict_setitem == NULL) {
        return NULL;
    }
    p.uuid_type = (PyTypeObject *)Py_NewRef(uuid_type);
    p.safe_unknown = Py_NewRef(safe);
    p.clock_type = Py_NewRef(clock);
    p.new_producer_id = Py_NewRef(npi);
    p.framing_by_content_type = Py_NewRef(fbct);
    p.ack_intent = Py_NewRef(ack);
    p.json_document = Py_NewRef(jd);
    p.ready = 1;
    P = p; /* once per process */
    Py_RETURN_NONE;
}

/* A uuid.UUID of the 128-bit value (hi, lo), made as the Python Publisher
 * makes it: without UUID.__init__'s validation, the value being in range. */
static PyObject *
new_uuid(uint64_t hi, uint64_t lo)
{
    unsigned char b[16];
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(hi >> (56 - 8 * i));
        b[8 + i] = (unsigned char)(lo >> (56 - 8 * i));
    }
    PyObject *v = _PyLong_FromByteArray(b, 16, 0, 0);
    PyObject *u = v ? P.uuid_type->tp_alloc(P.uuid_type, 0) : NULL;
    if (u == NULL) {
        Py_XDECREF(v);
        return NULL;
    }
    descrsetfunc set = Py_TYPE(P.d_int)->tp_descr_set;
    int rc = set(P.d_int, u, v) | set(P.d_is_safe, u, P.safe_unknown);
    Py_DECREF(v);
    if (rc != 0) {
        Py_DECREF(u);
        return NULL;
    }
    /* It holds an int and an enum member: it can be in no reference cycle,
     * so the cyclic garbage collector need not go over it. */
    if (PyObject_GC_IsTracked(u)) {
        PyObject_GC_UnTrack(u);
    }
    return u;
}

/* The UUID halves of (producer, clock, flags): layout.uuid_int. */
static inline void
uuid_halves(uint64_t node, uint64_t clock, unsigned flags, uint64_t *hi, uint64_t *lo)
{
    *hi = (((clock >> 4) & 0xFFFFFFFFULL) << 32) | (((clock >> 36) & 0xFFFF) << 16)
          | (((clock >> 52) & 0x0FFF) | 0x1000);
    *lo = ((clock & 0xF) << COUNTER_SHIFT) | ((uint64_t)(0x8000 | flags) << FLAGS_SHIFT) | node;
}

typedef struct {
    PyObject_HEAD
    PyObject *client;
    PyObject *clock_obj;  /* the caller's Clock, or NULL: the Publisher's own, below */
    uint64_t clock;
    uint64_t node;        /* the ProducerID, as an int */
    PyObject *producer;   /* the ProducerID, bytes */
    PyThread_type_lock lock;
    PyObject *framings;   /* content type -> framing */
    PyObject *pending;    /* journal -> a message of its open transaction, in order */
    PyObject *last_commit; /* journal -> clock of this producer's last commit there */
    PyObject *txn_base;   /* journal -> the clock a roll-back of its transaction carries */
    PyTypeObject *doc_type; /* the last message type found to be a plain JsonDocument */
} Publisher;

static PyTypeObject PublisherType;

/* Take the Publisher's lock without holding the GIL while waiting (the
 * holder may need the GIL to finish). */
static void
pub_lock(Publisher *p)
{
    if (!PyThread_acquire_lock(p->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(p->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *
publisher_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"client", "clock", NULL};
    PyObject *client, *clock = Py_None;
    if (!P.ready) {
        PyErr_SetString(PyExc_RuntimeError, "the native publisher is not configured");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:Publisher", kwlist, &client, &clock)) {
        return NULL;
    }
    Publisher *p = (Publisher *)type->tp_alloc(type, 0);
    if (p == NULL) {
        return NULL;
    }
    p->client = Py_NewRef(client);
    p->lock = PyThread_allocate_lock();
    p->framings = PyDict_New();
    p->pending = PyDict_New();
    p->last_commit = PyDict_New();
    p->txn_base = PyDict_New();
    p->producer = PyObject_CallNoArgs(P.new_producer_id);
    if (p->lock == NULL || p->framings == NULL || p->pending == NULL || p->last_commit == NULL
        || p->txn_base == NULL || p->producer == NULL) {
        Py_DECREF(p);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    if (!PyBytes_Check(p->producer) || PyBytes_GET_SIZE(p->producer) != 6) {
        PyErr_SetString(PyExc_ValueError, "new_producer_id() must give 6 bytes");
        Py_DECREF(p);
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(p->producer);
    for (int i = 0; i < 6; i++) {
        p->node = (p->node << 8) | b[i];
    }
    if (clock != Py_None) {
        p->clock_obj = Py_NewRef(clock);
    }
    else {
        /* Our own clock, moved to the wall clock on each publish. */
        p->clock = ((uint64_t)(now_ns() / 100) + UUID_EPOCH_OFFSET) << 4;
    }
    return (PyObject *)p;
}

static int
publisher_traverse(Publisher *p, visitproc visit, void *arg)
{
    Py_VISIT(p->client);
    Py_VISIT(p->clock_obj);
    Py_VISIT(p->framings);
    Py_VISIT(p->pending);
    Py_VISIT(p->last_commit);
    Py_VISIT(p->txn_base);
    Py_VISIT(p->doc_type);
    return 0;
}

static int
publisher_clear(Publisher *p)
{
    Py_CLEAR(p->client);
    Py_CLEAR(p->clock_obj);
    Py_CLEAR(p->framings);
    Py_CLEAR(p->pending);
    Py_CLEAR(p->last_commit);
    Py_CLEAR(p->txn_base);
    Py_CLEAR(p->doc_type);
    return 0;
}

static void
publisher_dealloc(Publisher *p)
{
    PyObject_GC_UnTrack(p);
    publisher_clear(p);
    Py_CLEAR(p->producer);
    if (p->lock != NULL) {
        PyThread_free_lock(p->lock);
    }
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* The framing of a content type (cached), as (framing, dumps, types): with
 * the framing's plain_dumps() if it has one, else (framing, None, None).
 * A borrowed reference. */
static PyObject *
framing_of(Publisher *p, PyObject *content_type)
{
    PyObject *entry = PyDict_GetItemWithError(p->framings, content_type);
    if (entry != NULL || PyErr_Occurred()) {
        return entry;
    }
    PyObject *f = PyObject_CallOneArg(P.framing_by_content_type, content_type);
    if (f == NULL) {
        return NULL;
    }
    PyObject *plain = NULL;
    if (_PyObject_LookupAttr(f, P.str_plain_dumps, &plain) < 0) {
        Py_DECREF(f);
        return NULL;
    }
    PyObject *pair = plain ? PyObject_CallNoArgs(plain) : Py_BuildValue("(OO)", Py_None, Py_None);
    Py_XDECREF(plain);
    if (pair == NULL || !PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
        || (PyTuple_GET_ITEM(pair, 1) != Py_None && !PyAnySet_Check(PyTuple_GET_ITEM(pair, 1)))) {
        if (pair != NULL) {
            PyErr_SetString(PyExc_TypeError, "plain_dumps() must give (dumps, set of types)");
        }
        Py_XDECREF(pair);
        Py_DECREF(f);
        return NULL;
    }
    entry = PyTuple_Pack(3, f, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
    Py_DECREF(pair);
    Py_DECREF(f);
    if (entry == NULL || PyDict_SetItem(p->framings, content_type, entry) < 0) {
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(entry);
    return entry;
}

/* The frame of msg: framing.marshal(msg), or, for a message its framing
 * encodes plainly, dumps(msg) and a newline. */
static PyObject *
marshal(PyObject *entry, PyObject *msg)
{
    PyObject *framing = PyTuple_GET_ITEM(entry, 0);
    PyObject *dumps = PyTuple_GET_ITEM(entry, 1), *types = PyTuple_GET_ITEM(entry, 2);
    if (types != Py_None) {
        int plain = PySet_Contains(types, (PyObject *)Py_TYPE(msg));
        if (plain < 0) {
            return NULL;
        }
        PyObject *doc = plain ? PyObject_CallOneArg(dumps, msg) : NULL;
        if (doc != NULL && PyBytes_CheckExact(doc)) {
            Py_ssize_t n = PyBytes_GET_SIZE(doc);
            PyObject *frame = PyBytes_FromStringAndSize(NULL, n + 1);
            if (frame != NULL) {
                memcpy(PyBytes_AS_STRING(frame), PyBytes_AS_STRING(doc), n);
                PyBytes_AS_STRING(frame)[n] = '\n';
            }
            Py_DECREF(doc);
            return frame;
        }
        Py_XDECREF(doc);
        PyErr_Clear(); /* marshal raises the framing's own error */
    }
    return PyObject_CallMethodOneArg(framing, P.str_marshal, msg);
}

/* The next clock (under the lock): the caller's Clock ticked, or our own
 * moved to the wall clock and ticked. 0 on error. */
static uint64_t
next_clock(Publisher *p)
{
    if (p->clock_obj == NULL) {
        uint64_t wall = ((uint64_t)(now_ns() / 100) + UUID_EPOCH_OFFSET) << 4;
        p->clock = (wall > p->clock ? wall : p->clock) + 1;
        return p->clock;
    }
    PyObject *v = PyObject_CallMethodNoArgs(p->clock_obj, P.str_tick);
    if (v == NULL) {
        return 0;
    }
    uint64_t c = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (c == (uint64_t)-1 && PyErr_Occurred()) {
        return 0;
    }
    return c;
}

/* msg.set_uuid(u); for a JsonDocument keeping JsonDocument's own set_uuid,
 * get and __setitem__, its steps done here: msg["_meta"]["uuid"] = u, the
 * "_meta" object made if missing (or null). */
static int
set_uuid(Publisher *p, PyObject *msg, PyObject *u)
{
    PyTypeObject *t = Py_TYPE(msg);
    if (t != p->doc_type && PyObject_TypeCheck(msg, (PyTypeObject *)P.json_document)) {
        PyObject *su = PyObject_GetAttr((PyObject *)t, P.str_set_uuid);
        PyObject *get = su ? PyObject_GetAttr((PyObject *)t, P.str_get_) : NULL;
        PyObject *si = get ? PyObject_GetAttr((PyObject *)t, P.str_setitem) : NULL;
        int plain = si != NULL && su == P.json_set_uuid && get == P.dict_get
                    && si == P.dict_setitem;
        Py_XDECREF(su);
        Py_XDECREF(get);
        Py_XDECREF(si);
        if (PyErr_Occurred()) {
            return -1;
        }
        if (plain) {
            Py_XSETREF(p->doc_type, (PyTypeObject *)Py_NewRef(t));
        }
    }
    if (t == p->doc_type) {
        PyObject *meta = PyDict_GetItemWithError(msg, C.str_meta);
        if (meta == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (meta == NULL || meta == Py_None) {
            meta = PyDict_New();
            int rc = meta ? PyDict_SetItem(msg, C.str_meta, meta) : -1;
            Py_XDECREF(meta); /* msg holds it */
            if (rc < 0) {
                return -1;
            }
        }
        if (PyDict_CheckExact(meta)) {
            return PyDict_SetItem(meta, C.str_uuid, u);
        }
        /* A dict subclass goes through its own __setitem__; anything else is
         * set_uuid's error to raise. */
    }
    PyObject *res = PyObject_CallMethodOneArg(msg, P.str_set_uuid, u);
    Py_XDECREF(res);
    return res ? 0 : -1;
}

static PyObject *
publish(Publisher *p, PyObject *mapping, PyObject *msg, unsigned flags)
{
    PyObject *validate;
    if (_PyObject_LookupAttr(msg, P.str_validate, &validate) < 0) {
        return NULL;
    }
    if (validate != NULL) {
        PyObject *res = PyObject_CallNoArgs(validate);
        Py_DECREF(validate);
        if (res == NULL) {
            return NULL;
        }
        Py_DECREF(res);
    }
    PyObject *mapped = PyObject_CallOneArg(mapping, msg);
    if (mapped == NULL) {
        return NULL;
    }
    PyObject *journal, *content_type;
    if (!PyTuple_Check(mapped) || PyTuple_GET_SIZE(mapped) != 2) {
        PyErr_Format(PyExc_TypeError, "a mapping returns (journal, content type), not %.100R",
                     mapped);
        Py_DECREF(mapped);
        return NULL;
    }
    journal = PyTuple_GET_ITEM(mapped, 0);
    content_type = PyTuple_GET_ITEM(mapped, 1);
    PyObject *framing = framing_of(p, content_type); /* (framing, dumps, types) */
    if (framing == NULL) {
        Py_DECREF(mapped);
        return NULL;
    }
    Py_INCREF(framing);
    PyObject *future = NULL, *frame = NULL, *u = NULL, *clock_obj = NULL;
    pub_lock(p);
    uint64_t clock = next_clock(p);
    if (clock == 0 && PyErr_Occurred()) {
        goto done;
    }
    uint64_t hi, lo;
    uuid_halves(p->node, clock, flags, &hi, &lo);
    u = new_uuid(hi, lo);
    if (u == NULL || set_uuid(p, msg, u) < 0) {
        goto done;
    }
    frame = marshal(framing, msg);
    if (frame == NULL) {
        goto done;
    }
    PyObject *call_args[3] = {p->client, journal, frame};
    future = PyObject_VectorcallMethod(P.str_append, call_args,
                                       3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (future == NULL) {
        goto done;
    }
    clock_obj = PyLong_FromUnsignedLongLong(clock);
    if (clock_obj == NULL) {
        Py_CLEAR(future);
        goto done;
    }
    int rc = 0;
    if (flags == CONTINUE_TXN) {
        int known = PyDict_Contains(p->pending, journal);
        if (known < 0) {
            rc = -1;
        }
        else if (!known) {
            /* A reader that never saw this producer in the journal starts
             * it at (first clock - 1): roll back to that. */
            PyObject *base = PyDict_GetItemWithError(p->last_commit, journal);
            PyObject *below = base ? Py_NewRef(base)
                                   : (PyErr_Occurred() ? NULL
                                                       : PyLong_FromUnsignedLongLong(clock - 1));
            rc = (below == NULL || PyDict_SetItem(p->pending, journal, msg) < 0
                  || PyDict_SetItem(p->txn_base, journal, below) < 0) ? -1 : 0;
            Py_XDECREF(below);
        }
    }
    else {
        rc = PyDict_SetItem(p->last_commit, journal, clock_obj);
    }
    if (rc < 0) {
        Py_CLEAR(future);
    }
done:
    PyThread_release_lock(p->lock);
    Py_XDECREF(clock_obj);
    Py_XDECREF(u);
    Py_XDECREF(frame);
    Py_DECREF(framing);
    Py_DECREF(mapped);
    return future;
}

static PyObject *
publisher_publish_committed(Publisher *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "publish_committed(mapping, msg)");
        return NULL;
    }
    return publish(p, args[0], args[1], OUTSIDE_TXN);
}

static PyObject *
publisher_publish_uncommitted(Publisher *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "publish_uncommitted(mapping, msg)");
        return NULL;
    }
    return publish(p, args[0], args[1], CONTINUE_TXN);
}

/* The intents of the open transactions (ACKs, or roll-backs). */
static PyObject *
intents(Publisher *p, int rollback)
{
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    pub_lock(p);
    Py_ssize_t pos = 0;
    PyObject *journal, *msg;
    while (PyDict_Next(p->pending, &pos, &journal, &msg)) {
        PyObject *ack = PyObject_CallMethodOneArg(msg, P.str_new_ack, journal);
        if (ack == NULL) {
            goto fail;
        }
        uint64_t clock;
        PyObject *clock_obj;
        if (rollback) {
            /* Readers' last_ack for this producer becomes this clock. */
            clock_obj = PyDict_GetItemWithError(p->txn_base, journal);
            clock = clock_obj ? PyLong_AsUnsignedLongLong(clock_obj) : 0;
            Py_XINCREF(clock_obj);
        }
        else {
            clock = next_clock(p);
            clock_obj = PyErr_Occurred() ? NULL : PyLong_FromUnsignedLongLong(clock);
        }
        if (clock_obj == NULL || PyErr_Occurred()
            || PyDict_SetItem(p->last_commit, journal, clock_obj) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetObject(PyExc_KeyError, journal);
            }
            Py_XDECREF(clock_obj);
            Py_DECREF(ack);
            goto fail;
        }
        Py_DECREF(clock_obj);
        uint64_t hi, lo;
        uuid_halves(p->node, clock, ACK_TXN, &hi, &lo);
        PyObject *u = new_uuid(hi, lo);
        PyObject *res = u ? PyObject_CallMethodOneArg(ack, P.str_set_uuid, u) : NULL;
        Py_XDECREF(u);
        Py_XDECREF(res);
        PyObject *spec = res ? PyObject_CallMethod(p->client, "get", "O", journal) : NULL;
        PyObject *ct = spec ? PyObject_GetAttr(spec, P.str_content_type) : NULL;
        Py_XDECREF(spec);
        if (ct == Py_None) {
            Py_SETREF(ct, PyUnicode_FromString(""));
        }
        PyObject *framing = ct ? framing_of(p, ct) : NULL;
        Py_XDECREF(ct);
        PyObject *frame = framing ? marshal(framing, ack) : NULL;
        Py_DECREF(ack);
        PyObject *intent = frame ? PyObject_CallFunctionObjArgs(P.ack_intent, journal, frame,
                                                                NULL) : NULL;
        Py_XDECREF(frame);
        if (intent == NULL || PyList_Append(out, intent) < 0) {
            Py_XDECREF(intent);
            goto fail;
        }
        Py_DECREF(intent);
    }
    PyDict_Clear(p->pending);
    PyDict_Clear(p->txn_base);
    PyThread_release_lock(p->lock);
    return out;
fail:
    PyThread_release_lock(p->lock);
    Py_DECREF(out);
    return NULL;
}

static PyObject *
publisher_build_ack_intents(Publisher *p, PyObject *Py_UNUSED(ignored))
{
    return intents(p, 0);
}

static PyObject *
publisher_build_rollback_intents(Publisher *p, PyObject *Py_UNUSED(ignored))
{
    return intents(p, 1);
}

static PyObject *
publisher_get_producer_id(Publisher *p, void *closure)
{
    return Py_NewRef(p->producer);
}

static PyObject *
publisher_get_client(Publisher *p, void *closure)
{
    return Py_NewRef(p->client);
}

static PyObject *
publisher_get_clock(Publisher *p, void *closure)
{
    if (p->clock_obj != NULL) {
        return Py_NewRef(p->clock_obj);
    }
    return PyObject_CallFunction(P.clock_type, "K", (unsigned long long)p->clock);
}

static PyObject *
publisher_get_has_open_transaction(Publisher *p, void *closure)
{
    return PyBool_FromLong(PyDict_GET_SIZE(p->pending) != 0);
}

static PyMethodDef publisher_methods[] = {
    {"publish_committed", (PyCFunction)(void (*)(void))publisher_publish_committed,
     METH_FASTCALL,
     "publish_committed($self, mapping, msg, /)\n--\n\n"
     "Publish msg for immediate read-committed consumption (OUTSIDE_TXN)."},
    {"publish_uncommitted", (PyCFunction)(void (*)(void))publisher_publish_uncommitted,
     METH_FASTCALL,
     "publish_uncommitted($self, mapping, msg, /)\n--\n\n"
     "Publish msg as part of this Publisher's open transaction (CONTINUE_TXN)."},
    {"build_ack_intents", (PyCFunction)publisher_build_ack_intents, METH_NOARGS,
     "build_ack_intents($self, /)\n--\n\n"
     "ACK intents committing every journal published to uncommitted since the last call."},
    {"build_rollback_intents", (PyCFunction)publisher_build_rollback_intents, METH_NOARGS,
     "build_rollback_intents($self, /)\n--\n\n"
     "ACK intents that roll back (abort) the open transaction instead."},
    {NULL},
};

static PyGetSetDef publisher_getset[] = {
    {"producer_id", (getter)publisher_get_producer_id, NULL,
     "The 6-byte ProducerID stamped on every message of this Publisher.", NULL},
    {"client", (getter)publisher_get_client, NULL, "The journal client appended to.", NULL},
    {"clock", (getter)publisher_get_clock, NULL,
     "The caller's Clock; or a copy of the Publisher's own.", NULL},
    {"has_open_transaction", (getter)publisher_get_has_open_transaction, NULL,
     "True if messages were published uncommitted since the last intents.", NULL},
    {NULL},
};

static PyTypeObject PublisherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "message._native.Publisher",
    .tp_doc = "Publisher(client, clock=None)\n--\n\n"
              "Maps, sequences and appends messages to journals (the native "
              "implementation of message/_publisher.py).",
    .tp_basicsize = sizeof(Publisher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = publisher_new,
    .tp_dealloc = (destructor)publisher_dealloc,
    .tp_traverse = (traverseproc)publisher_traverse,
    .tp_clear = (inquiry)publisher_clear,
    .tp_methods = publisher_methods,
    .tp_getset = publisher_getset,
};

/* -- layout and module ---------------------------------------------------- */

static PyObject *
layout(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{sKsKsisisisisisi}", "UUID_EPOCH_OFFSET", UUID_EPOCH_OFFSET,
                         "PRODUCER_MASK", PRODUCER_MASK, "FLAGS_SHIFT",
                         FLAGS_SHIFT, "FLAGS_MASK", FLAGS_MASK, "COUNTER_SHIFT", COUNTER_SHIFT,
                         "OUTSIDE_TXN", OUTSIDE_TXN, "CONTINUE_TXN", CONTINUE_TXN, "ACK_TXN",
                         ACK_TXN);
}

/* split_uuid(i) -> (clock, flags, producer): the fields as this module reads them. */
static PyObject *
split_uuid(PyObject *module, PyObject *v)
{
    uint64_t hi, lo;
    if (split_uuid_int(v, &hi, &lo) < 0) {
        return NULL;
    }
    return Py_BuildValue("(KIK)", (unsigned long long)clock_of(hi, lo), flags_of(lo),
                         (unsigned long long)(lo & PRODUCER_MASK));
}

static PyMethodDef module_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(envelope, producer_state, must_start_replay, replay_error, uuid_int_of, "
     "json_uuid_int, horizon_units, warn_unknown_flags, warn_old_ack): what the core takes "
     "from Python, once."},
    {"configure_publisher", configure_publisher, METH_VARARGS,
     "configure_publisher(UUID, SafeUUID.unknown, Clock, new_producer_id, "
     "framing_by_content_type, AckIntent, JsonDocument): what the Publisher takes from "
     "Python, once."},
    {"layout", layout, METH_NOARGS, "The UUID layout constants this module was built with."},
    {"split_uuid", split_uuid, METH_O,
     "split_uuid(i) -> (clock, flags, producer) of a UUID given as its int."},
    {"format_uuids", format_uuids, METH_VARARGS,
     "format_uuids(hi, lo): canonical UUID strings and ProducerID hex strings, "
     "36 and 12 bytes each, of UUIDs given as 64-bit halves."},
    {"parse_uuids", parse_uuids, METH_VARARGS,
     "parse_uuids(data, offsets, hi, lo): canonical UUID strings of an Arrow string "
     "array as 64-bit halves; returns the rows it could not parse."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "message._native",
    .m_doc = "The native core of the message package (see message/_core.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    init_hex();
    if (PyType_Ready(&SequencerType) < 0 || PyType_Ready(&ReaderType) < 0
        || PyType_Ready(&CommittedType) < 0 || PyType_Ready(&PublisherType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Sequencer", (PyObject *)&SequencerType) < 0
        || PyModule_AddObjectRef(m, "EnvelopeReader", (PyObject *)&ReaderType) < 0
        || PyModule_AddObjectRef(m, "CommittedReader", (PyObject *)&CommittedType) < 0
        || PyModule_AddObjectRef(m, "Publisher", (PyObject *)&PublisherType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
