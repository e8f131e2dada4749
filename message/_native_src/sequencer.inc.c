/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): Sequencer: the state machine of message/_sequencer.py.
 */

/* -- Sequencer ------------------------------------------------------------ */
/*
 * The state machine of message/_sequencer.py, step for step (its docstring
 * explains the rules and the virtual ring). Names follow the Python code.
 */

/* A kept envelope of an open span: its ring number, clock and offset.
 * `held` is its message while the two are out of the cyclic garbage
 * collector's lists (see entries_append), else NULL. */
typedef struct {
    uint64_t seq;
    uint64_t clock;
    long long begin;
    PyObject *env;
    PyObject *held;
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
    /* Committed envelopes ready to dequeue: out[out_pos:out_n], with clocks,
     * and the messages of those still out of the garbage collector's lists
     * (out_held: see entries_append), else NULL. */
    PyObject **out;
    uint64_t *out_clock;
    PyObject **out_held;
    Py_ssize_t out_n, out_pos, out_cap;
    Replay replay;
    /* The sequence being dequeued: its partial (-1: a message with no
     * clock; -2: forgotten since), the envelope that committed it, and
     * whether that envelope is an ACK_TXN. */
    Py_ssize_t inflight_p;
    PyObject *inflight_env;
    int inflight_ack;
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

/* Give an envelope and its message, held out of the cyclic garbage
 * collector's lists (see entries_append), back to it; releases `held`. */
static inline void
give_back(PyObject *env, PyObject *held)
{
    if (!PyObject_GC_IsTracked(env)) {
        PyObject_GC_Track(env);
    }
    if (!PyObject_GC_IsTracked(held)) {
        PyObject_GC_Track(held);
    }
    Py_DECREF(held);
}

/* Give an entry's envelope back, if it is held: before it leaves the ring
 * in any way but to be handed out by seq_next (which gives it back then). */
static inline void
entry_retrack(Entry *e)
{
    if (e->held != NULL) {
        give_back(e->env, e->held);
        e->held = NULL;
    }
}

static void
entries_clear(Partial *p)
{
    for (Py_ssize_t k = p->head; k < p->len; k++) {
        entry_retrack(&p->entries[k]);
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

/* Keep env in p's open span. With `hold` (its message), the envelope and
 * the message leave the cyclic garbage collector's lists while only the
 * ring holds them: a transaction's messages wait here for its ACK, often a
 * thousand at a time, and, tracked, each would be walked by collection
 * after collection and promoted into the oldest generation, whose full
 * collections then go over the whole heap (a third of a committed read's
 * time with transactions of 1000). Nothing else refers to them yet, and
 * every path by which an entry leaves the ring gives them back first
 * (entry_retrack), so that a cycle made through them later is collected:
 * committed, they wait in `out` still held, and seq_next gives each back
 * as it hands it out (a reader taking turns between journals leaves them
 * there long enough to be promoted, otherwise). */
static int
entries_append(Partial *p, uint64_t seq, uint64_t clock, long long begin, PyObject *env,
               PyObject *hold)
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
    Entry *e = &p->entries[p->len++];
    *e = (Entry){seq, clock, begin, Py_NewRef(env), NULL};
    if (hold != NULL && PyObject_GC_IsTracked(env) && PyObject_GC_IsTracked(hold)) {
        PyObject_GC_UnTrack(env);
        PyObject_GC_UnTrack(hold);
        e->held = Py_NewRef(hold);
    }
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
        if (s->out_held[k] != NULL) {
            give_back(s->out[k], s->out_held[k]);
            s->out_held[k] = NULL;
        }
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
    if (out != NULL) {
        s->out = out;
    }
    uint64_t *clocks = out ? PyMem_Realloc(s->out_clock, cap * sizeof(uint64_t)) : NULL;
    if (clocks != NULL) {
        s->out_clock = clocks;
    }
    PyObject **held = clocks ? PyMem_Realloc(s->out_held, cap * sizeof(PyObject *)) : NULL;
    if (held == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->out_held = held;
    s->out_cap = cap;
    return 0;
}

/* Append to out (the caller reserved room); `held` is a reference to its
 * message if env is held out of the collector's lists (taken over), or NULL. */
static inline void
out_push_held(Sequencer *s, PyObject *env, uint64_t clock, PyObject *held)
{
    s->out[s->out_n] = Py_NewRef(env);
    s->out_clock[s->out_n] = clock;
    s->out_held[s->out_n] = held;
    s->out_n++;
}

static inline void
out_push(Sequencer *s, PyObject *env, uint64_t clock)
{
    out_push_held(s, env, clock, NULL);
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
set_inflight(Sequencer *s, Py_ssize_t p, PyObject *env, int ack)
{
    s->inflight_p = p;
    s->inflight_ack = ack;
    Py_XSETREF(s->inflight_env, Py_NewRef(env));
}

/* True if env, just dequeued, is the ACK_TXN that committed its sequence:
 * a control record, which a reader may leave out. */
static inline int
is_committing_ack(Sequencer *s, PyObject *env)
{
    return s->inflight_ack && env == s->inflight_env;
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
            entry_retrack(&p->entries[p->head]);
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
 * wholly in the ring (held envelopes stay held there until handed out),
 * else as a replay. Its caller then clears p's entries. */
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
            Entry *e = &p->entries[k];
            if (e->clock <= ack) {
                out_push_held(s, e->env, e->clock, e->held); /* still held */
                e->held = NULL;
                emitted = e->clock;
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
            entry_retrack(&p->entries[k]); /* (a replay is rare) */
            r->tail[r->ntail] = p->entries[k];
            Py_INCREF(r->tail[r->ntail].env);
            r->ntail++;
        }
    }
    r->tail[r->ntail++] = (Entry){seq, ack, ack_begin, Py_NewRef(ack_env), NULL};
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
                           long long begin, PyObject **alone);

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
        rc = seq_queue_parts(s, env, msg, spec, begin, NULL);
    }
    Py_XDECREF(msg);
    Py_XDECREF(spec);
    return rc;
}

/* Hand out env, which commits alone: into out, or, if the caller takes
 * such envelopes directly (alone != NULL), as *alone, a new reference (what
 * seq_next would give next, leaving nothing to dequeue). -1 on error. */
static inline int
commit_alone(Sequencer *s, PyObject *env, uint64_t clock, PyObject **alone)
{
    if (alone != NULL) {
        *alone = Py_NewRef(env);
        return 0;
    }
    if (out_reserve(s, 1) < 0) {
        return -1;
    }
    out_push(s, env, clock);
    return 0;
}

/* queue_uncommitted of env, whose message, journal spec and begin offset
 * are given (borrowed): what a reader that made env knows already. With
 * `alone`, an envelope that commits by itself is handed out there instead
 * of queued for seq_next (*alone stays NULL otherwise), and env is the
 * caller's own, made by its reader: kept in a span, it is held untracked
 * (see entries_append). */
static int
seq_queue_parts(Sequencer *s, PyObject *env, PyObject *msg, PyObject *spec, long long begin,
                PyObject **alone)
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
        if (commit_alone(s, env, 0, alone) < 0) {
            return -1;
        }
        s->seq = seq;
        set_inflight(s, -1, env, 0);
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
            COUNTS.duplicates++;
            return 1; /* duplicate: dropped, takes no slot (max_clock >= last_ack) */
        }
        /* A reader's own envelope, which nobody else holds yet, waits
         * outside the garbage collector's lists. */
        if (entries_append(p, seq, clock, begin, env, alone != NULL ? msg : NULL) < 0) {
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
            if (p->begin != -1) {
                COUNTS.rollbacks++; /* an open span discarded */
            }
            else {
                COUNTS.duplicates++; /* an ACK read again */
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
        else if (commit_alone(s, env, clock, alone) < 0) { /* an ACK with no span */
            return -1;
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
            COUNTS.duplicates++;
            return 1; /* duplicate: dropped, takes no slot */
        }
        /* Commits itself; an open span (mixed committed and transactional
         * publishing by one producer) is discarded. */
        if (commit_alone(s, env, clock, alone) < 0) {
            return -1;
        }
    }
    s->seq = seq;
    set_inflight(s, p - s->partials, env, flags == ACK_TXN);
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
            if (s->out_held[s->out_pos] != NULL) {
                give_back(*env, s->out_held[s->out_pos]);
                s->out_held[s->out_pos] = NULL;
            }
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
            Py_VISIT(p->entries[e].held);
        }
    }
    for (Py_ssize_t k = s->out_pos; k < s->out_n; k++) {
        Py_VISIT(s->out[k]);
        Py_VISIT(s->out_held[k]);
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
    PyMem_Free(s->out_held);
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

/* The one-argument methods, by position (the fast way) or by keyword. */
#define ONE_ARG_METHOD(name, arg)                                                          \
    static PyObject *sequencer_##name##_kw(Sequencer *s, PyObject *const *args,           \
                                           Py_ssize_t nargs, PyObject *kwnames)           \
    {                                                                                     \
        if (nargs == 1 && kwnames == NULL) {                                              \
            return sequencer_##name(s, args[0]);                                          \
        }                                                                                 \
        static const char *const names[] = {arg};                                         \
        PyObject *a[1];                                                                   \
        if (bind_args(#name, args, nargs, kwnames, names, 1, a) < 0) {                    \
            return NULL;                                                                  \
        }                                                                                 \
        return sequencer_##name(s, a[0]);                                                 \
    }
ONE_ARG_METHOD(queue_uncommitted, "env")
ONE_ARG_METHOD(start_replay, "it")
ONE_ARG_METHOD(has_pending, "since")
ONE_ARG_METHOD(restore, "states")
#undef ONE_ARG_METHOD

static PyMethodDef sequencer_methods[] = {
    {"queue_uncommitted", (PyCFunction)(void (*)(void))sequencer_queue_uncommitted_kw, METH_FASTCALL | METH_KEYWORDS,
     "queue_uncommitted($self, env)\n--\n\n"
     "Apply the next read-uncommitted envelope: True if it completes a sequence (commits, "
     "or is a duplicate or a roll-back), False if it extends a transaction still pending."},
    {"deque_committed", (PyCFunction)sequencer_deque_committed, METH_NOARGS,
     "deque_committed($self, /)\n--\n\n"
     "The next committed envelope, or None; raises MustStartReplay when the rest of the "
     "sequence must be re-read first."},
    {"replay_range", (PyCFunction)sequencer_replay_range, METH_NOARGS,
     "replay_range($self, /)\n--\n\n[begin, end) offsets of the journal to replay."},
    {"start_replay", (PyCFunction)(void (*)(void))sequencer_start_replay_kw, METH_FASTCALL | METH_KEYWORDS,
     "start_replay($self, it)\n--\n\nRead the envelopes of replay_range() from the given iterable (read-uncommitted)."},
    {"has_pending", (PyCFunction)(void (*)(void))sequencer_has_pending_kw, METH_FASTCALL | METH_KEYWORDS,
     "has_pending($self, since)\n--\n\nTrue if a transaction still open began at or after the offset given for its journal "
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
    {"restore", (PyCFunction)(void (*)(void))sequencer_restore_kw, METH_FASTCALL | METH_KEYWORDS,
     "restore($self, states)\n--\n\n"
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
