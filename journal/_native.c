/*
 * journal._native: the native core of the journal package.
 *
 * Pending: the appends queued for a journal's writer thread, as
 * journal/_pending.py's PyPending (the definition, whose docstring explains
 * the protocol). Every append of every journal client goes through
 * submit(): here it costs a future, a short lock and two list appends. The
 * future is made as AppendGroup.add of journal/_future.py makes it: an
 * AppendFuture (its type and slots given once to configure_futures) that
 * knows its group and its place there, and nothing else.
 *
 * The lock is held only for a few list operations, never while Python code
 * runs; a thread that finds it taken waits without the GIL.
 *
 * AppendRouter: a client's append() for the common case, straight to the
 * journal's queue (the client's own append method is the definition; see
 * journal/_append_queue.py). track puts an append future, made out of the
 * cyclic garbage collector, back under it once it could be part of a cycle
 * (see journal/_future.py).
 *
 * RecordingAppend and ScanFutures: PendingAppends' hot paths (the
 * definition is journal/_tracking.py): an append that keeps its future, and
 * one pass over a list of futures reading append futures' fields directly.
 *
 * run_io: several file operations of the local store's writer in one call,
 * with one release of the GIL for all of them (the definition, and what
 * each operation does, is journal/_local/iobatch.py's py_run_io).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <structmember.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>
#ifdef _WIN32
#include <windows.h>
#else
#include <errno.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

/* Appends queued beyond this make submit() wait (without the GIL) for the
 * writer thread to take them, up to MAX_WAIT_US in all: see PyPending. */
#define MAX_QUEUED 32768
#define MAX_WAIT_US 2000000
#define WAIT_STEP_US 100

typedef struct {
    PyObject_HEAD
    PyObject *new_group;   /* new_group() -> the AppendGroup of the appends to come */
    PyObject *closed;      /* closed() -> the exception to raise once stopping */
    PyObject *start;       /* start(): start the writer thread */
    PyObject *wake;        /* wake(): wake the idle writer thread */
    PyThread_type_lock lock;
    PyObject *data;        /* list: the appends' bytes */
    PyObject *group;       /* the AppendGroup that makes and resolves their futures */
    long long *ends;       /* where each append of data ends (with configure_futures),
                            * handed to group.ends at take() */
    Py_ssize_t ends_cap;   /* room in ends */
    long long total;       /* the bytes of the appends in data */
    long long taken;       /* appends taken by the writer thread so far */
    int stopping, idle, running;
} Pending;

/*
 * The AppendFuture type of journal/_future.py and where its slots are
 * (configure_futures): submit() makes a group's futures directly, as
 * AppendGroup.add does, and ScanFutures reads them. Without it (a Python
 * whose Future is not laid out as AppendFuture expects), submit() calls
 * the group's add(), and ScanFutures goes through each future's methods.
 */
static PyTypeObject *future_type;
static Py_ssize_t off_group, off_index, off_st, off_res, off_exc;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) {
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY)) {
            off = m->offset;
        }
    }
    Py_DECREF(d);
    if (off < 0) {
        PyErr_Format(PyExc_TypeError, "configure_futures: %s is not a slot", name);
    }
    return off;
}

static PyObject *
configure_futures(PyObject *Py_UNUSED(module), PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure_futures(append_future_type)");
        return NULL;
    }
    Py_ssize_t g = slot_offset(type, "_group"), i = slot_offset(type, "_index"),
               st = slot_offset(type, "_st"), r = slot_offset(type, "_res"),
               e = slot_offset(type, "_exc");
    if (g < 0 || i < 0 || st < 0 || r < 0 || e < 0) {
        return NULL;
    }
    Py_XSETREF(future_type, (PyTypeObject *)Py_NewRef(type));
    off_group = g;
    off_index = i;
    off_st = st;
    off_res = r;
    off_exc = e;
    Py_RETURN_NONE;
}

/* A new AppendFuture, out of the cyclic garbage collector, with no group
 * yet (its slots set by pending_submit, under the queue's lock). */
static PyObject *
new_append_future(void)
{
    PyObject *f = future_type->tp_alloc(future_type, 0);
    if (f == NULL) {
        return NULL;
    }
    if (PyObject_GC_IsTracked(f)) {
        PyObject_GC_UnTrack(f);
    }
    SLOT(f, off_st) = Py_NewRef(Py_None);
    SLOT(f, off_res) = Py_NewRef(Py_None);
    SLOT(f, off_exc) = Py_NewRef(Py_None);
    return f;
}

static PyObject *str_ends, *str_add, *str_frombytes;

static void
lock(Pending *q)
{
    if (!PyThread_acquire_lock(q->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(q->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void
unlock(Pending *q)
{
    PyThread_release_lock(q->lock);
}

/* Sleep WAIT_STEP_US without the GIL. */
static void
nap(void)
{
    Py_BEGIN_ALLOW_THREADS
#ifdef _WIN32
    Sleep(1);
#else
    usleep(WAIT_STEP_US);
#endif
    Py_END_ALLOW_THREADS
}

static PyObject *
pending_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"new_group", "closed", "start", "wake", NULL};
    PyObject *new_group, *closed, *start, *wake;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:Pending", kwlist, &new_group, &closed,
                                     &start, &wake)) {
        return NULL;
    }
    Pending *q = (Pending *)type->tp_alloc(type, 0);
    if (q == NULL) {
        return NULL;
    }
    q->new_group = Py_NewRef(new_group);
    q->closed = Py_NewRef(closed);
    q->start = Py_NewRef(start);
    q->wake = Py_NewRef(wake);
    q->lock = PyThread_allocate_lock();
    q->data = PyList_New(0);
    q->group = PyObject_CallNoArgs(new_group);
    if (q->lock == NULL || q->data == NULL || q->group == NULL) {
        Py_DECREF(q);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    return (PyObject *)q;
}

static int
pending_traverse(Pending *q, visitproc visit, void *arg)
{
    Py_VISIT(q->new_group);
    Py_VISIT(q->closed);
    Py_VISIT(q->start);
    Py_VISIT(q->wake);
    Py_VISIT(q->data);
    Py_VISIT(q->group);
    return 0;
}

static int
pending_clear(Pending *q)
{
    Py_CLEAR(q->new_group);
    Py_CLEAR(q->closed);
    Py_CLEAR(q->start);
    Py_CLEAR(q->wake);
    Py_CLEAR(q->data);
    Py_CLEAR(q->group);
    return 0;
}

static void
pending_dealloc(Pending *q)
{
    PyObject_GC_UnTrack(q);
    pending_clear(q);
    if (q->lock != NULL) {
        PyThread_free_lock(q->lock);
    }
    PyMem_Free(q->ends);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

enum { START = 1, WAKE = 2 };

/* Room for twice as many ends (the queue's lock held). */
static int
grow_ends(Pending *q)
{
    Py_ssize_t cap = q->ends_cap ? 2 * q->ends_cap : 1024;
    long long *ends = PyMem_Realloc(q->ends, (size_t)cap * sizeof(long long));
    if (ends == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    q->ends = ends;
    q->ends_cap = cap;
    return 0;
}

static PyObject *
pending_submit(Pending *q, PyObject *data)
{
    Py_ssize_t size = PyBytes_Check(data) ? PyBytes_GET_SIZE(data) : PyObject_Size(data);
    if (size < 0) {
        return NULL;
    }
    /* Made before the lock is taken: allocating may run the collector. */
    PyObject *future = NULL;
    if (future_type != NULL) {
        future = new_append_future();
        if (future == NULL) {
            return NULL;
        }
    }
    lock(q);
    for (int waited = 0; PyList_GET_SIZE(q->data) >= MAX_QUEUED && q->running
                         && !q->stopping && waited < MAX_WAIT_US; waited += WAIT_STEP_US) {
        unlock(q);
        nap();
        lock(q);
    }
    if (q->stopping) {
        unlock(q);
        Py_XDECREF(future);
        PyObject *exc = PyObject_CallNoArgs(q->closed);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    Py_ssize_t index = PyList_GET_SIZE(q->data);
    if (future != NULL) {
        /* AppendGroup.add, natively: the end goes to the group at take(). */
        PyObject *idx = PyLong_FromSsize_t(index);
        if (idx == NULL || (index == q->ends_cap && grow_ends(q) < 0)) {
            unlock(q);
            Py_XDECREF(idx);
            Py_DECREF(future);
            return NULL;
        }
        q->ends[index] = q->total + size;
        SLOT(future, off_group) = Py_NewRef(q->group);
        SLOT(future, off_index) = idx;
    }
    else {
        /* The group makes the future: Python code run under the lock (no
         * other append of this queue can come in between). */
        PyObject *n = PyLong_FromSsize_t(size);
        future = n != NULL ? PyObject_CallMethodOneArg(q->group, str_add, n) : NULL;
        Py_XDECREF(n);
        if (future == NULL) {
            unlock(q);
            return NULL;
        }
    }
    if (PyList_Append(q->data, data) < 0) {
        /* (Without the append, its end is not counted: ends stays in step
         * with data. A group's add() cannot be undone: the group then
         * holds the end of an append not queued, and offsets after it
         * are off. A list append fails only out of memory.) */
        unlock(q);
        Py_DECREF(future);
        return NULL;
    }
    q->total += size;
    int action = 0;
    if (!q->running) {
        q->running = 1;
        action = START;
    }
    else if (q->idle) {
        q->idle = 0;
        action = WAKE;
    }
    unlock(q);
    if (action != 0) {
        PyObject *res = PyObject_CallNoArgs(action == START ? q->start : q->wake);
        if (res == NULL) {
            if (action == START) {
                lock(q);
                q->running = 0;
                unlock(q);
            }
            Py_DECREF(future);
            return NULL;
        }
        Py_DECREF(res);
    }
    return future;
}

static PyObject *
pending_take(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    Py_ssize_t queued = PyList_GET_SIZE(q->data);
    unlock(q);
    if (queued == 0) {
        /* Nothing queued: no new group. (Only the writer thread takes, so
         * what was queued above is still there below.) */
        PyObject *none = PyList_New(0);
        PyObject *out = none != NULL ? PyTuple_Pack(2, none, Py_None) : NULL;
        Py_XDECREF(none);
        return out;
    }
    PyObject *group = PyObject_CallNoArgs(q->new_group);
    PyObject *data = group != NULL ? PyList_New(0) : NULL;
    if (data == NULL) {
        Py_XDECREF(group);
        return NULL;
    }
    lock(q);
    PyObject *old_data = q->data, *old_group = q->group;
    Py_ssize_t n = PyList_GET_SIZE(old_data);
    /* The taken appends' ends, copied while the lock keeps them still. */
    PyObject *ends = future_type != NULL
        ? PyBytes_FromStringAndSize((const char *)q->ends, n * (Py_ssize_t)sizeof(long long))
        : NULL;
    if (future_type != NULL && ends == NULL) {
        unlock(q);
        Py_DECREF(data);
        Py_DECREF(group);
        return NULL;
    }
    q->data = data;
    q->group = group;
    q->total = 0;
    q->taken += n;
    unlock(q);
    PyObject *out = NULL;
    if (ends != NULL) {
        /* group.ends.frombytes(ends): the group's array of ends. */
        PyObject *arr = PyObject_GetAttr(old_group, str_ends);
        PyObject *res = arr != NULL ? PyObject_CallMethodOneArg(arr, str_frombytes, ends) : NULL;
        Py_XDECREF(arr);
        Py_DECREF(ends);
        if (res == NULL) {
            goto done;
        }
        Py_DECREF(res);
    }
    out = PyTuple_Pack(2, old_data, old_group);
done:
    Py_DECREF(old_data);
    Py_DECREF(old_group);
    return out;
}

static PyObject *
pending_issued(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    long long n = q->taken + PyList_GET_SIZE(q->data);
    unlock(q);
    return PyLong_FromLongLong(n);
}

static PyObject *
pending_begin_idle(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    int idle = PyList_GET_SIZE(q->data) == 0 && !q->stopping;
    if (idle) {
        q->idle = 1;
    }
    unlock(q);
    return PyBool_FromLong(idle);
}

static PyObject *
pending_end_idle(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    q->idle = 0;
    unlock(q);
    Py_RETURN_NONE;
}

static PyObject *
pending_exit(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    int exits = PyList_GET_SIZE(q->data) == 0;
    if (exits) {
        q->running = 0;
    }
    unlock(q);
    return PyBool_FromLong(exits);
}

static PyObject *
pending_stop(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    q->stopping = 1;
    unlock(q);
    Py_RETURN_NONE;
}

static PyObject *
pending_get_stopping(Pending *q, void *closure)
{
    return PyBool_FromLong(q->stopping);
}

static PyObject *
pending_get_running(Pending *q, void *closure)
{
    return PyBool_FromLong(q->running);
}

static PyMethodDef pending_methods[] = {
    {"submit", (PyCFunction)pending_submit, METH_O,
     "submit($self, data, /)\n--\n\nQueue one append: its new future (made as the group's "
     "add())."},
    {"take", (PyCFunction)pending_take, METH_NOARGS,
     "take($self, /)\n--\n\nEverything queued, as (data, group), oldest first; ([], None) if "
     "nothing is."},
    {"issued", (PyCFunction)pending_issued, METH_NOARGS,
     "issued($self, /)\n--\n\nAppends queued so far: taken, and waiting."},
    {"begin_idle", (PyCFunction)pending_begin_idle, METH_NOARGS,
     "begin_idle($self, /)\n--\n\nTrue (and the writer is idle) if nothing is queued."},
    {"end_idle", (PyCFunction)pending_end_idle, METH_NOARGS,
     "end_idle($self, /)\n--\n\nThe writer is no longer idle."},
    {"exit", (PyCFunction)pending_exit, METH_NOARGS,
     "exit($self, /)\n--\n\nTrue if the writer may exit (nothing queued): it then no longer "
     "runs."},
    {"stop", (PyCFunction)pending_stop, METH_NOARGS, "stop($self, /)\n--\n\nNo more appends."},
    {NULL},
};

static PyGetSetDef pending_getset[] = {
    {"stopping", (getter)pending_get_stopping, NULL, "True once stop() was called.", NULL},
    {"running", (getter)pending_get_running, NULL, "True while a writer thread runs.", NULL},
    {NULL},
};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "journal._native.Pending",
    .tp_doc = "Pending(new_group, closed, start, wake)\n--\n\n"
              "The appends queued for a journal's writer thread (the native "
              "implementation of journal/_pending.py).",
    .tp_basicsize = sizeof(Pending),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = pending_new,
    .tp_dealloc = (destructor)pending_dealloc,
    .tp_traverse = (traverseproc)pending_traverse,
    .tp_clear = (inquiry)pending_clear,
    .tp_methods = pending_methods,
    .tp_getset = pending_getset,
};

/*
 * AppendRouter(queues, max_size, slow): a client's append(name, data) for
 * the common case, without Python code: bytes of at most max_size to a
 * journal whose append queue exists (queues: journal -> queue) go straight
 * to that queue's submit(data). Anything else, or a submit that raises, is
 * slow(name, data): the client's own append, which is the definition (and
 * raises the right error).
 */

typedef struct {
    PyObject_HEAD
    PyObject *queues;
    PyObject *slow;
    Py_ssize_t max_size;
    vectorcallfunc vectorcall;
} Router;

static PyObject *str_submit;

static PyObject *
router_vectorcall(Router *r, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 2 && kwnames == NULL && PyBytes_CheckExact(args[1])
        && PyBytes_GET_SIZE(args[1]) <= r->max_size) {
        PyObject *queue = PyDict_GetItemWithError(r->queues, args[0]); /* borrowed */
        if (queue != NULL) {
            PyObject *call_args[2] = {queue, args[1]};
            PyObject *future = PyObject_VectorcallMethod(
                str_submit, call_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (future != NULL) {
                return future;
            }
        }
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                return NULL;
            }
            PyErr_Clear(); /* The slow path decides (and raises the right error). */
        }
    }
    return PyObject_Vectorcall(r->slow, args, nargsf, kwnames);
}

static PyObject *
router_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"queues", "max_size", "slow", NULL};
    PyObject *queues, *slow;
    Py_ssize_t max_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!nO:AppendRouter", kwlist, &PyDict_Type,
                                     &queues, &max_size, &slow)) {
        return NULL;
    }
    Router *r = (Router *)type->tp_alloc(type, 0);
    if (r == NULL) {
        return NULL;
    }
    r->queues = Py_NewRef(queues);
    r->slow = Py_NewRef(slow);
    r->max_size = max_size;
    r->vectorcall = (vectorcallfunc)router_vectorcall;
    return (PyObject *)r;
}

static int
router_traverse(Router *r, visitproc visit, void *arg)
{
    Py_VISIT(r->queues);
    Py_VISIT(r->slow);
    return 0;
}

static int
router_clear(Router *r)
{
    Py_CLEAR(r->queues);
    Py_CLEAR(r->slow);
    return 0;
}

static void
router_dealloc(Router *r)
{
    PyObject_GC_UnTrack(r);
    router_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
router_get_wrapped(Router *r, void *closure)
{
    return Py_NewRef(r->slow);
}

static PyGetSetDef router_getset[] = {
    {"__wrapped__", (getter)router_get_wrapped, NULL, "The append it stands for.", NULL},
    {NULL},
};

static PyTypeObject RouterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "journal._native.AppendRouter",
    .tp_doc = "AppendRouter(queues, max_size, slow)\n--\n\n"
              "A client's append(name, data) for the common case (see "
              "journal/_append_queue.py).",
    .tp_basicsize = sizeof(Router),
    .tp_vectorcall_offset = offsetof(Router, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = router_new,
    .tp_dealloc = (destructor)router_dealloc,
    .tp_traverse = (traverseproc)router_traverse,
    .tp_clear = (inquiry)router_clear,
    .tp_getset = router_getset,
};

/*
 * track(obj): put an object made out of the cyclic garbage collector (an
 * append future, see journal/_future.py) back under it. CPython keeps its
 * own tuples and dicts that hold only atomic values out likewise: an object
 * that cannot be part of a reference cycle need not be gone over by every
 * collection.
 */
static PyObject *
track(PyObject *Py_UNUSED(module), PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
    Py_RETURN_NONE;
}

/*
 * RecordingAppend(append, futures, prune, prune_at): a callable that calls
 * append with its arguments (a client's append(name, data), a Publisher's
 * publish_uncommitted(mapping, msg)) and appends the future it returns to
 * the list futures; once the list holds prune_at futures, prune() is called
 * and returns the next threshold. close(message) ends it: every later call
 * raises RuntimeError(message) without calling append.
 * journal._tracking.Recording is the definition.
 */

typedef struct {
    PyObject_HEAD
    PyObject *append;
    PyObject *futures;
    PyObject *prune;
    Py_ssize_t prune_at;
    PyObject *closed; /* the message of close(), or NULL while open */
    vectorcallfunc vectorcall;
} Recording;

static PyObject *
recording_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Recording *r = (Recording *)self;
    if (r->closed != NULL) {
        PyErr_SetObject(PyExc_RuntimeError, r->closed);
        return NULL;
    }
    PyObject *future = PyObject_Vectorcall(r->append, args, nargsf, kwnames);
    if (future == NULL) {
        return NULL;
    }
    if (PyList_Append(r->futures, future) < 0) {
        Py_DECREF(future);
        return NULL;
    }
    if (PyList_GET_SIZE(r->futures) >= r->prune_at) {
        PyObject *next = PyObject_CallNoArgs(r->prune);
        Py_ssize_t at = next ? PyLong_AsSsize_t(next) : -1;
        Py_XDECREF(next);
        if (at == -1 && PyErr_Occurred()) {
            Py_DECREF(future);
            return NULL;
        }
        r->prune_at = at;
    }
    return future;
}

static PyObject *
recording_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"append", "futures", "prune", "prune_at", NULL};
    PyObject *append, *futures, *prune;
    Py_ssize_t prune_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!On:RecordingAppend", kwlist, &append,
                                     &PyList_Type, &futures, &prune, &prune_at)) {
        return NULL;
    }
    Recording *r = (Recording *)type->tp_alloc(type, 0);
    if (r == NULL) {
        return NULL;
    }
    r->append = Py_NewRef(append);
    r->futures = Py_NewRef(futures);
    r->prune = Py_NewRef(prune);
    r->prune_at = prune_at;
    r->vectorcall = recording_vectorcall;
    return (PyObject *)r;
}

static int
recording_traverse(Recording *r, visitproc visit, void *arg)
{
    Py_VISIT(r->append);
    Py_VISIT(r->futures);
    Py_VISIT(r->prune);
    return 0;
}

static int
recording_clear(Recording *r)
{
    Py_CLEAR(r->append);
    Py_CLEAR(r->futures);
    Py_CLEAR(r->prune);
    Py_CLEAR(r->closed);
    return 0;
}

static PyObject *
recording_close(Recording *r, PyObject *message)
{
    if (!PyUnicode_Check(message)) {
        PyErr_SetString(PyExc_TypeError, "close() takes the message of later calls' error");
        return NULL;
    }
    if (r->closed == NULL) {
        r->closed = Py_NewRef(message);
    }
    Py_RETURN_NONE;
}

static PyObject *
recording_is_closed(Recording *r, void *closure)
{
    return PyBool_FromLong(r->closed != NULL);
}

static PyMethodDef recording_methods[] = {
    {"close", (PyCFunction)recording_close, METH_O,
     "close(message): every later call raises RuntimeError(message)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef recording_getset[] = {
    {"closed", (getter)recording_is_closed, NULL, "True once close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static void
recording_dealloc(Recording *r)
{
    PyObject_GC_UnTrack(r);
    recording_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject RecordingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "journal._native.RecordingAppend",
    .tp_doc = "RecordingAppend(append, futures, prune, prune_at)\n--\n\n"
              "append(name, data) that keeps each future in futures, until "
              "close(message) (see journal/_tracking.py).",
    .tp_methods = recording_methods,
    .tp_getset = recording_getset,
    .tp_basicsize = sizeof(Recording),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Recording, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = recording_new,
    .tp_traverse = (traverseproc)recording_traverse,
    .tp_clear = (inquiry)recording_clear,
    .tp_dealloc = (destructor)recording_dealloc,
};

/*
 * ScanFutures(append_future_type): a callable, scan(futures) -> (error,
 * pending): the first failure among the done futures, in list order, and
 * the futures not done. py_scan_futures of journal/_tracking.py is the
 * definition. An AppendFuture (configure_futures) is read from its slots:
 * its own state once pinned, its group's record before (resolved: how many
 * of the group's appends are done; failed_from: the first that failed).
 * Any other future, a cancelled one, and one of a group's at or past its
 * first failure (which reading pins, with its own copy of the error) goes
 * through done() and exception(0).
 */

typedef struct {
    PyObject_HEAD
    PyObject *type;
    vectorcallfunc vectorcall;
} Scan;

static PyObject *str_exception_method, *str_done, *str_finished, *str_pending, *str_running,
    *str_resolved, *str_failed_from;

/* 1: done (error set to a new reference of its failure, or NULL), 0: not
 * done, -1: a Python error. */
static int
scan_generic(PyObject *f, PyObject **error)
{
    PyObject *done = PyObject_CallMethodNoArgs(f, str_done);
    if (done == NULL) {
        return -1;
    }
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (is_done <= 0) {
        return is_done;
    }
    PyObject *zero = PyLong_FromLong(0);
    PyObject *exc = zero ? PyObject_CallMethodOneArg(f, str_exception_method, zero) : NULL;
    Py_XDECREF(zero);
    if (exc == NULL) {
        /* A cancelled future raises CancelledError: that is its failure. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (type == NULL) {
            return -1;
        }
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) {
            PyException_SetTraceback(value, tb);
        }
        Py_XDECREF(type);
        Py_XDECREF(tb);
        if (value == NULL) {
            return -1;
        }
        *error = value;
        return 1;
    }
    if (exc == Py_None) {
        Py_DECREF(exc);
    }
    else {
        *error = exc;
    }
    return 1;
}

/* What a group says of its appends, read once per group and scan. */
typedef struct {
    PyObject *group; /* borrowed, while the future holding it is */
    Py_ssize_t resolved, failed_from;
} GroupView;

static int
group_view(PyObject *group, GroupView *v)
{
    if (v->group == group) {
        return 0;
    }
    PyObject *r = PyObject_GetAttr(group, str_resolved);
    Py_ssize_t resolved = r != NULL ? PyLong_AsSsize_t(r) : -1;
    Py_XDECREF(r);
    if (resolved == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *f = PyObject_GetAttr(group, str_failed_from);
    Py_ssize_t failed_from = f != NULL ? PyLong_AsSsize_t(f) : -1;
    Py_XDECREF(f);
    if (failed_from == -1 && PyErr_Occurred()) {
        return -1;
    }
    v->group = group;
    v->resolved = resolved;
    v->failed_from = failed_from;
    return 0;
}

/* An AppendFuture read from its slots: as scan_generic, or -2 where it must
 * go through its methods. */
static int
scan_append_future(PyObject *f, GroupView *view, PyObject **error)
{
    PyObject *st = SLOT(f, off_st);
    if (st == NULL) {
        return -2;
    }
    if (st != Py_None) {
        /* Its own state: pinned, or a future of no group. States move
         * forward, each set in one step: read without the Condition. */
        int finished = PyObject_RichCompareBool(st, str_finished, Py_EQ);
        if (finished < 0) {
            return -1;
        }
        if (finished) {
            PyObject *exc = SLOT(f, off_exc);
            if (exc != NULL && exc != Py_None) {
                *error = Py_NewRef(exc);
            }
            return 1;
        }
        int waiting = PyObject_RichCompareBool(st, str_pending, Py_EQ);
        if (waiting == 0) {
            waiting = PyObject_RichCompareBool(st, str_running, Py_EQ);
        }
        if (waiting < 0) {
            return -1;
        }
        return waiting ? 0 : -2; /* cancelled: its failure is CancelledError */
    }
    PyObject *group = SLOT(f, off_group), *idx = SLOT(f, off_index);
    if (group == NULL || idx == NULL || group == Py_None) {
        return -2;
    }
    Py_ssize_t index = PyLong_AsSsize_t(idx);
    if (index == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (group_view(group, view) < 0) {
        return -1;
    }
    if (index >= view->resolved) {
        return 0;
    }
    if (index >= view->failed_from) {
        /* Maybe failed: through its methods, which pin a failed future
         * with its own copy of the error (journal/_future.py). */
        return -2;
    }
    return 1;
}

static PyObject *
scan_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Scan *s = (Scan *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan_futures(futures: list)");
        return NULL;
    }
    PyObject *futures = args[0];
    PyObject *pending = PyList_New(0);
    if (pending == NULL) {
        return NULL;
    }
    int fast = future_type != NULL && s->type == (PyObject *)future_type;
    GroupView view = {NULL, 0, 0};
    PyObject *first = NULL; /* the first failure: a new reference */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(futures); i++) {
        PyObject *f = PyList_GET_ITEM(futures, i);
        Py_INCREF(f);
        int done = -2;
        PyObject *failure = NULL;
        if (fast && (PyObject *)Py_TYPE(f) == s->type) {
            done = scan_append_future(f, &view, &failure);
            if (done == -1) {
                goto fail_f;
            }
        }
        if (done == -2) {
            view.group = NULL; /* (Python code runs: read groups again) */
            done = scan_generic(f, &failure);
            if (done < 0) {
                goto fail_f;
            }
        }
        if (done == 0 && PyList_Append(pending, f) < 0) {
            Py_XDECREF(failure);
            goto fail_f;
        }
        if (failure != NULL) {
            if (first == NULL) {
                first = failure;
            }
            else {
                Py_DECREF(failure);
            }
        }
        Py_DECREF(f);
        continue;
    fail_f:
        Py_DECREF(f);
        Py_XDECREF(first);
        Py_DECREF(pending);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, first ? first : Py_None, pending);
    Py_XDECREF(first);
    Py_DECREF(pending);
    return out;
}

static PyObject *
scan_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"append_future_type", NULL};
    PyObject *ftype;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:ScanFutures", kwlist, &PyType_Type,
                                     &ftype)) {
        return NULL;
    }
    Scan *s = (Scan *)type->tp_alloc(type, 0);
    if (s == NULL) {
        return NULL;
    }
    s->type = Py_NewRef(ftype);
    s->vectorcall = scan_vectorcall;
    return (PyObject *)s;
}

static int
scan_traverse(Scan *s, visitproc visit, void *arg)
{
    Py_VISIT(s->type);
    return 0;
}

static int
scan_clear(Scan *s)
{
    Py_CLEAR(s->type);
    return 0;
}

static void
scan_dealloc(Scan *s)
{
    PyObject_GC_UnTrack(s);
    scan_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyTypeObject ScanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "journal._native.ScanFutures",
    .tp_doc = "ScanFutures(append_future_type)\n--\n\n"
              "scan(futures) -> (first failure or None, futures not done) (see "
              "journal/_tracking.py).",
    .tp_basicsize = sizeof(Scan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Scan, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = scan_new,
    .tp_traverse = (traverseproc)scan_traverse,
    .tp_clear = (inquiry)scan_clear,
    .tp_dealloc = (destructor)scan_dealloc,
};

#ifndef _WIN32
/* The operations of run_io: journal/_local/iobatch.py's IO_* constants. */
enum { IO_PWRITE = 0, IO_FDATASYNC = 1, IO_FLOCK = 2, IO_FSTAT = 3, IO_STAT = 4, IO_PREAD = 5,
       IO_EXPECT_SAME = 6, IO_EXPECT_BYTES = 7, IO_EXPECT_SIZE = 8 };

typedef struct {
    int code;
    int fd;
    int arg;          /* IO_FLOCK: the operation */
    long long pos;    /* IO_PWRITE, IO_PREAD */
    Py_ssize_t size;  /* IO_PREAD: bytes asked for */
    Py_buffer buf;    /* IO_PWRITE: the data */
    int has_buf;
    PyObject *path;   /* IO_STAT: the path, as bytes */
    PyObject *out;    /* IO_PREAD: the bytes read into */
    struct stat st;   /* IO_FSTAT, IO_STAT */
    int found;        /* IO_STAT, IO_FSTAT: 0 if nothing is at the path */
    Py_ssize_t got;   /* IO_PREAD: bytes read */
    Py_ssize_t ref1;  /* checks: the earlier operations they look at */
    Py_ssize_t ref2;
    int passed;       /* checks: whether it held */
} IoOp;

static void
io_release(IoOp *ops, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ops[i].has_buf) {
            PyBuffer_Release(&ops[i].buf);
        }
        Py_XDECREF(ops[i].path);
        Py_XDECREF(ops[i].out);
    }
    PyMem_Free(ops);
}

/* An int argument of an operation tuple. 0, or -1 on error. */
static int
io_int(PyObject *obj, int *out)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "run_io: value out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The index of an earlier operation of one of the codes a and b, for a
 * check at index at. 0, or -1 on error. */
static int
io_ref(PyObject *obj, IoOp *ops, Py_ssize_t at, int a, int b, Py_ssize_t *out)
{
    Py_ssize_t i = PyLong_AsSsize_t(obj);
    if (i == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (i < 0 || i >= at || (ops[i].code != a && ops[i].code != b)) {
        PyErr_SetString(PyExc_ValueError, "run_io: a check of an operation it cannot check");
        return -1;
    }
    *out = i;
    return 0;
}

/* Parse one operation tuple, at index at of ops (the GIL held). 0, or -1
 * on error. */
static int
io_parse(PyObject *item, IoOp *ops, Py_ssize_t at)
{
    IoOp *op = &ops[at];
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2) {
        PyErr_SetString(PyExc_TypeError, "run_io: each operation is a tuple (code, ...)");
        return -1;
    }
    Py_ssize_t len = PyTuple_GET_SIZE(item);
    long code = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
    if (code == -1 && PyErr_Occurred()) {
        return -1;
    }
    static const Py_ssize_t lens[] = {4, 2, 3, 2, 2, 4, 3, 3, 3};
    if (code < IO_PWRITE || code > IO_EXPECT_SIZE || len != lens[code]) {
        PyErr_Format(PyExc_ValueError, "run_io: not an operation: %R", item);
        return -1;
    }
    op->code = (int)code;
    if (code == IO_EXPECT_SAME) {
        return io_ref(PyTuple_GET_ITEM(item, 1), ops, at, IO_STAT, IO_FSTAT, &op->ref1) < 0
            || io_ref(PyTuple_GET_ITEM(item, 2), ops, at, IO_STAT, IO_FSTAT, &op->ref2) < 0 ? -1 : 0;
    }
    if (code == IO_EXPECT_BYTES) {
        if (io_ref(PyTuple_GET_ITEM(item, 1), ops, at, IO_PREAD, IO_PREAD, &op->ref1) < 0
            || PyObject_GetBuffer(PyTuple_GET_ITEM(item, 2), &op->buf, PyBUF_SIMPLE) < 0) {
            return -1;
        }
        op->has_buf = 1;
        return 0;
    }
    if (code == IO_EXPECT_SIZE) {
        if (io_ref(PyTuple_GET_ITEM(item, 1), ops, at, IO_STAT, IO_FSTAT, &op->ref1) < 0) {
            return -1;
        }
        op->pos = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 2));
        return op->pos == -1 && PyErr_Occurred() ? -1 : 0;
    }
    if (code == IO_STAT) {
        return PyUnicode_FSConverter(PyTuple_GET_ITEM(item, 1), &op->path) ? 0 : -1;
    }
    if (io_int(PyTuple_GET_ITEM(item, 1), &op->fd) < 0) {
        return -1;
    }
    if (code == IO_FLOCK) {
        return io_int(PyTuple_GET_ITEM(item, 2), &op->arg);
    }
    if (code == IO_PWRITE || code == IO_PREAD) {
        op->pos = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 3));
        if (op->pos == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (op->pos < 0) {
            PyErr_SetString(PyExc_ValueError, "run_io: negative offset");
            return -1;
        }
    }
    if (code == IO_PWRITE) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 2), &op->buf, PyBUF_SIMPLE) < 0) {
            return -1;
        }
        op->has_buf = 1;
    }
    else if (code == IO_PREAD) {
        op->size = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
        if (op->size == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (op->size < 0) {
            PyErr_SetString(PyExc_ValueError, "run_io: negative size");
            return -1;
        }
        op->out = PyBytes_FromStringAndSize(NULL, op->size);
        if (op->out == NULL) {
            return -1;
        }
    }
    return 0;
}

/* Run op (the GIL released), a check looking at ops. 0, or the errno that
 * failed it. */
static int
io_step(IoOp *op, const IoOp *ops)
{
    int rc;
    switch (op->code) {
    case IO_EXPECT_SAME: {
        const IoOp *a = &ops[op->ref1], *b = &ops[op->ref2];
        op->passed = a->found && b->found && a->st.st_dev == b->st.st_dev
                     && a->st.st_ino == b->st.st_ino;
        return 0;
    }
    case IO_EXPECT_BYTES: {
        const IoOp *r = &ops[op->ref1];
        op->passed = r->got == op->buf.len
                     && memcmp(PyBytes_AS_STRING(r->out), op->buf.buf, (size_t)r->got) == 0;
        return 0;
    }
    case IO_EXPECT_SIZE: {
        const IoOp *r = &ops[op->ref1];
        op->passed = r->found && (long long)r->st.st_size <= op->pos;
        return 0;
    }
    case IO_PWRITE: {
        const char *p = op->buf.buf;
        Py_ssize_t left = op->buf.len;
        off_t at = (off_t)op->pos;
        while (left > 0) {
            ssize_t w = pwrite(op->fd, p, (size_t)left, at);
            if (w < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return errno;
            }
            p += w;
            left -= w;
            at += w;
        }
        return 0;
    }
    case IO_FDATASYNC:
        do {
#ifdef __APPLE__
            rc = fsync(op->fd);
#else
            rc = fdatasync(op->fd);
#endif
        } while (rc < 0 && errno == EINTR);
        return rc < 0 ? errno : 0;
    case IO_FLOCK:
        do {
            rc = flock(op->fd, op->arg);
        } while (rc < 0 && errno == EINTR);
        return rc < 0 ? errno : 0;
    case IO_FSTAT:
        do {
            rc = fstat(op->fd, &op->st);
        } while (rc < 0 && errno == EINTR);
        op->found = rc == 0;
        return rc < 0 ? errno : 0;
    case IO_STAT:
        do {
            rc = stat(PyBytes_AS_STRING(op->path), &op->st);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            if (errno == ENOENT || errno == ENOTDIR) {
                return 0; /* found stays 0 */
            }
            return errno;
        }
        op->found = 1;
        return 0;
    case IO_PREAD: {
        ssize_t r;
        do {
            r = pread(op->fd, PyBytes_AS_STRING(op->out), (size_t)op->size, (off_t)op->pos);
        } while (r < 0 && errno == EINTR);
        if (r < 0) {
            return errno;
        }
        op->got = r;
        return 0;
    }
    }
    return EINVAL;
}

static PyObject *
io_stat_result(const struct stat *st)
{
    return Py_BuildValue("(KKL)", (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                         (long long)st->st_size);
}

static PyObject *
run_io(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "run_io(ops: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    IoOp *ops = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(IoOp));
    if (ops == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (io_parse(PyList_GET_ITEM(arg, i), ops, i) < 0) {
            io_release(ops, n);
            return NULL;
        }
    }
    Py_ssize_t failed = -1, ran = n;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        err = io_step(&ops[i], ops);
        if (err != 0) {
            failed = i;
            break;
        }
        if (ops[i].code >= IO_EXPECT_SAME && !ops[i].passed) {
            ran = i + 1; /* a check that did not hold: stop here */
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed >= 0) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, ops[failed].path);
        io_release(ops, n);
        return NULL;
    }
    PyObject *out = PyList_New(ran);
    if (out == NULL) {
        io_release(ops, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ran; i++) {
        IoOp *op = &ops[i];
        PyObject *res;
        if (op->code >= IO_EXPECT_SAME) {
            res = PyBool_FromLong(op->passed);
        }
        else if (op->code == IO_FSTAT || (op->code == IO_STAT && op->found)) {
            res = io_stat_result(&op->st);
        }
        else if (op->code == IO_PREAD) {
            if (op->got != op->size && _PyBytes_Resize(&op->out, op->got) < 0) {
                op->out = NULL; /* freed by _PyBytes_Resize */
                Py_DECREF(out);
                io_release(ops, n);
                return NULL;
            }
            res = op->out;
            op->out = NULL;
        }
        else {
            res = Py_NewRef(Py_None);
        }
        if (res == NULL) {
            Py_DECREF(out);
            io_release(ops, n);
            return NULL;
        }
        PyList_SET_ITEM(out, i, res);
    }
    io_release(ops, n);
    return out;
}
#endif

static PyMethodDef module_methods[] = {
    {"configure_futures", (PyCFunction)configure_futures, METH_O,
     "configure_futures(append_future_type, /)\n--\n\nMake the futures of Pending.submit as "
     "AppendGroup.add does, and read them in ScanFutures (see journal/_future.py)."},
    {"track", (PyCFunction)track, METH_O,
     "track(obj, /)\n--\n\nPut obj (back) under the cyclic garbage collector."},
#ifndef _WIN32
    {"run_io", (PyCFunction)run_io, METH_O,
     "run_io(ops, /)\n--\n\nRun file operations in order, releasing the GIL once "
     "(see journal/_local/iobatch.py)."},
#endif
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "journal._native",
    .m_doc = "The native core of the journal package (see journal/_pending.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&PendingType) < 0 || PyType_Ready(&RouterType) < 0
        || PyType_Ready(&RecordingType) < 0 || PyType_Ready(&ScanType) < 0) {
        return NULL;
    }
    str_submit = PyUnicode_InternFromString("submit");
    str_ends = PyUnicode_InternFromString("ends");
    str_frombytes = PyUnicode_InternFromString("frombytes");
    str_add = PyUnicode_InternFromString("add");
    str_exception_method = PyUnicode_InternFromString("exception");
    str_done = PyUnicode_InternFromString("done");
    str_finished = PyUnicode_InternFromString("FINISHED");
    str_pending = PyUnicode_InternFromString("PENDING");
    str_running = PyUnicode_InternFromString("RUNNING");
    str_resolved = PyUnicode_InternFromString("resolved");
    str_failed_from = PyUnicode_InternFromString("failed_from");
    if (str_submit == NULL || str_ends == NULL || str_frombytes == NULL || str_add == NULL || str_exception_method == NULL
        || str_done == NULL || str_finished == NULL || str_pending == NULL || str_running == NULL
        || str_resolved == NULL || str_failed_from == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0
        || PyModule_AddObjectRef(m, "AppendRouter", (PyObject *)&RouterType) < 0
        || PyModule_AddObjectRef(m, "RecordingAppend", (PyObject *)&RecordingType) < 0
        || PyModule_AddObjectRef(m, "ScanFutures", (PyObject *)&ScanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
