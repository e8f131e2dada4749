/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): sequence_columns, the
 * native form of message/_columns_sequencer.py's sequence_columns (the definition).
 *
 * The numpy definition unrolls the Sequencer's state machine into scans over
 * columns grouped by producer; here it runs as a state machine again, one
 * pass over the frames in offset order, with a table of the producers seen:
 * last_ack, the open span's frames (a list threaded through `next`), and
 * where the span opened. The rules are the module docstring's:
 *
 * - a frame with clock 0 commits itself and is never tracked;
 * - an OUTSIDE_TXN frame (or one of unknown flags) commits itself iff its
 *   clock exceeds last_ack, which it becomes; the open span is discarded;
 * - a CONTINUE_TXN frame (or a replayed one, whatever its flags) joins the
 *   span;
 * - an ACK_TXN frame closes the span: if its clock exceeds last_ack, each
 *   span frame whose clock exceeds every clock before it in the span (from
 *   last_ack) and does not exceed the ACK's is committed by the ACK, and the
 *   ACK commits itself unless one of them had its clock; either way (a
 *   roll-back too) last_ack becomes its clock.
 *
 * The states after: last_ack; the open span's begin is kept from before the
 * window if nothing closed a span of the producer in it, else it is the
 * first frame of the last span (not replayed) whose clock exceeds last_ack.
 */

typedef struct {
    uint64_t producer;
    uint64_t last_ack;
    int64_t init_begin; /* the state's begin before the window (-1: none) */
    int64_t open_begin; /* the first frame opening the current span, or -1 */
    Py_ssize_t head, tail; /* the current span's frames: rows linked by next[] */
    int closed; /* a span of the producer was closed in the window */
} SeqSlot;

typedef struct {
    SeqSlot *slots;
    Py_ssize_t n, cap;
    int32_t *table; /* slot index + 1, 0: empty; open addressing */
    size_t mask;
} SeqTable;

static inline size_t
seq_hash(uint64_t p)
{
    p *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(p ^ (p >> 29));
}

static int
seq_table_grow(SeqTable *t)
{
    size_t size = t->table == NULL ? 64 : 2 * (t->mask + 1);
    int32_t *table = PyMem_Calloc(size, sizeof(int32_t));
    if (table == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        size_t h = seq_hash(t->slots[i].producer) & (size - 1);
        while (table[h]) {
            h = (h + 1) & (size - 1);
        }
        table[h] = (int32_t)(i + 1);
    }
    PyMem_Free(t->table);
    t->table = table;
    t->mask = size - 1;
    return 0;
}

/* The slot of producer p, or NULL (and a new one to fill in *fresh). */
static SeqSlot *
seq_slot(SeqTable *t, uint64_t p, int *fresh)
{
    if (t->table == NULL || (size_t)(t->n + 1) * 2 > t->mask + 1) {
        if (seq_table_grow(t) < 0) {
            return NULL;
        }
    }
    size_t h = seq_hash(p) & t->mask;
    for (int32_t at; (at = t->table[h]) != 0; h = (h + 1) & t->mask) {
        if (t->slots[at - 1].producer == p) {
            *fresh = 0;
            return &t->slots[at - 1];
        }
    }
    if (t->n == t->cap) {
        Py_ssize_t cap = t->cap ? 2 * t->cap : 64;
        SeqSlot *slots = PyMem_Realloc(t->slots, (size_t)cap * sizeof(SeqSlot));
        if (slots == NULL) {
            return NULL;
        }
        t->slots = slots;
        t->cap = cap;
    }
    t->table[h] = (int32_t)(t->n + 1);
    SeqSlot *s = &t->slots[t->n++];
    s->producer = p;
    *fresh = 1;
    return s;
}

/* sequence_columns(begin, producers, clocks, flags, replayed, state_producers,
 *                  state_last_ack, state_begin, commit)
 *     -> (producers, last_ack, begin)
 *
 * The frames (n each: int64 begin, uint64 producers and clocks, int32 flags,
 * and replayed, a bool per frame or None) in offset order; the states before
 * them (state_producers sorted, uint64 last_ack, int64 begin). Writes each
 * frame's commit offset (or -1) into commit (n int64), and returns the
 * states after the frames of the producers seen with a clock, in the order
 * first seen, as uint64, uint64 and int64 values laid end to end. */
static PyObject *
sequence_columns(PyObject *module, PyObject *args)
{
    Py_buffer b_begin, b_prod, b_clock, b_flags, b_sp, b_sl, b_sb, b_commit;
    PyObject *replayed_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*y*Oy*y*y*w*:sequence_columns", &b_begin, &b_prod,
                          &b_clock, &b_flags, &replayed_obj, &b_sp, &b_sl, &b_sb,
                          &b_commit)) {
        return NULL;
    }
    Py_buffer b_rep = {0};
    int has_rep = 0;
    PyObject *out = NULL, *o_prod = NULL, *o_last = NULL, *o_begin = NULL;
    SeqTable t = {0};
    Py_ssize_t *next = NULL;
    Py_ssize_t n = b_begin.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t ns = b_sp.len / (Py_ssize_t)sizeof(uint64_t);
    if (replayed_obj != Py_None) {
        if (PyObject_GetBuffer(replayed_obj, &b_rep, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        has_rep = 1;
    }
    if (b_prod.len != n * 8 || b_clock.len != n * 8 || b_flags.len != n * 4
        || b_commit.len != n * 8 || (has_rep && b_rep.len != n) || b_sl.len != ns * 8
        || b_sb.len != ns * 8) {
        PyErr_SetString(PyExc_ValueError, "sequence_columns: buffer sizes do not match");
        goto done;
    }
    const int64_t *begin = b_begin.buf;
    const uint64_t *prod = b_prod.buf, *clock = b_clock.buf;
    const int32_t *flags = b_flags.buf;
    const unsigned char *rep = has_rep ? b_rep.buf : NULL;
    const uint64_t *sp = b_sp.buf, *sl = b_sl.buf;
    const int64_t *sb = b_sb.buf;
    int64_t *commit = b_commit.buf;
    next = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (next == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        uint64_t ck = clock[r];
        commit[r] = -1;
        if (ck == 0) {
            commit[r] = begin[r];
            continue;
        }
        int fresh;
        SeqSlot *s = seq_slot(&t, prod[r], &fresh);
        if (s == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (fresh) {
            /* A known producer's state, or a new one's: last_ack just below
             * the first clock seen. */
            Py_ssize_t lo = 0, hi = ns;
            while (lo < hi) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (sp[mid] < prod[r]) {
                    lo = mid + 1;
                }
                else {
                    hi = mid;
                }
            }
            if (lo < ns && sp[lo] == prod[r]) {
                s->last_ack = sl[lo];
                s->init_begin = sb[lo];
            }
            else {
                s->last_ack = ck - 1;
                s->init_begin = -1;
            }
            s->open_begin = -1;
            s->head = s->tail = -1;
            s->closed = 0;
        }
        int forced = rep != NULL && rep[r];
        int32_t f = flags[r];
        if (forced || f == CONTINUE_TXN) {
            next[r] = -1;
            if (s->tail >= 0) {
                next[s->tail] = r;
            }
            else {
                s->head = r;
            }
            s->tail = r;
            if (!forced && ck > s->last_ack && s->open_begin < 0) {
                s->open_begin = begin[r];
            }
            continue;
        }
        if (f == ACK_TXN) {
            if (ck > s->last_ack) {
                uint64_t prior = s->last_ack;
                int hit = 0;
                for (Py_ssize_t q = s->head; q >= 0; q = next[q]) {
                    uint64_t kc = clock[q];
                    if (kc > prior) {
                        if (kc <= ck) {
                            commit[q] = begin[r];
                            hit |= kc == ck;
                        }
                        prior = kc;
                    }
                }
                if (!hit) {
                    commit[r] = begin[r];
                }
            }
        }
        else if (ck > s->last_ack) {
            commit[r] = begin[r];
        }
        else {
            continue; /* a duplicate: no event */
        }
        s->last_ack = ck;
        s->closed = 1;
        s->head = s->tail = -1;
        s->open_begin = -1;
    }
    o_prod = PyBytes_FromStringAndSize(NULL, t.n * 8);
    o_last = o_prod ? PyBytes_FromStringAndSize(NULL, t.n * 8) : NULL;
    o_begin = o_last ? PyBytes_FromStringAndSize(NULL, t.n * 8) : NULL;
    if (o_begin == NULL) {
        goto done;
    }
    uint64_t *op = (uint64_t *)PyBytes_AS_STRING(o_prod);
    uint64_t *ol = (uint64_t *)PyBytes_AS_STRING(o_last);
    int64_t *ob = (int64_t *)PyBytes_AS_STRING(o_begin);
    for (Py_ssize_t i = 0; i < t.n; i++) {
        const SeqSlot *s = &t.slots[i];
        op[i] = s->producer;
        ol[i] = s->last_ack;
        ob[i] = !s->closed && s->init_begin >= 0 ? s->init_begin : s->open_begin;
    }
    out = PyTuple_Pack(3, o_prod, o_last, o_begin);
done:
    Py_XDECREF(o_prod);
    Py_XDECREF(o_last);
    Py_XDECREF(o_begin);
    PyMem_Free(next);
    PyMem_Free(t.slots);
    PyMem_Free(t.table);
    if (has_rep) {
        PyBuffer_Release(&b_rep);
    }
    PyBuffer_Release(&b_begin);
    PyBuffer_Release(&b_prod);
    PyBuffer_Release(&b_clock);
    PyBuffer_Release(&b_flags);
    PyBuffer_Release(&b_sp);
    PyBuffer_Release(&b_sl);
    PyBuffer_Release(&b_sb);
    PyBuffer_Release(&b_commit);
    return out;
}
