/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): EnvelopeReader and CommittedReader: the loops of message/_reader.py.
 */

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
        /* A line as framing/_lines.py defines it: up to framing.NEWLINE. */
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
    int include_acks; /* else an ACK_TXN that commits is dequeued, not handed out */
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
    static char *kwlist[] = {"reader", "sequencer", "replay", "include_acks", NULL};
    PyObject *reader, *seq, *replay;
    int include_acks = 1;
    if (check_ready() < 0) {
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O|p:CommittedReader", kwlist,
                                     &ReaderType, &reader, &SequencerType, &seq, &replay,
                                     &include_acks)) {
        return NULL;
    }
    Committed *c = (Committed *)type->tp_alloc(type, 0);
    if (c == NULL) {
        return NULL;
    }
    c->reader = (Reader *)Py_NewRef(reader);
    c->seq = (Sequencer *)Py_NewRef(seq);
    c->replay = Py_NewRef(replay);
    c->include_acks = include_acks;
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
            if (!c->include_acks && is_committing_ack(s, env)) {
                Py_DECREF(env);
                continue;
            }
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
        /* Its parts as the reader made them: no attribute read back. An
         * envelope committing alone (most do) comes straight back. */
        PyObject *alone = NULL;
        rc = seq_queue_parts(s, env, c->reader->last_msg, c->reader->spec,
                             c->reader->last_begin, &alone);
        Py_DECREF(env);
        if (rc < 0) {
            committed_finish(c);
            return NULL;
        }
        if (alone != NULL) {
            if (!c->include_acks && is_committing_ack(s, alone)) {
                Py_DECREF(alone);
                continue;
            }
            return alone;
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
