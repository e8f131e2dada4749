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
 * - parse_uuids, format_uuids, envelope_fields, prefixed_uuids, line_ends: columns of the Spark source and of
 *   message.arrow's NDJSON windows.
 * - sequence_columns: message/_columns_sequencer.py's decisions over columns, in one
 *   pass (message.arrow's committed reads).
 * - Mapping: the mapping functions of modulo_mapping and rendezvous_mapping
 *   (message/_mapping.py's closures are the definition).
 *
 * What it takes from Python is handed to configure() once, by
 * message/_core.py: the public classes it builds (Envelope, ProducerState,
 * the errors), the UUID_INT_OF registry, and the small functions both
 * implementations share (the prune horizon, the two log messages). Envelope
 * fields are read and written through the dataclass's own member
 * descriptors, as `env.begin` would; nothing here touches another class's
 * private state.
 *
 * The UUID bit layout (in _native_src/common.inc.c) is message/layout.py's;
 * tests/test_layout.py checks layout() against it.
 *
 * The code is in parts under message/_native_src/, included here in order:
 * one translation unit, so that everything stays static.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <pythread.h>

#include "_native_src/common.inc.c"
#include "_native_src/sequencer.inc.c"
#include "_native_src/reader.inc.c"
#include "_native_src/columns.inc.c"
#include "_native_src/columns_sequencer.inc.c"
#include "_native_src/publisher.inc.c"
#include "_native_src/mapping.inc.c"

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

/* counts() -> the COUNTS fields, in order, as a tuple of ints. */
static PyObject *
counts(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(KKKKKK)", COUNTS.published, COUNTS.begun, COUNTS.committed,
                         COUNTS.rolled_back, COUNTS.duplicates, COUNTS.rollbacks);
}

/* configure(**hooks): what the core takes from Python, once, by name (see
 * message/_core.py): the types and functions of the Sequencer and the
 * readers (core_setup), then of the Publisher (publisher_setup). */
static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"envelope", "producer_state", "must_start_replay", "replay_error",
                             "uuid_int_of", "json_uuid_int", "json_uuid_path", "horizon_units",
                             "warn_unknown_flags", "warn_old_ack", "uuid_type", "safe_unknown",
                             "clock_type", "new_producer_id", "framing_by_content_type",
                             "ack_intent", "json_document", NULL};
    PyTypeObject *env, *uuid_type;
    PyObject *ps, *msr, *rerr, *uio, *jui, *jup, *hu, *wuf, *woa;
    PyObject *safe, *clock, *npi, *fbct, *ack, *jd;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOO!OO!OOOO!OOOOOO:configure", kwlist,
                                     &PyType_Type, &env, &ps, &msr, &rerr, &PyDict_Type, &uio,
                                     &jui, &PyTuple_Type, &jup, &hu, &wuf, &woa, &PyType_Type,
                                     &uuid_type, &safe, &clock, &npi, &fbct, &ack, &jd)) {
        return NULL;
    }
    if (core_setup(env, ps, msr, rerr, uio, jui, jup, hu, wuf, woa) < 0
        || publisher_setup(uuid_type, safe, clock, npi, fbct, ack, jd) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"counts", counts, METH_NOARGS,
     "counts() -> (published, begun, committed, rolled_back, duplicates, rollbacks): what "
     "the native Publishers and Sequencers counted so far (message/_counts.py)."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(**hooks): what the core takes from Python, once, by name (message/_core.py)."},
    {"layout", layout, METH_NOARGS, "The UUID layout constants this module was built with."},
    {"split_uuid", split_uuid, METH_O,
     "split_uuid(i) -> (clock, flags, producer) of a UUID given as its int."},
    {"format_uuids", format_uuids, METH_VARARGS,
     "format_uuids(hi, lo): canonical UUID strings and ProducerID hex strings, "
     "36 and 12 bytes each, of UUIDs given as 64-bit halves."},
    {"parse_uuids", parse_uuids, METH_VARARGS,
     "parse_uuids(data, offsets, hi, lo): canonical UUID strings of an Arrow string "
     "array as 64-bit halves; returns the rows it could not parse."},
    {"sequence_columns", sequence_columns, METH_VARARGS,
     "sequence_columns(begin, producers, clocks, flags, replayed, state_producers, "
     "state_last_ack, state_begin, commit): message/_columns_sequencer.py's sequence_columns in one "
     "pass; returns the states after, as bytes."},
    {"envelope_fields", envelope_fields, METH_VARARGS,
     "envelope_fields(hi, lo, uuids, producers, clocks, flags, micros): format_uuids' "
     "texts, and the clocks, flags and publish times (microseconds) of UUIDs given as "
     "64-bit halves, in one pass, into the writable buffers given."},
    {"prefixed_uuids", prefixed_uuids, METH_VARARGS,
     "prefixed_uuids(data, ends, prefix, suffix, key, hi, lo): the UUIDs of NDJSON lines "
     "that all begin with prefix, a canonical UUID and suffix, read from the bytes; False "
     "if the lines are not all so."},
    {"line_ends", line_ends, METH_O,
     "line_ends(data): the end of each line of data (just past its newline), as int64 "
     "values laid end to end."},
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
    if (PyType_Ready(&SequencerType) < 0 || PyType_Ready(&ReaderType) < 0
        || PyType_Ready(&CommittedType) < 0 || PyType_Ready(&PublisherType) < 0
        || PyType_Ready(&MappingType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Sequencer", (PyObject *)&SequencerType) < 0
        || PyModule_AddObjectRef(m, "EnvelopeReader", (PyObject *)&ReaderType) < 0
        || PyModule_AddObjectRef(m, "CommittedReader", (PyObject *)&CommittedType) < 0
        || PyModule_AddObjectRef(m, "Publisher", (PyObject *)&PublisherType) < 0
        || PyModule_AddObjectRef(m, "Mapping", (PyObject *)&MappingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
