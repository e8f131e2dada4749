/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): parse_uuids and
 * format_uuids, UUID columns of the Spark source and message.arrow; line_ends,
 * the lines of an NDJSON window of message.arrow.
 */

/* -- parse_uuids --------------------------------------------------------- */

/* parse_uuids(data, offsets, hi, lo) -> list of rows not parsed
 *
 * The strings of an Arrow string array (its data buffer, and its n + 1
 * int32 offsets) in the canonical UUID form, as 64-bit halves into the
 * uint64 buffers hi and lo (n items each). Rows whose string is not
 * canonical are listed, and left for the caller; an empty one (a null, or a
 * document without a UUID) is the nil UUID, and is not listed: a column of
 * them would cost the caller a failed parse per row. */
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
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = off[i], e = off[i + 1];
        int ok = e - b == 36 && b >= 0 && e <= data.len
                 && parse_canonical36(chars + b, &h[i], &l[i]);
        if (!ok) {
            h[i] = l[i] = 0;
            if (e <= b) {
                continue; /* empty: the nil UUID */
            }
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

/* The two lower-case hex digits of each byte value. */
static const char HEX_PAIRS[513] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
    "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"
    "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
    "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
    "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
    "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";

static inline void
hex_byte(char *out, uint64_t v)
{
    memcpy(out, HEX_PAIRS + 2 * (v & 0xFF), 2);
}

/* The canonical 36-character text of the UUID (hi, lo) into out. */
static inline void
format_uuid36(char *u, uint64_t vh, uint64_t vl)
{
    /* 8-4-4-4-12 digits: bytes 0-3, 4-5, 6-7 of hi, then 0-1, 2-7 of lo. */
    hex_byte(u + 0, vh >> 56);
    hex_byte(u + 2, vh >> 48);
    hex_byte(u + 4, vh >> 40);
    hex_byte(u + 6, vh >> 32);
    u[8] = '-';
    hex_byte(u + 9, vh >> 24);
    hex_byte(u + 11, vh >> 16);
    u[13] = '-';
    hex_byte(u + 14, vh >> 8);
    hex_byte(u + 16, vh);
    u[18] = '-';
    hex_byte(u + 19, vl >> 56);
    hex_byte(u + 21, vl >> 48);
    u[23] = '-';
    for (int k = 0; k < 6; k++) {
        hex_byte(u + 24 + 2 * k, vl >> (40 - 8 * k));
    }
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
    const uint64_t *h = (const uint64_t *)hi.buf, *l = (const uint64_t *)lo.buf;
    char *u = PyBytes_AS_STRING(uuids), *p = PyBytes_AS_STRING(producers);
    for (Py_ssize_t i = 0; i < n; i++, u += 36, p += 12) {
        uint64_t vh = h[i], vl = l[i];
        format_uuid36(u, vh, vl);
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

/* envelope_fields(hi, lo, uuids, producers, clocks, flags, micros)
 *
 * What message.arrow's envelope columns hold of n UUIDs given as uint64
 * halves, in one pass, written into the five writable buffers given (the
 * caller's memory: Arrow's pool, say): format_uuids' two texts, and, as
 * values laid end to end, the clocks (int64), the flags (int32) and the
 * publish times in microseconds since the Unix epoch (int64, floored;
 * meaningless where the clock is 0). */
static PyObject *
envelope_fields(PyObject *module, PyObject *args)
{
    Py_buffer hi, lo, o[5];
    if (!PyArg_ParseTuple(args, "y*y*w*w*w*w*w*:envelope_fields", &hi, &lo, &o[0], &o[1],
                          &o[2], &o[3], &o[4])) {
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = hi.len / (Py_ssize_t)sizeof(uint64_t);
    static const Py_ssize_t width[5] = {36, 12, 8, 4, 8};
    int ok = lo.len == hi.len;
    for (int k = 0; k < 5; k++) {
        ok = ok && o[k].len >= n * width[k];
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "envelope_fields: buffer sizes do not match");
        goto done;
    }
    const uint64_t *h = (const uint64_t *)hi.buf, *l = (const uint64_t *)lo.buf;
    char *u = o[0].buf, *p = o[1].buf;
    int64_t *clocks = o[2].buf;
    int32_t *flags = o[3].buf;
    int64_t *micros = o[4].buf;
    for (Py_ssize_t i = 0; i < n; i++, u += 36, p += 12) {
        format_uuid36(u, h[i], l[i]);
        memcpy(p, u + 24, 12);
        uint64_t c = clock_of(h[i], l[i]);
        clocks[i] = (int64_t)c;
        flags[i] = (int32_t)flags_of(l[i]);
        /* 100 ns units since the UUID epoch, to floored microseconds since 1970. */
        int64_t t = (int64_t)(c >> 4) - (int64_t)UUID_EPOCH_OFFSET;
        micros[i] = t >= 0 ? t / 10 : -((-t + 9) / 10);
    }
    out = Py_NewRef(Py_None);
done:
    for (int k = 0; k < 5; k++) {
        PyBuffer_Release(&o[k]);
    }
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return out;
}

/* -- prefixed_uuids ------------------------------------------------------- */

/* The first occurrence of needle (m >= 1 bytes) in [p, end), or NULL. */
static const char *
find_bytes(const char *p, const char *end, const char *needle, size_t m)
{
    if (end - p < (ptrdiff_t)m) {
        return NULL;
    }
#ifdef __GLIBC__
    return memmem(p, (size_t)(end - p), needle, m);
#else
    for (; end - p >= (ptrdiff_t)m; p++) {
        p = memchr(p, needle[0], (size_t)(end - p) - m + 1);
        if (p == NULL || memcmp(p, needle, m) == 0) {
            return p;
        }
    }
    return NULL;
#endif
}

/* prefixed_uuids(data, ends, prefix, suffix, key, hi, lo) -> bool
 *
 * The UUIDs of the lines of data (n of them, ending at ends, n int64) read
 * straight from the bytes, into hi and lo, if every line is laid out as
 * prefix, a canonical UUID, suffix, then ',' or '}'; and if key occurs once
 * per line (in its prefix: no other key of that name) and the bytes '\u'
 * nowhere in data (an escape could spell that key otherwise: any other
 * escape spells no letter). False, with hi and lo undefined, if not. */
static PyObject *
prefixed_uuids(PyObject *module, PyObject *args)
{
    Py_buffer data, ends, prefix, suffix, key, hi, lo;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*w*:prefixed_uuids", &data, &ends, &prefix,
                          &suffix, &key, &hi, &lo)) {
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = ends.len / (Py_ssize_t)sizeof(int64_t);
    if (hi.len != n * 8 || lo.len != n * 8 || key.len < 1) {
        PyErr_SetString(PyExc_ValueError, "prefixed_uuids: buffer sizes do not match");
        goto done;
    }
    const char *base = data.buf, *stop = base + data.len;
    const int64_t *e = ends.buf;
    uint64_t *h = hi.buf, *l = lo.buf;
    Py_ssize_t plen = prefix.len, slen = suffix.len, width = plen + 36 + slen + 1;
    int ok = 1;
    int64_t b = 0;
    for (Py_ssize_t i = 0; ok && i < n; b = e[i++]) {
        const char *p = base + b;
        ok = e[i] - b >= width && e[i] <= data.len && memcmp(p, prefix.buf, (size_t)plen) == 0
             && parse_canonical36((const unsigned char *)p + plen, &h[i], &l[i])
             && memcmp(p + plen + 36, suffix.buf, (size_t)slen) == 0
             && (p[width - 1] == ',' || p[width - 1] == '}');
    }
    Py_ssize_t count = 0;
    for (const char *p = base; ok && (p = find_bytes(p, stop, key.buf, (size_t)key.len)) != NULL;
         p += key.len) {
        ok = ++count <= n;
    }
    ok = ok && count == n;
    for (const char *p = base; ok && (p = memchr(p, '\\', (size_t)(stop - p))) != NULL; p++) {
        ok = p + 1 == stop || p[1] != 'u';
    }
    out = PyBool_FromLong(ok);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&suffix);
    PyBuffer_Release(&key);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return out;
}

/* -- line_ends ------------------------------------------------------------ */

/* line_ends(data) -> bytes
 *
 * The end (relative, just past its '\n') of each line of data, as int64
 * values laid end to end; bytes after the last '\n' are no line: a line as
 * framing/_lines.py defines it (framing.line_ends; the tests hold the two
 * to the same answers). */
static PyObject *
line_ends(PyObject *module, PyObject *arg)
{
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *out = NULL;
    const char *start = (const char *)data.buf, *stop = start + data.len;
    /* One pass, into a buffer that grows (NDJSON lines are rarely short). */
    Py_ssize_t n = 0, cap = data.len / 64 + 16;
    int64_t *ends = PyMem_Malloc((size_t)cap * sizeof(int64_t));
    if (ends == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (const char *p = start; p < stop && (p = memchr(p, '\n', (size_t)(stop - p))) != NULL;
         p++) {
        if (n == cap) {
            cap *= 2;
            int64_t *more = PyMem_Realloc(ends, (size_t)cap * sizeof(int64_t));
            if (more == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            ends = more;
        }
        ends[n++] = (int64_t)(p - start) + 1;
    }
    out = PyBytes_FromStringAndSize((const char *)ends, n * (Py_ssize_t)sizeof(int64_t));
done:
    PyMem_Free(ends);
    PyBuffer_Release(&data);
    return out;
}
