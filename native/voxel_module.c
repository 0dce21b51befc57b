/*
 * voxel_module.c - bridge.decimate._native: the CPython glue around the CPU kernel.
 *
 * Only argument conversion lives here: the buffer protocol for the points (zero copy), a
 * field table from a sequence of (offset, type, role) tuples, the GIL released around the
 * kernel, and kernel status codes mapped to Python exceptions
 * (SBV_EINVAL -> ValueError, SBV_EOVERFLOW -> OverflowError, SBV_ENOMEM -> MemoryError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <unistd.h>

#include "simbridge_voxel.h"

static int parse_fields(PyObject *seq_obj, sbv_field *fields, size_t *n_fields) {
    PyObject *seq = PySequence_Fast(seq_obj, "fields must be a sequence of (offset, type, role)");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 3 || n > SBV_MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "need 3..%d fields, got %zd", SBV_MAX_FIELDS, n);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        unsigned long offset, type, role;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "kkk", &offset, &type, &role)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "field %zd must be a tuple (offset, type, role) of ints", i);
            }
            Py_DECREF(seq);
            return -1;
        }
        if (offset > UINT32_MAX || type > UINT32_MAX || role > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "field %zd has an out-of-range value", i);
            Py_DECREF(seq);
            return -1;
        }
        fields[i] = (sbv_field){(uint32_t)offset, (uint32_t)type, (uint32_t)role};
    }
    *n_fields = (size_t)n;
    Py_DECREF(seq);
    return 0;
}

PyDoc_STRVAR(downsample_doc,
"downsample(data, stride, fields, voxel_size, threads=1) -> (bytes, int)\n\n"
"Voxel-downsample packed points (see native/simbridge_voxel.h). fields is a sequence\n"
"of (offset, type, role); the GIL is released while the kernel runs.");

static PyObject *py_downsample(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "stride", "fields", "voxel_size", "threads", NULL};
    Py_buffer view;
    Py_ssize_t stride;
    PyObject *fields_obj;
    double voxel_size;
    int threads = 1;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nOd|i:downsample", kwlist, &view, &stride,
                                     &fields_obj, &voxel_size, &threads))
        return NULL;
    PyObject *out = NULL;
    sbv_field fields[SBV_MAX_FIELDS];
    size_t n_fields = 0;
    if (stride <= 0) {
        PyErr_Format(PyExc_ValueError, "stride must be > 0, got %zd", stride);
        goto done;
    }
    if (threads < 1) {
        PyErr_Format(PyExc_ValueError, "threads must be >= 1, got %d", threads);
        goto done;
    }
    if (view.len % stride) {
        PyErr_Format(PyExc_ValueError, "data length %zd is not a multiple of stride %zd", view.len, stride);
        goto done;
    }
    if (parse_fields(fields_obj, fields, &n_fields) < 0) goto done;
    size_t points = (size_t)(view.len / stride);
    out = PyBytes_FromStringAndSize(NULL, view.len);
    if (!out) goto done;
    sbv_cloud cloud = {view.buf, points, (size_t)stride, fields, n_fields};
    size_t written = 0;
    char err[256];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sbv_downsample_cpu(&cloud, voxel_size, threads, PyBytes_AS_STRING(out), points, &written,
                            err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != SBV_OK) {
        Py_CLEAR(out);
        PyObject *type = rc == SBV_EOVERFLOW ? PyExc_OverflowError
                         : rc == SBV_ENOMEM  ? PyExc_MemoryError
                                             : PyExc_ValueError;
        PyErr_SetString(type, err[0] ? err : "voxel kernel failed");
        goto done;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(written * (size_t)stride)) < 0) goto done;
    PyObject *result = Py_BuildValue("(Nn)", out, (Py_ssize_t)written);
    out = result;
done:
    PyBuffer_Release(&view);
    return out;
}

PyDoc_STRVAR(downsample_into_doc,
"downsample_into(data, stride, fields, voxel_size, out, threads=1) -> int\n\n"
"Like downsample, but writes the records into the writable buffer out (at least as many\n"
"bytes as data) and returns the record count: no allocation, no copy of the output.");

static PyObject *py_downsample_into(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "stride", "fields", "voxel_size", "out", "threads", NULL};
    Py_buffer view, outv;
    Py_ssize_t stride;
    PyObject *fields_obj;
    double voxel_size;
    int threads = 1;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nOdw*|i:downsample_into", kwlist, &view,
                                     &stride, &fields_obj, &voxel_size, &outv, &threads))
        return NULL;
    PyObject *result = NULL;
    sbv_field fields[SBV_MAX_FIELDS];
    size_t n_fields = 0;
    if (stride <= 0 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "stride and threads must be > 0 (got %zd, %d)", stride, threads);
        goto done;
    }
    if (view.len % stride) {
        PyErr_Format(PyExc_ValueError, "data length %zd is not a multiple of stride %zd", view.len, stride);
        goto done;
    }
    if (outv.len < view.len) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, needs at least %zd", outv.len, view.len);
        goto done;
    }
    if (parse_fields(fields_obj, fields, &n_fields) < 0) goto done;
    size_t points = (size_t)(view.len / stride);
    sbv_cloud cloud = {view.buf, points, (size_t)stride, fields, n_fields};
    size_t written = 0;
    char err[256];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sbv_downsample_cpu(&cloud, voxel_size, threads, outv.buf, points, &written, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != SBV_OK) {
        PyObject *type = rc == SBV_EOVERFLOW ? PyExc_OverflowError
                         : rc == SBV_ENOMEM  ? PyExc_MemoryError
                                             : PyExc_ValueError;
        PyErr_SetString(type, err[0] ? err : "voxel kernel failed");
        goto done;
    }
    result = PyLong_FromSize_t(written);
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&outv);
    return result;
}

static PyObject *py_cpu_count(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return PyLong_FromLong(n > 0 ? n : 1);
}

static PyObject *py_release_scratch(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    sbv_release_scratch();
    Py_RETURN_NONE;
}

static PyObject *py_scratch_keep(PyObject *self, PyObject *args) {
    PyObject *arg = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "|O:scratch_keep", &arg)) return NULL;
    size_t bytes = SIZE_MAX;
    if (arg != Py_None) {
        bytes = PyLong_AsSize_t(arg);
        if (bytes == (size_t)-1 && PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "scratch_keep takes a byte count >= 0 or None");
            return NULL;
        }
    }
    return PyLong_FromSize_t(sbv_scratch_keep(bytes));
}

static PyObject *py_hash_voxels_max(PyObject *self, PyObject *args) {
    PyObject *arg = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "|O:hash_voxels_max", &arg)) return NULL;
    size_t voxels = SIZE_MAX;
    if (arg != Py_None) {
        voxels = PyLong_AsSize_t(arg);
        if ((voxels == (size_t)-1 && PyErr_Occurred()) || voxels == SIZE_MAX) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "hash_voxels_max takes a voxel count >= 0 or None");
            return NULL;
        }
    }
    return PyLong_FromSize_t(sbv_hash_voxels_max(voxels));
}

static PyObject *py_frame_guesses(PyObject *self, PyObject *args) {
    (void)self;
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p:frame_guesses", &reset)) return NULL;
    size_t guessed = 0, missed = 0;
    sbv_frame_guesses(&guessed, &missed, reset);
    return Py_BuildValue("(nn)", (Py_ssize_t)guessed, (Py_ssize_t)missed);
}

static PyMethodDef methods[] = {
    {"downsample", (PyCFunction)(void (*)(void))py_downsample, METH_VARARGS | METH_KEYWORDS, downsample_doc},
    {"downsample_into", (PyCFunction)(void (*)(void))py_downsample_into, METH_VARARGS | METH_KEYWORDS,
     downsample_into_doc},
    {"release_scratch", py_release_scratch, METH_NOARGS,
     "Free the calling thread's cached kernel scratch memory (kept between calls otherwise)."},
    {"scratch_keep", py_scratch_keep, METH_VARARGS,
     "scratch_keep(bytes=None) -> int: set the per-thread cached scratch limit; returns the old one."},
    {"hash_voxels_max", py_hash_voxels_max, METH_VARARGS,
     "hash_voxels_max(voxels=None) -> int: set the one-thread hash path's voxel limit (0: off); "
     "returns the old one. Same output either way: for tests and tuning."},
    {"frame_guesses", py_frame_guesses, METH_VARARGS,
     "frame_guesses(reset=False) -> (guessed, missed): this thread's calls that skipped the bounds "
     "pass with a key frame guessed from a sample, and those where a point fell outside it; reset "
     "clears the back-off after misses. For tests."},
    {"cpu_count", py_cpu_count, METH_NOARGS, "Online CPUs (a default for the kernel's threads)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bridge.decimate._native",
    "CPU voxel-grid decimation kernel (native/voxel_cpu.c); see bridge.decimate.native.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ABI_VERSION", sbv_abi_version()) < 0) Py_CLEAR(m);
    return m;
}
