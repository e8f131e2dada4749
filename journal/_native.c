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
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
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

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "journal._native",
    .m_doc = "The native core of the journal package (see journal/_pending.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&PendingType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
