/* pdx_router.scan, compiled: marks(block) -> int, as scan.py says, in one call.
 *
 * METH_O, so a call costs no argument tuple and no parsing; memchr and memmem are glibc's
 * vectorised searches. Built by scripts/build_router_native.py beside the mypyc modules. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { KV = 1, BACKSLASH = 2, IDS = 4, CR = 8, LINES = 16 };

static PyObject *marks(PyObject *self, PyObject *block) {
    (void)self;
    if (!PyBytes_Check(block)) {
        PyErr_Format(PyExc_TypeError, "marks() takes bytes, not %.80s", Py_TYPE(block)->tp_name);
        return NULL;
    }
    const char *s = PyBytes_AS_STRING(block);
    size_t n = (size_t)PyBytes_GET_SIZE(block);
    long out = 0;
    if (memmem(s, n, "kv_transfer_params", 18)) out |= KV;
    if (memchr(s, '\\', n)) out |= BACKSLASH;
    if (memmem(s, n, "token_ids", 9)) out |= IDS;
    if (memchr(s, '\r', n)) out |= CR;
    const char *lf = memchr(s, '\n', n);
    if (lf && (size_t)(lf - s) + 2 < n) out |= LINES;
    return PyLong_FromLong(out);
}

static PyMethodDef methods[] = {
    {"marks", marks, METH_O, "The bits of scan.py's constants that the block sets."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "pdx_router.scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit_scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "KV", KV) < 0 || PyModule_AddIntConstant(m, "BACKSLASH", BACKSLASH) < 0 ||
        PyModule_AddIntConstant(m, "IDS", IDS) < 0 || PyModule_AddIntConstant(m, "CR", CR) < 0 ||
        PyModule_AddIntConstant(m, "LINES", LINES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
