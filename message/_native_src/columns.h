/*
 * Part of message/_native.c, which includes the parts in order as one
 * translation unit (their functions stay static): parse_uuids and format_uuids: UUID columns of the Spark source.
 */

/* -- parse_uuids --------------------------------------------------------- */

/* parse_uuids(data, offsets, hi, lo) -> list of rows not parsed
 *
 * The strings of an Arrow string array (its data buffer, and its n + 1
 * int32 offsets) in the canonical UUID form, as 64-bit halves into the
 * uint64 buffers hi and lo (n items each). Rows whose string is not
 * canonical (or empty: a null) are listed, and left for the caller. */
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
    static const unsigned char pos[32] = {
        0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17,
        19, 20, 21, 22, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35};
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = off[i], e = off[i + 1];
        int ok = e - b == 36 && b >= 0 && e <= data.len;
        if (ok) {
            const unsigned char *p = chars + b;
            ok = p[8] == '-' && p[13] == '-' && p[18] == '-' && p[23] == '-';
            uint64_t vh = 0, vl = 0;
            int bad = 0;
            for (int k = 0; ok && k < 16; k++) {
                int v = HEX[p[pos[k]]];
                bad |= v;
                vh = (vh << 4) | (uint64_t)(v & 0xF);
            }
            for (int k = 16; ok && k < 32; k++) {
                int v = HEX[p[pos[k]]];
                bad |= v;
                vl = (vl << 4) | (uint64_t)(v & 0xF);
            }
            ok = ok && bad >= 0;
            if (ok) {
                h[i] = vh;
                l[i] = vl;
            }
        }
        if (!ok) {
            h[i] = l[i] = 0;
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
    static const char digits[] = "0123456789abcdef";
    const uint64_t *h = (const uint64_t *)hi.buf, *l = (const uint64_t *)lo.buf;
    char *u = PyBytes_AS_STRING(uuids), *p = PyBytes_AS_STRING(producers);
    for (Py_ssize_t i = 0; i < n; i++, u += 36, p += 12) {
        uint64_t vh = h[i], vl = l[i];
        int k = 0;
        for (int d = 0; d < 32; d++) {
            if (d == 8 || d == 12 || d == 16 || d == 20) {
                u[k++] = '-';
            }
            uint64_t v = d < 16 ? vh >> (60 - 4 * d) : vl >> (60 - 4 * (d - 16));
            u[k++] = digits[v & 0xF];
        }
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
