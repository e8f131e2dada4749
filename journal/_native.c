/*
 * journal._native: the native core of the journal package.
 *
 * Pending: the appends queued for a journal's writer thread, as
 * journal/_pending.py's PyPending (the definition, whose docstring explains
 * the protocol). Every append of every journal client goes through
 * submit(): here it costs a future, a short lock and two list appends.
 *
 * The lock is held only for a few list operations, never while Python code
 * runs; a thread that finds it taken waits without the GIL.
 *
 * AppendRouter: a client's append() for the common case, straight to the
 * journal's queue (the client's own append method is the definition; see
 * journal/_append_queue.py). make_untracked, track and append_results keep
 * append futures and their results out of the cyclic garbage collector
 * until they could be part of a cycle (see journal/_future.py).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stddef.h>
#ifdef _WIN32
#include <windows.h>
#else
#include <unistd.h>
#endif

/* Appends queued beyond this make submit() wait (without the GIL) for the
 * writer thread to take them, up to MAX_WAIT_US in all: see PyPending. */
#define MAX_QUEUED 32768
#define MAX_WAIT_US 2000000
#define WAIT_STEP_US 100

typedef struct {
    PyObject_HEAD
    PyObject *future_type; /* future_type() -> a new future */
    PyObject *closed;      /* closed() -> the exception to raise once stopping */
    PyObject *start;       /* start(): start the writer thread */
    PyObject *wake;        /* wake(): wake the idle writer thread */
    PyThread_type_lock lock;
    PyObject *data;        /* list: the appends' bytes */
    PyObject *futures;     /* list: their futures, in step */
    long long taken;       /* appends taken by the writer thread so far */
    int stopping, idle, running;
} Pending;

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
    static char *kwlist[] = {"future_type", "closed", "start", "wake", NULL};
    PyObject *future_type, *closed, *start, *wake;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:Pending", kwlist, &future_type, &closed,
                                     &start, &wake)) {
        return NULL;
    }
    Pending *q = (Pending *)type->tp_alloc(type, 0);
    if (q == NULL) {
        return NULL;
    }
    q->future_type = Py_NewRef(future_type);
    q->closed = Py_NewRef(closed);
    q->start = Py_NewRef(start);
    q->wake = Py_NewRef(wake);
    q->lock = PyThread_allocate_lock();
    q->data = PyList_New(0);
    q->futures = PyList_New(0);
    if (q->lock == NULL || q->data == NULL || q->futures == NULL) {
        Py_DECREF(q);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    return (PyObject *)q;
}

static int
pending_traverse(Pending *q, visitproc visit, void *arg)
{
    Py_VISIT(q->future_type);
    Py_VISIT(q->closed);
    Py_VISIT(q->start);
    Py_VISIT(q->wake);
    Py_VISIT(q->data);
    Py_VISIT(q->futures);
    return 0;
}

static int
pending_clear(Pending *q)
{
    Py_CLEAR(q->future_type);
    Py_CLEAR(q->closed);
    Py_CLEAR(q->start);
    Py_CLEAR(q->wake);
    Py_CLEAR(q->data);
    Py_CLEAR(q->futures);
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
    Py_TYPE(q)->tp_free((PyObject *)q);
}

enum { START = 1, WAKE = 2 };

static PyObject *
pending_submit(Pending *q, PyObject *data)
{
    PyObject *future = PyObject_CallNoArgs(q->future_type);
    if (future == NULL) {
        return NULL;
    }
    lock(q);
    for (int waited = 0; PyList_GET_SIZE(q->futures) >= MAX_QUEUED && q->running
                         && !q->stopping && waited < MAX_WAIT_US; waited += WAIT_STEP_US) {
        unlock(q);
        nap();
        lock(q);
    }
    if (q->stopping) {
        unlock(q);
        Py_DECREF(future);
        PyObject *exc = PyObject_CallNoArgs(q->closed);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    if (PyList_Append(q->data, data) < 0) {
        unlock(q);
        Py_DECREF(future);
        return NULL;
    }
    if (PyList_Append(q->futures, future) < 0) {
        /* Keep the lists in step. */
        PyList_SetSlice(q->data, PyList_GET_SIZE(q->data) - 1, PyList_GET_SIZE(q->data), NULL);
        unlock(q);
        Py_DECREF(future);
        return NULL;
    }
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
    PyObject *data = PyList_New(0);
    PyObject *futures = data ? PyList_New(0) : NULL;
    if (futures == NULL) {
        Py_XDECREF(data);
        return NULL;
    }
    lock(q);
    PyObject *old_data = q->data, *old_futures = q->futures;
    q->data = data;
    q->futures = futures;
    q->taken += PyList_GET_SIZE(old_futures);
    unlock(q);
    PyObject *out = PyTuple_Pack(2, old_data, old_futures);
    Py_DECREF(old_data);
    Py_DECREF(old_futures);
    return out;
}

static PyObject *
pending_issued(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    long long n = q->taken + PyList_GET_SIZE(q->futures);
    unlock(q);
    return PyLong_FromLongLong(n);
}

static PyObject *
pending_begin_idle(Pending *q, PyObject *Py_UNUSED(ignored))
{
    lock(q);
    int idle = PyList_GET_SIZE(q->futures) == 0 && !q->stopping;
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
    int exits = PyList_GET_SIZE(q->futures) == 0;
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
     "submit($self, data, /)\n--\n\nQueue one append: its new future."},
    {"take", (PyCFunction)pending_take, METH_NOARGS,
     "take($self, /)\n--\n\nEverything queued, as (data, futures), oldest first."},
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
    .tp_doc = "Pending(future_type, closed, start, wake)\n--\n\n"
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
 * Futures out of the cyclic garbage collector (see journal/_future.py).
 *
 * make_untracked(cls)() is cls() taken out of the collector's lists;
 * track(obj) puts an object back. CPython does the same for its own tuples
 * and dicts that hold only atomic values: an object that cannot be part of
 * a reference cycle need not be gone over by every collection.
 */

static PyObject *
new_untracked(PyObject *cls, PyObject *Py_UNUSED(ignored))
{
    PyObject *obj = PyObject_CallNoArgs(cls);
    if (obj != NULL && PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    return obj;
}

static PyMethodDef new_untracked_def = {
    "new_untracked", (PyCFunction)new_untracked, METH_NOARGS,
    "A new instance of the class, out of the cyclic garbage collector.",
};

static PyObject *
make_untracked(PyObject *Py_UNUSED(module), PyObject *cls)
{
    return PyCFunction_New(&new_untracked_def, cls);
}

static PyObject *
track(PyObject *Py_UNUSED(module), PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
    Py_RETURN_NONE;
}

/*
 * append_results(cls, journal, begin, data): batch_results of
 * journal/_append_queue.py, the result of each append of data landed in
 * order from begin, as instances of cls (AppendResult, a tuple). Like the
 * futures they resolve, they are kept out of the cyclic garbage collector:
 * a string and two integers cannot form a cycle.
 */
static PyObject *
append_results(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append_results(cls, journal, begin, data)");
        return NULL;
    }
    PyObject *cls = args[0], *journal = args[1], *data = args[3];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "append_results: cls must be a tuple type");
        return NULL;
    }
    if (!PyList_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "append_results: data must be a list");
        return NULL;
    }
    long long offset = PyLong_AsLongLong(args[2]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t n = PyList_GET_SIZE(data);
    PyObject *out = PyList_New(n);
    PyObject *begin = out ? PyLong_FromLongLong(offset) : NULL;
    if (begin == NULL) {
        Py_XDECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(data, i);
        Py_ssize_t size = PyBytes_Check(item) ? PyBytes_GET_SIZE(item) : PyObject_Size(item);
        if (size < 0) {
            goto fail;
        }
        offset += size;
        PyObject *end = PyLong_FromLongLong(offset);
        if (end == NULL) {
            goto fail;
        }
        PyObject *res = type->tp_alloc(type, 3);
        if (res == NULL) {
            Py_DECREF(end);
            goto fail;
        }
        PyTuple_SET_ITEM(res, 0, Py_NewRef(journal));
        PyTuple_SET_ITEM(res, 1, begin); /* This result's reference. */
        PyTuple_SET_ITEM(res, 2, Py_NewRef(end));
        if (PyObject_GC_IsTracked(res)) {
            PyObject_GC_UnTrack(res);
        }
        PyList_SET_ITEM(out, i, res);
        begin = end; /* The next result begins where this one ends. */
    }
    Py_DECREF(begin);
    return out;
fail:
    Py_DECREF(begin);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"append_results", (PyCFunction)(void (*)(void))append_results, METH_FASTCALL,
     "append_results(cls, journal, begin, data, /)\n--\n\nThe result of each append of data "
     "landed in order from begin (see journal/_append_queue.py)."},
    {"make_untracked", (PyCFunction)make_untracked, METH_O,
     "make_untracked(cls, /)\n--\n\nA function making instances of cls out of the cyclic "
     "garbage collector."},
    {"track", (PyCFunction)track, METH_O,
     "track(obj, /)\n--\n\nPut obj (back) under the cyclic garbage collector."},
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
    if (PyType_Ready(&PendingType) < 0 || PyType_Ready(&RouterType) < 0) {
        return NULL;
    }
    str_submit = PyUnicode_InternFromString("submit");
    if (str_submit == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0
        || PyModule_AddObjectRef(m, "AppendRouter", (PyObject *)&RouterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
