/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): Mapping, the mapping
 * functions of modulo_mapping and rendezvous_mapping.
 *
 * message/_mapping.py's closures are the definition; this does the same per
 * message without a Python frame of its own:
 *
 *   Mapping(key, partitions, of, hash, hash_args, rendezvous, remake)
 *
 * - partitions() is called for every message; while it returns the very
 *   object seen last, of the same length, the routes and name hashes
 *   derived from it are reused, else of(parts) derives them (a
 *   _Partitions' of: (parts, routes, name hashes), or it raises).
 * - the key is key(msg), made bytes as the closures do (str: UTF-8, else
 *   bytes(k)), and hashed by hash(data, *hash_args) (mmh3.hash(data, 0,
 *   False), or fnv1a_32(data)).
 * - modulo: routes[h % len(routes)]; rendezvous: the route of the first
 *   partition with the strictly largest h ^ (its name's hash), the first one
 *   if none is above 0.
 * - pickled, it is made again by remake(key, partitions).
 */

typedef struct {
    PyObject_HEAD
    PyObject *key, *partitions, *of, *hash, *hash_args, *remake;
    int rendezvous;
    PyObject *parts;  /* the partitions object routes were derived from (or NULL) */
    PyObject *routes; /* list of (name, content type) tuples */
    uint64_t *name_hashes;
    vectorcallfunc vectorcall;
} Mapping;

/* Derive the routes (and name hashes) of parts through of(parts). */
static int
mapping_derive(Mapping *m, PyObject *parts)
{
    PyObject *entry = PyObject_CallOneArg(m->of, parts);
    if (entry == NULL) {
        return -1;
    }
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
        PyErr_SetString(PyExc_TypeError, "of(parts) must give (parts, routes, name hashes)");
        Py_DECREF(entry);
        return -1;
    }
    PyObject *routes = PySequence_List(PyTuple_GET_ITEM(entry, 1));
    PyObject *hashes = routes ? PySequence_Fast(PyTuple_GET_ITEM(entry, 2), "name hashes")
                              : NULL;
    Py_DECREF(entry);
    if (hashes == NULL) {
        Py_XDECREF(routes);
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(routes);
    uint64_t *name_hashes = NULL;
    if (PySequence_Fast_GET_SIZE(hashes) != n || n == 0) {
        PyErr_SetString(PyExc_ValueError, "of(parts): routes and name hashes differ in number");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(routes, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
            PyErr_Format(PyExc_TypeError, "a route is (journal, content type), not %.100R", r);
            goto fail;
        }
    }
    name_hashes = PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
    if (name_hashes == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        name_hashes[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(hashes, i));
        if (name_hashes[i] == (uint64_t)-1 && PyErr_Occurred()) {
            goto fail;
        }
    }
    Py_DECREF(hashes);
    /* All three replaced before anything is released: releasing may run
     * Python code (and another thread), which must find them consistent. */
    PyObject *old_parts = m->parts, *old_routes = m->routes;
    uint64_t *old_hashes = m->name_hashes;
    m->parts = Py_NewRef(parts);
    m->routes = routes;
    m->name_hashes = name_hashes;
    PyMem_Free(old_hashes);
    Py_XDECREF(old_parts);
    Py_XDECREF(old_routes);
    return 0;
fail:
    PyMem_Free(name_hashes);
    Py_DECREF(routes);
    Py_DECREF(hashes);
    return -1;
}

/* hash(bytes of key(msg), *hash_args), as an unsigned integer. */
static int
mapping_hash_key(Mapping *m, PyObject *msg, uint64_t *out)
{
    PyObject *k = PyObject_CallOneArg(m->key, msg);
    if (k == NULL) {
        return -1;
    }
    PyObject *data;
    if (PyUnicode_Check(k)) {
        data = PyUnicode_AsUTF8String(k);
    }
    else if (PyBytes_CheckExact(k)) {
        data = Py_NewRef(k);
    }
    else {
        data = PyObject_CallOneArg((PyObject *)&PyBytes_Type, k);
    }
    Py_DECREF(k);
    if (data == NULL) {
        return -1;
    }
    PyObject *args[4] = {NULL, data};
    Py_ssize_t extra = PyTuple_GET_SIZE(m->hash_args);
    for (Py_ssize_t i = 0; i < extra; i++) {
        args[2 + i] = PyTuple_GET_ITEM(m->hash_args, i);
    }
    PyObject *h = PyObject_Vectorcall(m->hash, args + 1,
                                      (size_t)(1 + extra) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                      NULL);
    Py_DECREF(data);
    if (h == NULL) {
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(h);
    Py_DECREF(h);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *
mapping_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Mapping *m = (Mapping *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "mapping(msg) takes one argument");
        return NULL;
    }
    PyObject *parts = PyObject_CallNoArgs(m->partitions);
    if (parts == NULL) {
        return NULL;
    }
    /* A list grown or shrunk in place is seen too. */
    Py_ssize_t len = PyList_CheckExact(parts) ? PyList_GET_SIZE(parts) : PyObject_Length(parts);
    int stale = len < 0 || parts != m->parts || len != PyList_GET_SIZE(m->routes);
    if (len < 0) {
        PyErr_Clear(); /* of(parts) says what is wrong with it */
    }
    int rc = stale ? mapping_derive(m, parts) : 0;
    Py_DECREF(parts);
    uint64_t h;
    if (rc < 0 || mapping_hash_key(m, args[0], &h) < 0) {
        return NULL;
    }
    /* The routes are m's: a call made by key() or hash() above may have
     * replaced them, never freed them from under this one. */
    PyObject *routes = m->routes;
    Py_ssize_t n = PyList_GET_SIZE(routes);
    Py_ssize_t index = 0;
    if (!m->rendezvous) {
        index = (Py_ssize_t)(h % (uint64_t)n);
    }
    else {
        uint64_t best = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t w = h ^ m->name_hashes[i];
            if (w > best) {
                best = w;
                index = i;
            }
        }
    }
    return Py_NewRef(PyList_GET_ITEM(routes, index));
}

static PyObject *
mapping_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "partitions", "of", "hash", "hash_args", "rendezvous",
                             "remake", NULL};
    PyObject *key, *partitions, *of, *hash, *hash_args, *remake;
    int rendezvous;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO!pO:Mapping", kwlist, &key,
                                     &partitions, &of, &hash, &PyTuple_Type, &hash_args,
                                     &rendezvous, &remake)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(hash_args) > 2) {
        PyErr_SetString(PyExc_ValueError, "Mapping: at most two hash_args");
        return NULL;
    }
    Mapping *m = (Mapping *)type->tp_alloc(type, 0);
    if (m == NULL) {
        return NULL;
    }
    m->key = Py_NewRef(key);
    m->partitions = Py_NewRef(partitions);
    m->of = Py_NewRef(of);
    m->hash = Py_NewRef(hash);
    m->hash_args = Py_NewRef(hash_args);
    m->remake = Py_NewRef(remake);
    m->rendezvous = rendezvous;
    m->parts = NULL;
    m->routes = PyList_New(0);
    m->name_hashes = NULL;
    m->vectorcall = mapping_vectorcall;
    if (m->routes == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    return (PyObject *)m;
}

static PyObject *
mapping_reduce(Mapping *m, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("O(OO)", m->remake, m->key, m->partitions);
}

static int
mapping_traverse(Mapping *m, visitproc visit, void *arg)
{
    Py_VISIT(m->key);
    Py_VISIT(m->partitions);
    Py_VISIT(m->of);
    Py_VISIT(m->hash);
    Py_VISIT(m->hash_args);
    Py_VISIT(m->remake);
    Py_VISIT(m->parts);
    Py_VISIT(m->routes);
    return 0;
}

static int
mapping_clear(Mapping *m)
{
    Py_CLEAR(m->key);
    Py_CLEAR(m->partitions);
    Py_CLEAR(m->of);
    Py_CLEAR(m->hash);
    Py_CLEAR(m->hash_args);
    Py_CLEAR(m->remake);
    Py_CLEAR(m->parts);
    Py_CLEAR(m->routes);
    return 0;
}

static void
mapping_dealloc(Mapping *m)
{
    PyObject_GC_UnTrack(m);
    mapping_clear(m);
    PyMem_Free(m->name_hashes);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyMethodDef mapping_methods[] = {
    {"__reduce__", (PyCFunction)mapping_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "message._native.Mapping",
    .tp_doc = "Mapping(key, partitions, of, hash, hash_args, rendezvous, remake)\n--\n\n"
              "The mapping function of modulo_mapping or rendezvous_mapping (see "
              "message/_mapping.py): mapping(msg) -> (journal, content type).",
    .tp_basicsize = sizeof(Mapping),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Mapping, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = mapping_new,
    .tp_methods = mapping_methods,
    .tp_traverse = (traverseproc)mapping_traverse,
    .tp_clear = (inquiry)mapping_clear,
    .tp_dealloc = (destructor)mapping_dealloc,
};
