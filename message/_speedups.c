/*
 * message._speedups: the per-message loops of the read iterators, in C.
 *
 * An optional accelerator. message/_reader.py and message/_sequencer.py are
 * the definition of the behaviour; this module runs the same steps for the
 * common cases, on the same objects, and hands every other case back to the
 * Python code. Without it (no C compiler at install time, or
 * EXACTLY_PURE_PYTHON=1) everything works the same, only slower.
 *
 * - EnvelopeReader: frames (begin, end, frame) in, Envelopes out. Calls
 *   new_message(spec), decodes the frame into it (orjson.loads and a dict
 *   merge for plain JSON documents, else the framing's unmarshal_frame), and
 *   builds the Envelope. It is the iterator of a ReadUncommittedIter.
 * - CommittedReader: drives an EnvelopeReader and applies to each envelope
 *   the Sequencer's rule for a message that commits alone (OUTSIDE_TXN, a
 *   known producer with no open transaction, a clock above its last ACK),
 *   writing the Sequencer's and the producer's slots exactly as
 *   Sequencer.queue_uncommitted followed by deque_committed would. Any other
 *   envelope goes to slow(envelope), a Python generator of what the Python
 *   Sequencer commits, which is drained before reading on. It is the
 *   iterator of a ReadCommittedIter.
 *
 * Both end as a Python generator would: at the end of the frames, or at the
 * first exception, after which they are exhausted; either way, and on
 * close(), they call on_end() once (which releases the journal reader).
 *
 * The Python classes keep their state in __slots__; configure() looks up the
 * slots' offsets once, from their member descriptors.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* Replace a slot's value, stealing the reference to `v`. */
static inline void
set_slot(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = v;
    Py_XDECREF(old);
}

/* -- configuration ------------------------------------------------------ */

typedef struct {
    int ready;
    PyTypeObject *envelope_type;
    Py_ssize_t env_journal, env_begin, env_end, env_message;
    PyTypeObject *sequencer_type;
    Py_ssize_t s_seq, s_out, s_out_n, s_out_pos, s_single, s_inflight, s_partials, s_replay,
        s_epoch;
    PyTypeObject *partial_type;
    Py_ssize_t p_begin, p_last_ack, p_max_clock;
    PyObject *uuid_int_of;   /* dict: message type -> function giving the UUID as an int */
    PyObject *json_uuid_int; /* the function of documents with their UUID at _meta/uuid */
    PyObject *str_meta, *str_uuid, *str_get_uuid, *str_int, *str_name, *str_getitem, *int_64;
    PyObject *dict_getitem; /* dict.__getitem__ */
    PyObject *int_minus1;
} Config;

static Config C;

static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) {
        return -1;
    }
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type)
        || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX
        || (((PyMemberDescrObject *)d)->d_member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable __slots__ member",
                     type->tp_name, name);
        Py_DECREF(d);
        return -1;
    }
    *offset = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyTypeObject *env, *seq, *partial;
    PyObject *uuid_int_of, *json_uuid_int;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O:configure", &PyType_Type, &env, &PyType_Type, &seq,
                          &PyType_Type, &partial, &PyDict_Type, &uuid_int_of, &json_uuid_int)) {
        return NULL;
    }
    Config c = {0};
    if (slot_offset(env, "journal", &c.env_journal) < 0
        || slot_offset(env, "begin", &c.env_begin) < 0
        || slot_offset(env, "end", &c.env_end) < 0
        || slot_offset(env, "message", &c.env_message) < 0
        || slot_offset(seq, "_seq", &c.s_seq) < 0
        || slot_offset(seq, "_out", &c.s_out) < 0
        || slot_offset(seq, "_out_n", &c.s_out_n) < 0
        || slot_offset(seq, "_out_pos", &c.s_out_pos) < 0
        || slot_offset(seq, "_single", &c.s_single) < 0
        || slot_offset(seq, "_inflight", &c.s_inflight) < 0
        || slot_offset(seq, "_partials", &c.s_partials) < 0
        || slot_offset(seq, "_replay", &c.s_replay) < 0
        || slot_offset(seq, "_epoch", &c.s_epoch) < 0
        || slot_offset(partial, "begin", &c.p_begin) < 0
        || slot_offset(partial, "last_ack", &c.p_last_ack) < 0
        || slot_offset(partial, "max_clock", &c.p_max_clock) < 0) {
        return NULL;
    }
    if (env->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "the envelope type must have __slots__ only");
        return NULL;
    }
    c.str_meta = PyUnicode_InternFromString("_meta");
    c.str_uuid = PyUnicode_InternFromString("uuid");
    c.str_get_uuid = PyUnicode_InternFromString("get_uuid");
    c.str_int = PyUnicode_InternFromString("int");
    c.str_name = PyUnicode_InternFromString("name");
    c.str_getitem = PyUnicode_InternFromString("__getitem__");
    c.int_64 = PyLong_FromLong(64);
    c.int_minus1 = PyLong_FromLong(-1);
    c.dict_getitem = c.str_getitem
                         ? PyObject_GetAttr((PyObject *)&PyDict_Type, c.str_getitem) : NULL;
    if (!c.str_meta || !c.str_uuid || !c.str_get_uuid || !c.str_int || !c.str_name
        || !c.str_getitem || !c.int_64 || !c.int_minus1 || !c.dict_getitem) {
        return NULL;
    }
    c.envelope_type = (PyTypeObject *)Py_NewRef(env);
    c.sequencer_type = (PyTypeObject *)Py_NewRef(seq);
    c.partial_type = (PyTypeObject *)Py_NewRef(partial);
    c.uuid_int_of = Py_NewRef(uuid_int_of);
    c.json_uuid_int = Py_NewRef(json_uuid_int);
    c.ready = 1;
    /* Configured once per process; a second call (a reload) leaks the old refs. */
    C = c;
    Py_RETURN_NONE;
}

/* -- EnvelopeReader ----------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *frames;       /* iterator of (begin, end, frame), or of batches */
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
    int done;
} Reader;

static PyTypeObject ReaderType;

static int
reader_traverse(Reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->frames);
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
                             "truncated", "loads", "plain_types", "batched", NULL};
    PyObject *frames, *spec, *new_message, *decode, *jumps, *rebase, *corrupt, *error_type;
    PyObject *on_end, *truncated_type, *truncated;
    PyObject *loads = Py_None, *plain_types = Py_None;
    long long base;
    int batched = 0;
    if (!C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "message._speedups is not configured");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOLOOO|OOp:EnvelopeReader", kwlist,
                                     &frames, &spec, &new_message, &decode, &jumps, &rebase,
                                     &corrupt, &error_type, &base, &on_end, &truncated_type,
                                     &truncated, &loads, &plain_types, &batched)) {
        return NULL;
    }
    if (!PyIter_Check(frames)) {
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

/* An Envelope, as its dataclass __init__ makes it. */
static PyObject *
new_envelope(PyObject *spec, long long begin, long long end, PyObject *msg)
{
    PyObject *b = PyLong_FromLongLong(begin);
    PyObject *e = b ? PyLong_FromLongLong(end) : NULL;
    PyObject *env = e ? C.envelope_type->tp_alloc(C.envelope_type, 0) : NULL;
    if (env == NULL) {
        Py_XDECREF(b);
        Py_XDECREF(e);
        return NULL;
    }
    SLOT(env, C.env_journal) = Py_NewRef(spec);
    SLOT(env, C.env_begin) = b;
    SLOT(env, C.env_end) = e;
    SLOT(env, C.env_message) = Py_NewRef(msg);
    return env;
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

/* The next frame (a new reference) and its [begin, end) in the stream;
 * NULL at the end or on error. */
static PyObject *
next_frame(Reader *r, long long *begin, long long *end)
{
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
    .tp_name = "message._speedups.EnvelopeReader",
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

enum { KIND_JSON = 1, KIND_FUNC = 2, KIND_GET_UUID = 3 };

/* A producer's partial, found in Sequencer._partials under (journal name,
 * producer), with its last_ack object and that object's value. */
typedef struct {
    uint64_t producer;
    PyObject *partial; /* NULL: an empty entry */
    PyObject *ack_obj;
    uint64_t ack;
} Entry;

typedef struct {
    PyObject_HEAD
    Reader *reader;
    PyObject *seq;
    PyObject *slow;            /* slow(env): iterator of what the Python Sequencer commits */
    PyObject *sub;             /* the slow() iterator being drained, or NULL */
    int done;
    PyObject *spec, *name;     /* the journal name of the last spec seen */
    PyTypeObject *msg_type;    /* the last message type seen, and how to get its UUID */
    int kind;
    PyObject *func;            /* KIND_FUNC: UUID_INT_OF[msg_type] */
    /* Partials by producer, for the journal `name`: open addressing. The
     * Sequencer bumps _epoch whenever it forgets partials, and the cache is
     * emptied then; partials it adds are found in _partials on a miss. */
    Entry *table;
    Py_ssize_t cap, used;      /* cap: 0 or a power of 2 */
    long long epoch;
} Committed;

static PyTypeObject CommittedType;

static void
cache_clear(Committed *c)
{
    Entry *table = c->table;
    Py_ssize_t cap = c->cap;
    c->table = NULL;
    c->cap = c->used = 0;
    for (Py_ssize_t i = 0; i < cap; i++) {
        Py_XDECREF(table[i].partial);
        Py_XDECREF(table[i].ack_obj);
    }
    PyMem_Free(table);
}

static inline Entry *
cache_slot(Entry *table, Py_ssize_t cap, uint64_t producer)
{
    size_t mask = (size_t)cap - 1;
    size_t i = (size_t)((producer ^ (producer >> 29)) * 0x9E3779B97F4A7C15ULL >> 20) & mask;
    while (table[i].partial != NULL && table[i].producer != producer) {
        i = (i + 1) & mask;
    }
    return &table[i];
}

/* Room for one more entry; -1 on error. */
static int
cache_reserve(Committed *c)
{
    if ((c->used + 1) * 2 <= c->cap) {
        return 0;
    }
    Py_ssize_t cap = c->cap ? c->cap * 2 : 64;
    Entry *table = PyMem_Calloc((size_t)cap, sizeof(Entry));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < c->cap; i++) {
        if (c->table[i].partial != NULL) {
            *cache_slot(table, cap, c->table[i].producer) = c->table[i];
        }
    }
    PyMem_Free(c->table);
    c->table = table;
    c->cap = cap;
    return 0;
}

static int
committed_traverse(Committed *c, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < c->cap; i++) {
        Py_VISIT(c->table[i].partial);
        Py_VISIT(c->table[i].ack_obj);
    }
    Py_VISIT(c->reader);
    Py_VISIT(c->seq);
    Py_VISIT(c->slow);
    Py_VISIT(c->sub);
    Py_VISIT(c->spec);
    Py_VISIT(c->name);
    Py_VISIT(c->msg_type);
    Py_VISIT(c->func);
    return 0;
}

static int
committed_clear(Committed *c)
{
    Py_CLEAR(c->reader);
    Py_CLEAR(c->seq);
    Py_CLEAR(c->slow);
    Py_CLEAR(c->sub);
    Py_CLEAR(c->spec);
    Py_CLEAR(c->name);
    Py_CLEAR(c->msg_type);
    Py_CLEAR(c->func);
    cache_clear(c);
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
    static char *kwlist[] = {"reader", "sequencer", "slow", NULL};
    PyObject *reader, *seq, *slow;
    if (!C.ready) {
        PyErr_SetString(PyExc_RuntimeError, "message._speedups is not configured");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O:CommittedReader", kwlist, &ReaderType,
                                     &reader, C.sequencer_type, &seq, &slow)) {
        return NULL;
    }
    Committed *c = (Committed *)type->tp_alloc(type, 0);
    if (c == NULL) {
        return NULL;
    }
    c->reader = (Reader *)Py_NewRef(reader);
    c->seq = Py_NewRef(seq);
    c->slow = Py_NewRef(slow);
    c->epoch = -1;
    return (PyObject *)c;
}

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
    /* Digits 0-15 (before the third hyphen's group ends) are the high half. */
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

/* A 128-bit UUID int object as two halves; 1 if in range. */
static int
split_uuid_int(PyObject *v, uint64_t *hi, uint64_t *lo)
{
    if (!PyLong_Check(v)) {
        return 0;
    }
    PyObject *h = PyNumber_Rshift(v, C.int_64);
    if (h == NULL) {
        PyErr_Clear();
        return 0;
    }
    uint64_t hv = PyLong_AsUnsignedLongLong(h); /* raises if negative or too large */
    Py_DECREF(h);
    if (hv == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *hi = hv;
    *lo = PyLong_AsUnsignedLongLongMask(v);
    return 1;
}

/* The UUID of a message as two 64-bit halves, as Sequencer.queue_uncommitted
 * gets it. 1 if found; 0 to leave the message to the Python code (which
 * will get it again, and raise what it raises). */
static int
message_uuid(Committed *c, PyObject *msg, uint64_t *hi, uint64_t *lo)
{
    PyTypeObject *t = Py_TYPE(msg);
    if (t != c->msg_type) {
        PyObject *func = PyDict_GetItemWithError(C.uuid_int_of, (PyObject *)t);
        if (func == NULL && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        int kind = KIND_GET_UUID;
        if (func == C.json_uuid_int && PyDict_Check(msg)) {
            /* self["_meta"] is a plain dict lookup unless __getitem__ is overridden. */
            PyObject *own = PyObject_GetAttr((PyObject *)t, C.str_getitem);
            if (own == NULL) {
                PyErr_Clear();
                return 0;
            }
            if (own == C.dict_getitem) {
                kind = KIND_JSON;
            }
            Py_DECREF(own);
        }
        else if (func != NULL) {
            kind = KIND_FUNC;
        }
        Py_XSETREF(c->func, Py_XNewRef(func));
        Py_XSETREF(c->msg_type, (PyTypeObject *)Py_NewRef(t));
        c->kind = kind;
    }
    PyObject *v;
    if (c->kind == KIND_JSON) {
        /* JsonDocument._uuid_int: self["_meta"]["uuid"], canonical string. */
        PyObject *meta = PyDict_GetItemWithError(msg, C.str_meta);
        if (meta == NULL || !PyDict_CheckExact(meta)) {
            PyErr_Clear();
            return 0;
        }
        PyObject *u = PyDict_GetItemWithError(meta, C.str_uuid);
        if (u == NULL) {
            PyErr_Clear();
            return 0;
        }
        return parse_uuid36(u, hi, lo);
    }
    if (c->kind == KIND_FUNC) {
        v = PyObject_Vectorcall(c->func, &msg, 1, NULL);
    }
    else {
        PyObject *u = PyObject_CallMethodNoArgs(msg, C.str_get_uuid);
        v = u ? PyObject_GetAttr(u, C.str_int) : NULL;
        Py_XDECREF(u);
    }
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = split_uuid_int(v, hi, lo);
    Py_DECREF(v);
    return ok;
}

/* An int slot's value, or `dflt` if it is no int that fits. */
static inline long long
slot_ll(PyObject *obj, Py_ssize_t off, long long dflt)
{
    PyObject *v = SLOT(obj, off);
    if (v == NULL || !PyLong_CheckExact(v)) {
        return dflt;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return dflt;
    }
    return x;
}

/* Sequencer.queue_uncommitted then deque_committed for an envelope that
 * commits alone. 1 if done; 0 if the envelope is for the Python Sequencer;
 * -1 on error. */
static int
commit_alone(Committed *c, PyObject *env)
{
    PyObject *seq = c->seq;
    PyObject *msg = SLOT(env, C.env_message);
    uint64_t hi, lo;
    if (msg == NULL || !message_uuid(c, msg, &hi, &lo)) {
        return 0;
    }
    uint64_t clock = ((hi & 0x0FFF) << 52) | (((hi >> 16) & 0xFFFF) << 36)
                     | ((hi >> 32) << 4) | ((lo >> 58) & 0xF);
    uint64_t flags = (lo >> 48) & 0x3FF;
    if (clock == 0 || flags != 0) {
        return 0;
    }
    /* Nothing left to dequeue and no replay running: queue_uncommitted's check. */
    if (slot_ll(seq, C.s_out_pos, -1) < slot_ll(seq, C.s_out_n, LLONG_MAX)
        || SLOT(seq, C.s_replay) != Py_None) {
        return 0;
    }
    PyObject *spec = SLOT(env, C.env_journal);
    if (spec != c->spec) {
        PyObject *name = PyObject_GetAttr(spec, C.str_name);
        if (name == NULL) {
            PyErr_Clear();
            return 0;
        }
        Py_XSETREF(c->spec, Py_NewRef(spec));
        if (c->name == NULL || PyObject_RichCompareBool(name, c->name, Py_EQ) != 1) {
            PyErr_Clear();
            cache_clear(c);
            Py_XSETREF(c->name, name);
        }
        else {
            Py_DECREF(name);
        }
    }
    long long epoch = slot_ll(seq, C.s_epoch, -2);
    if (epoch != c->epoch) {
        cache_clear(c);
        c->epoch = epoch;
    }
    uint64_t producer = lo & 0xFFFFFFFFFFFFULL;
    Entry *e = c->cap ? cache_slot(c->table, c->cap, producer) : NULL;
    if (e == NULL || e->partial == NULL) {
        PyObject *partials = SLOT(seq, C.s_partials);
        if (partials == NULL || !PyDict_CheckExact(partials)) {
            return 0;
        }
        PyObject *pid = PyLong_FromUnsignedLongLong(producer);
        if (pid == NULL) {
            return -1;
        }
        PyObject *key = PyTuple_Pack(2, c->name, pid);
        Py_DECREF(pid);
        if (key == NULL) {
            return -1;
        }
        PyObject *found = PyDict_GetItemWithError(partials, key); /* borrowed */
        Py_DECREF(key);
        if (found == NULL) {
            /* A new producer: the Python Sequencer makes its partial. */
            return PyErr_Occurred() ? -1 : 0;
        }
        if (!Py_IS_TYPE(found, C.partial_type) || cache_reserve(c) < 0) {
            return PyErr_Occurred() ? -1 : 0;
        }
        e = cache_slot(c->table, c->cap, producer);
        e->producer = producer;
        e->partial = Py_NewRef(found);
        e->ack_obj = NULL;
        c->used++;
    }
    PyObject *p = e->partial;
    if (SLOT(p, C.p_begin) != C.int_minus1 && slot_ll(p, C.p_begin, 0) != -1) {
        return 0; /* an open transaction: discarded by the Python Sequencer */
    }
    PyObject *ack = SLOT(p, C.p_last_ack);
    if (ack == NULL) {
        return 0; /* unset: the Python Sequencer raises what it raises */
    }
    if (ack != e->ack_obj) {
        if (!PyLong_CheckExact(ack)) {
            return 0;
        }
        uint64_t v = PyLong_AsUnsignedLongLong(ack);
        if (v == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        Py_XSETREF(e->ack_obj, Py_NewRef(ack));
        e->ack = v;
    }
    if (clock <= e->ack) {
        return 0; /* a duplicate */
    }
    PyObject *single = SLOT(seq, C.s_single);
    long long n = slot_ll(seq, C.s_seq, -1);
    if (single == NULL || !PyList_CheckExact(single) || PyList_GET_SIZE(single) < 1 || n < 0) {
        return 0;
    }
    PyObject *clock_obj = PyLong_FromUnsignedLongLong(clock);
    PyObject *n_obj = clock_obj ? PyLong_FromLongLong(n + 1) : NULL;
    if (n_obj == NULL) {
        Py_XDECREF(clock_obj);
        return -1;
    }
    /* _inflight = (p, env), in the tuple already there if nothing else
     * holds it (as zip() reuses its result tuple). */
    PyObject *inflight = SLOT(seq, C.s_inflight);
    if (inflight != NULL && PyTuple_CheckExact(inflight) && Py_REFCNT(inflight) == 1
        && PyTuple_GET_SIZE(inflight) == 2 && PyObject_GC_IsTracked(inflight)) {
        PyObject *old_p = PyTuple_GET_ITEM(inflight, 0);
        PyObject *old_env = PyTuple_GET_ITEM(inflight, 1);
        PyTuple_SET_ITEM(inflight, 0, Py_NewRef(p));
        PyTuple_SET_ITEM(inflight, 1, Py_NewRef(env));
        Py_DECREF(old_p);
        Py_DECREF(old_env);
    }
    else {
        inflight = PyTuple_Pack(2, p, env);
        if (inflight == NULL) {
            Py_DECREF(clock_obj);
            Py_DECREF(n_obj);
            return -1;
        }
        set_slot(seq, C.s_inflight, inflight);
    }
    /* Committed: the state queue_uncommitted leaves, then dequeued. */
    set_slot(seq, C.s_seq, n_obj);
    set_slot(p, C.p_max_clock, Py_NewRef(clock_obj));
    set_slot(p, C.p_last_ack, Py_NewRef(clock_obj));
    Py_XSETREF(e->ack_obj, clock_obj);
    e->ack = clock;
    PyObject *old = PyList_GET_ITEM(single, 0);
    PyList_SET_ITEM(single, 0, Py_NewRef(env));
    Py_XDECREF(old);
    if (SLOT(seq, C.s_out) != single) {
        set_slot(seq, C.s_out, Py_NewRef(single));
    }
    set_slot(seq, C.s_out_n, PyLong_FromLong(1));
    set_slot(seq, C.s_out_pos, PyLong_FromLong(1));
    return 1;
}

/* Ends the iteration: the slow iterator is dropped, the reader closed. */
static void
committed_finish(Committed *c)
{
    if (c->done) {
        return;
    }
    c->done = 1;
    Py_CLEAR(c->sub);
    Reader *r = c->reader;
    finish(&r->on_end, &r->done);
}

static PyObject *
committed_next(Committed *c)
{
    for (;;) {
        if (c->sub != NULL) {
            PyObject *env = PyIter_Next(c->sub);
            if (env != NULL) {
                return env;
            }
            if (PyErr_Occurred()) {
                committed_finish(c);
                return NULL;
            }
            Py_CLEAR(c->sub);
        }
        if (c->done) {
            return NULL;
        }
        PyObject *env = reader_next(c->reader);
        if (env == NULL) {
            committed_finish(c);
            return NULL;
        }
        int rc = commit_alone(c, env);
        if (rc == 1) {
            return env;
        }
        if (rc == 0) {
            /* The Python Sequencer's: what it commits comes from slow(env). */
            PyObject *it = PyObject_CallOneArg(c->slow, env);
            Py_DECREF(env);
            c->sub = it ? PyObject_GetIter(it) : NULL;
            Py_XDECREF(it);
            if (c->sub != NULL) {
                continue;
            }
        }
        else {
            Py_DECREF(env);
        }
        committed_finish(c);
        return NULL;
    }
}

static PyObject *
committed_close(Committed *c, PyObject *Py_UNUSED(ignored))
{
    PyObject *sub = c->sub;
    c->sub = NULL;
    if (sub != NULL) {
        /* A generator stopped mid-way: let it run its finally clauses. */
        PyObject *res = PyObject_CallMethod(sub, "close", NULL);
        Py_DECREF(sub);
        if (res == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                committed_finish(c);
                return NULL;
            }
            PyErr_Clear();
        }
        Py_XDECREF(res);
    }
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
    .tp_name = "message._speedups.CommittedReader",
    .tp_doc = "Envelopes of an EnvelopeReader that commit alone.",
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

/* -- module ------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Envelope, Sequencer, Partial, UUID_INT_OF, json_uuid_int): "
     "look up the slots the loops read and write."},
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
    .m_name = "message._speedups",
    .m_doc = "The per-message loops of the read iterators, in C (optional).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    init_hex();
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&CommittedType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "EnvelopeReader", (PyObject *)&ReaderType) < 0
        || PyModule_AddObjectRef(m, "CommittedReader", (PyObject *)&CommittedType) < 0
        || PyModule_AddIntConstant(m, "VERSION", 4) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
