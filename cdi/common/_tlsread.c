/* Filling a buffer from a blocking-mode `ssl.SSLSocket` in one call (see `cdi/common/sockfill.py`).

   `SSLSocket.recv_into` returns at most one TLS record (16 KiB) per call, and each call takes and gives
   back the GIL; for an upload that is 65,536 round trips through the interpreter per GiB, in the
   busiest thread of the upload server. This loops `SSL_read_ex` over the same `SSL *` the `ssl` module
   uses until the buffer is full, with the GIL released throughout.

   No OpenSSL headers and no link against libssl: the few functions are looked up (`bind`) in the
   libssl that `_ssl` itself is linked to, so the `SSL *` is always handled by its own library. The
   `SSL *` sits right after the weak reference to the socket at the start of `_ssl._SSLSocket`. The
   module is built only for the Python versions the project declares (`requires-python` in
   pyproject.toml: 3.11, what CI runs); for any other it does not compile and, being optional, is left
   out (the fallback in sockfill.py then reads record by record). `fill` also checks the type's name and
   that `SSL_get_fd` gives the socket's descriptor before it reads.

   Timeouts are deadlines, as in the `ssl` module: `first_ms` from the call for the first byte,
   `pause_ms` from the latest byte; bytes trickling into a TLS record that is not complete yet do not
   extend them. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030C0000
#error "built for Python 3.11 only, as pyproject.toml's requires-python (the layout of _ssl._SSLSocket is assumed)"
#endif

/* SSL_get_error results (OpenSSL ABI, unchanged since 1.0) */
#define E_WANT_READ 2
#define E_WANT_WRITE 3
#define E_SYSCALL 5
#define E_ZERO_RETURN 6
#define LIB_SSL 20 /* ERR_LIB_SSL */
#define REASON_UNEXPECTED_EOF 294 /* SSL_R_UNEXPECTED_EOF_WHILE_READING (OpenSSL 3) */

/* why `fill` stopped (mirrored in sockfill.py) */
enum { FULL = 0, PAUSED = 1, TIMEOUT = 2, CLOSED = 3, OS_ERROR = 4, TLS_ERROR = 5 };

typedef struct {
    PyObject_HEAD
    PyObject *socket;
    void *ssl;
} SSLSocketHead;

static struct {
    int (*read_ex)(void *ssl, void *buf, size_t num, size_t *readbytes);
    int (*get_error)(const void *ssl, int ret);
    int (*get_fd)(const void *ssl);
    unsigned long (*peek_error)(void);
    void (*error_string_n)(unsigned long e, char *buf, size_t len);
    void (*clear_error)(void);
} ossl;

static PyObject *tlsread_bind(PyObject *Py_UNUSED(module), PyObject *arg) {
    const char *path = PyUnicode_AsUTF8(arg); /* _ssl's file; built into the interpreter, there is none */
    if (path == NULL)
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, dlerror());
        return NULL;
    }
    struct { void **slot; const char *name; } wanted[] = {
        {(void **)&ossl.read_ex, "SSL_read_ex"},         {(void **)&ossl.get_error, "SSL_get_error"},
        {(void **)&ossl.get_fd, "SSL_get_fd"},           {(void **)&ossl.peek_error, "ERR_peek_error"},
        {(void **)&ossl.error_string_n, "ERR_error_string_n"}, {(void **)&ossl.clear_error, "ERR_clear_error"},
    };
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        void *found = dlsym(lib, wanted[i].name);
        if (found == NULL) {
            memset(&ossl, 0, sizeof ossl);
            PyErr_Format(PyExc_OSError, "%s has no %s", path, wanted[i].name);
            return NULL;
        }
        *wanted[i].slot = found;
    }
    Py_RETURN_NONE;
}

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void *ssl_of(PyObject *sslobj, int fd) {
    if (ossl.read_ex == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() was not called");
        return NULL;
    }
    if (strcmp(Py_TYPE(sslobj)->tp_name, "_ssl._SSLSocket") != 0) {
        PyErr_Format(PyExc_TypeError, "expected an _ssl._SSLSocket, got %s", Py_TYPE(sslobj)->tp_name);
        return NULL;
    }
    void *ssl = ((SSLSocketHead *)sslobj)->ssl;
    if (ssl == NULL || ossl.get_fd(ssl) != fd) {
        PyErr_SetString(PyExc_ValueError, "the TLS connection does not read from this socket");
        return NULL;
    }
    return ssl;
}

/* fill(sslobj, fd, buffer, first_ms, pause_ms) -> (bytes read, why it stopped, errno or reason) */
static PyObject *tlsread_fill(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *sslobj;
    int fd, first_ms, pause_ms;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Oiw*ii", &sslobj, &fd, &view, &first_ms, &pause_ms))
        return NULL;
    void *ssl = ssl_of(sslobj, fd);
    if (ssl == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    size_t got = 0, len = (size_t)view.len;
    int why = FULL, err = 0;
    char reason[256] = "";
    Py_BEGIN_ALLOW_THREADS
    long long deadline = now_ms() + first_ms;
    ossl.clear_error(); /* what an earlier call on this thread left there is not ours to report */
    while (got < len) {
        size_t n = 0;
        errno = 0;
        int ret = ossl.read_ex(ssl, (char *)view.buf + got, len - got, &n);
        if (ret > 0) {
            got += n;
            deadline = now_ms() + pause_ms;
            continue;
        }
        int code = ossl.get_error(ssl, ret);
        err = errno;
        if (code == E_WANT_READ || code == E_WANT_WRITE) { /* a renegotiation may want to write */
            struct pollfd p = {fd, code == E_WANT_READ ? POLLIN : POLLOUT, 0};
            long long left = deadline - now_ms();
            int ready = left > 0 ? poll(&p, 1, (int)left) : 0;
            if (ready == 0) {
                why = got ? PAUSED : TIMEOUT;
                break;
            }
            if (ready < 0 && errno != EINTR) {
                why = OS_ERROR;
                err = errno;
                break;
            }
            continue;
        }
        if (code == E_ZERO_RETURN || (code == E_SYSCALL && err == 0)) {
            why = CLOSED;
        } else if (code == E_SYSCALL) {
            why = OS_ERROR;
        } else {
            unsigned long e = ossl.peek_error();
            if ((e & 0x80000000UL) == 0 && ((e >> 23) & 0xFFUL) == LIB_SSL && (e & 0x7FFFFFUL) == REASON_UNEXPECTED_EOF) {
                why = CLOSED; /* no close_notify: Python's suppress_ragged_eofs reads it as the end too */
            } else {
                why = TLS_ERROR;
                if (e != 0)
                    ossl.error_string_n(e, reason, sizeof reason);
                else
                    snprintf(reason, sizeof reason, "TLS error %d", code);
            }
        }
        ossl.clear_error();
        break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (why == TLS_ERROR)
        return Py_BuildValue("(nis)", (Py_ssize_t)got, why, reason);
    return Py_BuildValue("(nii)", (Py_ssize_t)got, why, err);
}

static PyMethodDef methods[] = {
    {"bind", tlsread_bind, METH_O, "Look up the OpenSSL functions in the library at this path (or what it links)."},
    {"fill", tlsread_fill, METH_VARARGS, "Read from a TLS connection until the buffer is full or it stops."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_tlsread", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__tlsread(void) { return PyModule_Create(&module); }
