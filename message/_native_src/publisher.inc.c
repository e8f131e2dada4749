/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): Publisher: message/_publisher.py's, natively.
 */

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
        *str_update, *str_advance, *str_get_, *str_content_type, *str_new_ack, *str_setitem, *str_plain_dumps;
} PubConfig;

static PubConfig P;

/* The hooks the Publisher takes from Python (see configure() in
 * message/_native.c, the one entry point): 0, or -1 with an exception. */
static int
publisher_setup(PyTypeObject *uuid_type, PyObject *safe, PyObject *clock, PyObject *npi,
                PyObject *fbct, PyObject *ack, PyObject *jd)
{
    if (P.ready) {
        PyErr_SetString(PyExc_RuntimeError, "the publisher is configured already");
        return -1;
    }
    PubConfig p = {0};
    p.d_int = member_descriptor(uuid_type, "int");
    p.d_is_safe = p.d_int ? member_descriptor(uuid_type, "is_safe") : NULL;
    if (p.d_is_safe == NULL) {
        return -1;
    }
#define INTERN(field, text) \
    if ((p.field = PyUnicode_InternFromString(text)) == NULL) return -1;
    INTERN(str_validate, "validate");
    INTERN(str_set_uuid, "set_uuid");
    INTERN(str_marshal, "marshal");
    INTERN(str_append, "append");
    INTERN(str_tick, "tick");
    INTERN(str_update, "update");
    INTERN(str_advance, "advance");
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
        return -1;
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
    return 0;
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
    PyObject *txn_types;  /* journal -> the content type its messages were framed in */
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
    p->txn_types = PyDict_New();
    p->producer = PyObject_CallNoArgs(P.new_producer_id);
    if (p->lock == NULL || p->framings == NULL || p->pending == NULL || p->last_commit == NULL
        || p->txn_base == NULL || p->txn_types == NULL || p->producer == NULL) {
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
    Py_VISIT(p->txn_types);
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
    Py_CLEAR(p->txn_types);
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
    if (lookup_attr(f, P.str_plain_dumps, &plain) < 0) {
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
                PyBytes_AS_STRING(frame)[n] = '\n'; /* framing.NEWLINE ends the frame */
            }
            Py_DECREF(doc);
            return frame;
        }
        Py_XDECREF(doc);
        PyErr_Clear(); /* marshal raises the framing's own error */
    }
    return PyObject_CallMethodOneArg(framing, P.str_marshal, msg);
}

/* The first of `count` consecutive clocks (under the lock): the caller's
 * Clock ticked (advanced, for more than one), or our own, first moved to the
 * wall clock if `wall` (as a publish does; an intent only ticks). 0 on
 * error. */
static uint64_t
next_clocks(Publisher *p, int wall, Py_ssize_t count)
{
    if (p->clock_obj == NULL) {
        uint64_t now = wall ? ((uint64_t)(now_ns() / 100) + UUID_EPOCH_OFFSET) << 4 : 0;
        uint64_t first = (now > p->clock ? now : p->clock) + 1;
        p->clock = first + (uint64_t)count - 1;
        return first;
    }
    PyObject *v;
    if (count == 1) {
        v = PyObject_CallMethodNoArgs(p->clock_obj, P.str_tick);
    }
    else {
        PyObject *n = PyLong_FromSsize_t(count);
        v = n ? PyObject_CallMethodOneArg(p->clock_obj, P.str_advance, n) : NULL;
        Py_XDECREF(n);
    }
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

/* The canonical string of the UUID (hi, lo), as str(uuid.UUID) gives it. */
static PyObject *
uuid_string(uint64_t hi, uint64_t lo)
{
    PyObject *s = PyUnicode_New(36, 127);
    if (s != NULL) {
        format_uuid36((char *)PyUnicode_1BYTE_DATA(s), hi, lo);
    }
    return s;
}

/* msg.set_uuid() of the UUID (hi, lo); for a JsonDocument keeping
 * JsonDocument's own set_uuid, get and __setitem__, its steps done here:
 * msg["_meta"]["uuid"] = the UUID's canonical string, the "_meta" object
 * made if missing (or null), and no uuid.UUID made. */
static int
set_uuid(Publisher *p, PyObject *msg, uint64_t hi, uint64_t lo)
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
            PyObject *text = uuid_string(hi, lo);
            int rc = text ? PyDict_SetItem(meta, C.str_uuid, text) : -1;
            Py_XDECREF(text);
            return rc;
        }
        /* A dict subclass goes through its own __setitem__; anything else is
         * set_uuid's error to raise. */
    }
    PyObject *u = new_uuid(hi, lo);
    PyObject *res = u ? PyObject_CallMethodOneArg(msg, P.str_set_uuid, u) : NULL;
    Py_XDECREF(u);
    Py_XDECREF(res);
    return res ? 0 : -1;
}

/* Under the lock: journal has a message (msg) of the open transaction with
 * `clock`, the first of its messages there unless it has one already,
 * framed in `content_type` (NULL: not known, the journal's is asked for at
 * the ACK). 0, or -1 on error. */
static int
join_transaction(Publisher *p, PyObject *journal, PyObject *msg, uint64_t clock,
                 PyObject *content_type)
{
    int known = PyDict_Contains(p->pending, journal);
    if (known != 0) {
        return known < 0 ? -1 : 0;
    }
    if (content_type != NULL && PyDict_SetItem(p->txn_types, journal, content_type) < 0) {
        return -1;
    }
    if (PyDict_GET_SIZE(p->pending) == 0) {
        COUNTS.begun++;
    }
    /* A reader that never saw this producer in the journal starts it at
     * (first clock - 1): roll back to that. */
    PyObject *base = PyDict_GetItemWithError(p->last_commit, journal);
    PyObject *below = base ? Py_NewRef(base)
                           : (PyErr_Occurred() ? NULL : PyLong_FromUnsignedLongLong(clock - 1));
    int rc = (below == NULL || PyDict_SetItem(p->pending, journal, msg) < 0
              || PyDict_SetItem(p->txn_base, journal, below) < 0) ? -1 : 0;
    Py_XDECREF(below);
    return rc;
}

static PyObject *
publish(Publisher *p, PyObject *mapping, PyObject *msg, unsigned flags)
{
    PyObject *validate;
    if (lookup_attr(msg, P.str_validate, &validate) < 0) {
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
    PyObject *future = NULL, *frame = NULL, *clock_obj = NULL;
    pub_lock(p);
    uint64_t clock = next_clocks(p, 1, 1);
    if (clock == 0 && PyErr_Occurred()) {
        goto done;
    }
    uint64_t hi, lo;
    uuid_halves(p->node, clock, flags, &hi, &lo);
    if (set_uuid(p, msg, hi, lo) < 0) {
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
        rc = join_transaction(p, journal, msg, clock, content_type);
    }
    else {
        rc = PyDict_SetItem(p->last_commit, journal, clock_obj);
    }
    if (rc < 0) {
        Py_CLEAR(future);
    }
    else {
        COUNTS.published++;
    }
done:
    PyThread_release_lock(p->lock);
    Py_XDECREF(clock_obj);
    Py_XDECREF(frame);
    Py_DECREF(framing);
    Py_DECREF(mapped);
    return future;
}

/* The names of the publishing methods' arguments (as message/_publisher.py). */
static const char *const PUBLISH_ARGS[] = {"mapping", "msg"};

/* A publishing method's (mapping, msg), by position (the fast way) or by name. */
static PyObject *
publish_bound(Publisher *p, const char *fname, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames, unsigned flags)
{
    if (nargs == 2 && kwnames == NULL) {
        return publish(p, args[0], args[1], flags);
    }
    PyObject *a[2];
    if (bind_args(fname, args, nargs, kwnames, PUBLISH_ARGS, 2, a) < 0) {
        return NULL;
    }
    return publish(p, a[0], a[1], flags);
}

static PyObject *
publisher_publish_committed(Publisher *p, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    return publish_bound(p, "publish_committed", args, nargs, kwnames, OUTSIDE_TXN);
}

static PyObject *
publisher_publish_uncommitted(Publisher *p, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    return publish_bound(p, "publish_uncommitted", args, nargs, kwnames, CONTINUE_TXN);
}

/* publish_uncommitted_frames(journal, count, frame, ack): see the Python
 * Publisher's method of the same name (message/_publisher.py). */
static PyObject *
publisher_publish_uncommitted_frames(Publisher *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "publish_uncommitted_frames(journal, count, frame, ack)");
        return NULL;
    }
    PyObject *journal = args[0], *frame = args[2], *ack = args[3];
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 1) {
        PyErr_Format(PyExc_ValueError, "publish at least one message, not %zd", count);
        return NULL;
    }
    PyObject *future = NULL, *data = NULL, *first_obj = NULL;
    pub_lock(p);
    uint64_t first = next_clocks(p, 1, count);
    if (first == 0 && PyErr_Occurred()) {
        goto done;
    }
    first_obj = PyLong_FromUnsignedLongLong(first);
    if (first_obj == NULL) {
        goto done;
    }
    data = PyObject_CallOneArg(frame, first_obj);
    if (data == NULL) {
        goto done;
    }
    PyObject *call_args[3] = {p->client, journal, data};
    future = PyObject_VectorcallMethod(P.str_append, call_args,
                                       3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (future == NULL) {
        goto done;
    }
    if (join_transaction(p, journal, ack, first, NULL) < 0) {
        Py_CLEAR(future);
    }
    else {
        COUNTS.published += (unsigned long long)count;
    }
done:
    PyThread_release_lock(p->lock);
    Py_XDECREF(first_obj);
    Py_XDECREF(data);
    return future;
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
            clock = next_clocks(p, 0, 1);
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
        /* The ACK is framed as the transaction's messages were, or as the
         * journal's spec says where they were framed by the caller. */
        PyObject *ct = res ? PyDict_GetItemWithError(p->txn_types, journal) : NULL;
        if (ct != NULL) {
            Py_INCREF(ct);
        }
        else if (res != NULL && !PyErr_Occurred()) {
            PyObject *spec = PyObject_CallMethod(p->client, "get", "O", journal);
            ct = spec ? PyObject_GetAttr(spec, P.str_content_type) : NULL;
            Py_XDECREF(spec);
        }
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
    if (PyDict_GET_SIZE(p->pending)) {
        if (rollback) {
            COUNTS.rolled_back++;
        }
        else {
            COUNTS.committed++;
        }
    }
    PyDict_Clear(p->pending);
    PyDict_Clear(p->txn_base);
    PyDict_Clear(p->txn_types);
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

/* emit(mapping, msg): a transient message, never appended. Rare and never
 * on a hot path: message._publisher.emit_message, which the Python
 * Publisher runs too, is the one implementation. */
static PyObject *
publisher_emit(Publisher *p, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static PyObject *emit_message = NULL;
    PyObject *a[2];
    if (bind_args("emit", args, nargs, kwnames, PUBLISH_ARGS, 2, a) < 0) {
        return NULL;
    }
    if (emit_message == NULL) {
        PyObject *mod = PyImport_ImportModule("message._publisher");
        if (mod == NULL) {
            return NULL;
        }
        emit_message = PyObject_GetAttrString(mod, "emit_message");
        Py_DECREF(mod);
        if (emit_message == NULL) {
            return NULL;
        }
    }
    return PyObject_CallFunctionObjArgs(emit_message, (PyObject *)p, a[0], a[1], NULL);
}

static PyMethodDef publisher_methods[] = {
    {"emit", (PyCFunction)(void (*)(void))publisher_emit, METH_FASTCALL | METH_KEYWORDS,
     "emit($self, mapping, msg)\n--\n\n"
     "Emit msg to the live followers of its journal, never stored (transient)."},
    {"publish_committed", (PyCFunction)(void (*)(void))publisher_publish_committed,
     METH_FASTCALL | METH_KEYWORDS,
     "publish_committed($self, mapping, msg)\n--\n\n"
     "Publish msg for immediate read-committed consumption (OUTSIDE_TXN)."},
    {"publish_uncommitted", (PyCFunction)(void (*)(void))publisher_publish_uncommitted,
     METH_FASTCALL | METH_KEYWORDS,
     "publish_uncommitted($self, mapping, msg)\n--\n\n"
     "Publish msg as part of this Publisher's open transaction (CONTINUE_TXN)."},
    {"publish_uncommitted_frames",
     (PyCFunction)(void (*)(void))publisher_publish_uncommitted_frames, METH_FASTCALL,
     "publish_uncommitted_frames($self, journal, count, frame, ack, /)\n--\n\n"
     "Publish count messages the caller framed, stamped from frame(first_clock)."},
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
