/* The server side of TLS connections in C, for the threaded fronts' bulk byte paths (see
   `cdi/common/tlsfront.py`, which also holds the pure-Python path used without this module or with
   CDI_NO_EXTENSIONS=1).

   Why: `ssl.SSLSocket.recv_into` returns at most one TLS record (16 KiB) per call and takes the GIL
   back after each; for an upload that is 65,536 trips through the interpreter per GiB in the busiest
   thread of the upload server, each a chance to wait for the GIL held by the importer's thread. Here
   one call fills a whole buffer (a MiB) with the GIL released throughout.

   Only public APIs: this module makes its own `SSL_CTX` from the certificate, key and client CA files
   and its own `SSL` over the socket's descriptor from the first byte of the handshake on; the `ssl`
   module's objects are never touched. The descriptor belongs to the caller (a `socket.socket`) and is
   put in non-blocking mode: every wait is a `poll` with a deadline, as in the `ssl` module (bytes
   trickling into a record that is not complete yet do not extend it).

   The protocol versions and cipher suites are not chosen here: `Context` takes the minimum version, the
   OpenSSL cipher list (TLS 1.2 and older, with its security level) and the option bits of the Python
   `ssl.SSLContext` that the same server would otherwise serve with (`cdi.common.tlsfront.ServerTLS`), so
   that both paths offer exactly the same. TLS 1.3 suites are left at OpenSSL's default, as the `ssl`
   module cannot set them (`cdi.common.pki.TLSPolicy`).

   The lifetime rule of a connection's `SSL*`: it is used only between `conn_enter` and `conn_leave`,
   which are counted under the connection's mutex; `conn_enter` refuses once `close` began and while another
   call is inside (OpenSSL's `SSL` may not be used by two threads at once), and `close` frees the `SSL*` only
   when no call is inside. A call that waits in `poll` with the GIL released is woken by `close`, which
   shuts the descriptor down both ways first; `close` returns once that call has left, so the caller may
   close the descriptor after it (no call can touch a reused descriptor number either). The mutex is taken
   twice per call (a MiB per `fill`), never per byte. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* why a read stopped (mirrored in tlsfront.py) */
enum { FULL = 0, PAUSED = 1, TIMEOUT = 2, CLOSED = 3, OS_ERROR = 4, TLS_ERROR = 5 };

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Wait for `events` on fd until `deadline` (ms, < 0: none). 1 ready, 0 timed out, -1 errno set. */
static int wait_fd(int fd, short events, long long deadline) {
    for (;;) {
        int left = -1;
        if (deadline >= 0) {
            long long l = deadline - now_ms();
            if (l <= 0)
                return 0;
            left = l > 1000000000 ? 1000000000 : (int)l;
        }
        struct pollfd p = {fd, events, 0};
        int ready = poll(&p, 1, left);
        if (ready < 0 && errno == EINTR)
            continue;
        return ready > 0 ? 1 : ready;
    }
}

static long long deadline_of(int ms) { return ms < 0 ? -1 : now_ms() + ms; }

static void tls_reason(char *reason, size_t size, int code) {
    unsigned long e = ERR_peek_error();
    if (e != 0)
        ERR_error_string_n(e, reason, size);
    else
        snprintf(reason, size, "TLS error %d", code);
}

/* -- Context ------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    SSL_CTX *ctx;
} Context;

static PyTypeObject ConnType;

static int Context_init(Context *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"certfile", "keyfile", "cafile", "minimum", "ciphers", "options", NULL};
    const char *certfile, *keyfile, *cafile = NULL, *ciphers = NULL;
    int minimum = TLS1_2_VERSION;
    unsigned long long options = 0;
    int has_options = 0;
    PyObject *options_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ss|ziz$O", kwlist, &certfile, &keyfile, &cafile, &minimum,
                                     &ciphers, &options_obj))
        return -1;
    if (self->ctx != NULL) { /* accept() may run in other threads on this context: it never changes */
        PyErr_SetString(PyExc_RuntimeError, "a TLS context is set up once; make a new one to change it");
        return -1;
    }
    if (options_obj != NULL && options_obj != Py_None) {
        options = PyLong_AsUnsignedLongLong(options_obj);
        if (PyErr_Occurred())
            return -1;
        has_options = 1;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        goto fail;
    if (has_options) { /* exactly the Python context's option bits */
        SSL_CTX_clear_options(ctx, SSL_CTX_get_options(ctx));
        SSL_CTX_set_options(ctx, (uint64_t)options);
    } else {
        SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION);
    }
    if (!SSL_CTX_set_min_proto_version(ctx, minimum) || (ciphers != NULL && SSL_CTX_set_cipher_list(ctx, ciphers) != 1) ||
        SSL_CTX_use_certificate_chain_file(ctx, certfile) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, keyfile, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1)
        goto fail;
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (cafile != NULL) { /* a client certificate is optional, and when given it must chain to cafile */
        if (SSL_CTX_load_verify_locations(ctx, cafile, NULL) != 1)
            goto fail;
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    self->ctx = ctx;
    return 0;
fail:;
    char reason[256];
    tls_reason(reason, sizeof reason, 0);
    ERR_clear_error();
    if (ctx != NULL)
        SSL_CTX_free(ctx);
    PyErr_Format(PyExc_ValueError, "cannot set up TLS with this certificate, key, CA, version or ciphers: %s",
                 reason);
    return -1;
}

static void Context_dealloc(Context *self) {
    if (self->ctx != NULL)
        SSL_CTX_free(self->ctx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- Conn ---------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    SSL *ssl;
    int fd;
    pthread_mutex_t mu; /* guards busy and closed (see the lifetime rule at the top) */
    pthread_cond_t idle; /* signalled when busy drops to 0 */
    int busy;            /* a call is using ssl */
    int closed;          /* close began: no call may enter any more */
} Conn;

/* The SSL* for one call, or NULL with an exception set (closed, or in use by another thread). With or
   without the GIL; must be paired with conn_leave. */
static SSL *conn_enter(Conn *self) {
    pthread_mutex_lock(&self->mu);
    int closed = self->closed || self->ssl == NULL, busy = self->busy;
    if (!closed && !busy)
        self->busy = 1;
    pthread_mutex_unlock(&self->mu);
    if (closed)
        PyErr_SetString(PyExc_ValueError, "the TLS connection is closed");
    else if (busy)
        PyErr_SetString(PyExc_RuntimeError, "another thread is using this TLS connection");
    return closed || busy ? NULL : self->ssl;
}

/* The call is done with the SSL*; wakes a close waiting for it. Needs no GIL. */
static void conn_leave(Conn *self) {
    pthread_mutex_lock(&self->mu);
    self->busy = 0;
    pthread_cond_broadcast(&self->idle);
    pthread_mutex_unlock(&self->mu);
}

static PyObject *raise_tls(int why, int err, const char *reason) {
    if (why == TIMEOUT)
        PyErr_SetString(PyExc_TimeoutError, "timed out");
    else if (why == OS_ERROR)
        PyErr_SetFromErrno(PyExc_OSError), (void)err;
    else
        PyErr_SetString(PyExc_ConnectionError, reason);
    return NULL;
}

/* Drive one SSL call to completion (handshake, write, shutdown) with polls; returns FULL on success. */
static int drive(SSL *ssl, int fd, int (*step)(SSL *, void *), void *arg, long long deadline, int *err,
                 char *reason, size_t size) {
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int ret = step(ssl, arg);
        if (ret > 0)
            return FULL;
        int code = SSL_get_error(ssl, ret);
        *err = errno;
        if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
            int ready = wait_fd(fd, code == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            if (ready == 0)
                return TIMEOUT;
            if (ready < 0) {
                *err = errno;
                return OS_ERROR;
            }
            continue;
        }
        if (code == SSL_ERROR_ZERO_RETURN || (code == SSL_ERROR_SYSCALL && *err == 0)) {
            snprintf(reason, size, "the peer closed the connection");
            return CLOSED;
        }
        if (code == SSL_ERROR_SYSCALL)
            return OS_ERROR;
        tls_reason(reason, size, code);
        ERR_clear_error();
        return TLS_ERROR;
    }
}

static int step_accept(SSL *ssl, void *arg) { (void)arg; return SSL_accept(ssl); }

/* accept(fd, timeout_ms) -> Conn: the TLS handshake as the server on this (connected) descriptor */
static PyObject *Context_accept(Context *self, PyObject *args) {
    int fd, timeout_ms;
    if (!PyArg_ParseTuple(args, "ii", &fd, &timeout_ms))
        return NULL;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    SSL *ssl = SSL_new(self->ctx);
    if (ssl == NULL || !SSL_set_fd(ssl, fd)) {
        if (ssl != NULL)
            SSL_free(ssl);
        return PyErr_NoMemory();
    }
    int why, err = 0;
    char reason[256] = "";
    Py_BEGIN_ALLOW_THREADS
    why = drive(ssl, fd, step_accept, NULL, deadline_of(timeout_ms), &err, reason, sizeof reason);
    Py_END_ALLOW_THREADS
    if (why != FULL) {
        SSL_free(ssl);
        if (why == OS_ERROR) {
            errno = err ? err : EIO;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        return raise_tls(why, err, why == CLOSED ? "the client closed the connection in the handshake" : reason);
    }
    Conn *conn = PyObject_New(Conn, &ConnType);
    if (conn == NULL) {
        SSL_free(ssl);
        return NULL;
    }
    conn->ssl = ssl;
    conn->fd = fd;
    conn->busy = 0;
    conn->closed = 0;
    pthread_mutex_init(&conn->mu, NULL);
    pthread_cond_init(&conn->idle, NULL);
    return (PyObject *)conn;
}

static PyMethodDef Context_methods[] = {
    {"accept", (PyCFunction)Context_accept, METH_VARARGS, "The server's TLS handshake on a connected descriptor."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cdi.common._tlsfront.Context",
    .tp_basicsize = sizeof(Context),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Context_init,
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_methods = Context_methods,
    .tp_doc = "A server TLS context from certificate, key and (optional) client CA files.",
};

/* fill(buffer, first_ms, pause_ms) -> (bytes read, why it stopped, errno or reason) */
static PyObject *Conn_fill(Conn *self, PyObject *args) {
    int first_ms, pause_ms;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "w*ii", &view, &first_ms, &pause_ms))
        return NULL;
    SSL *ssl = conn_enter(self);
    if (ssl == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int fd = self->fd;
    size_t got = 0, len = (size_t)view.len;
    int why = FULL, err = 0;
    char reason[256] = "";
    Py_BEGIN_ALLOW_THREADS
    long long deadline = deadline_of(first_ms);
    ERR_clear_error();
    while (got < len) {
        size_t n = 0;
        errno = 0;
        int ret = SSL_read_ex(ssl, (char *)view.buf + got, len - got, &n);
        if (ret > 0) {
            got += n;
            deadline = deadline_of(pause_ms);
            continue;
        }
        int code = SSL_get_error(ssl, ret);
        err = errno;
        if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
            int ready = wait_fd(fd, code == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            if (ready == 0) {
                why = got ? PAUSED : TIMEOUT;
                break;
            }
            if (ready < 0) {
                why = OS_ERROR;
                err = errno;
                break;
            }
            continue;
        }
        if (code == SSL_ERROR_ZERO_RETURN || (code == SSL_ERROR_SYSCALL && err == 0)) {
            why = CLOSED;
        } else if (code == SSL_ERROR_SYSCALL) {
            why = OS_ERROR;
        } else if (ERR_GET_LIB(ERR_peek_error()) == ERR_LIB_SSL &&
                   ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
            why = CLOSED; /* no close_notify: Python's suppress_ragged_eofs reads it as the end too */
        } else {
            why = TLS_ERROR;
            tls_reason(reason, sizeof reason, code);
        }
        ERR_clear_error();
        break;
    }
    conn_leave(self);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (why == TLS_ERROR)
        return Py_BuildValue("(nis)", (Py_ssize_t)got, why, reason);
    return Py_BuildValue("(nii)", (Py_ssize_t)got, why, err);
}

typedef struct {
    const char *data;
    size_t len, done;
} Pending;

static int step_write(SSL *ssl, void *arg) {
    Pending *p = arg;
    while (p->done < p->len) {
        size_t n = 0;
        int ret = SSL_write_ex(ssl, p->data + p->done, p->len - p->done, &n);
        if (ret <= 0)
            return ret;
        p->done += n;
    }
    return 1;
}

/* sendall(data, timeout_ms): every byte, or an error (timeout counted from the call) */
static PyObject *Conn_sendall(Conn *self, PyObject *args) {
    int timeout_ms;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*i", &view, &timeout_ms))
        return NULL;
    SSL *ssl = conn_enter(self);
    if (ssl == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Pending p = {view.buf, (size_t)view.len, 0};
    int why = FULL, err = 0;
    char reason[256] = "";
    int fd = self->fd;
    Py_BEGIN_ALLOW_THREADS
    if (p.len)
        why = drive(ssl, fd, step_write, &p, deadline_of(timeout_ms), &err, reason, sizeof reason);
    conn_leave(self);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (why == FULL)
        Py_RETURN_NONE;
    if (why == OS_ERROR || why == CLOSED) {
        errno = err ? err : EPIPE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return raise_tls(why, err, reason);
}

static int step_shutdown(SSL *ssl, void *arg) {
    (void)arg;
    int ret = SSL_shutdown(ssl);
    if (ret == 0) { /* ours sent: wait for the peer's (SSL_shutdown again reads up to it, no further) */
        ret = SSL_shutdown(ssl);
    }
    return ret;
}

/* shutdown(timeout_ms): close_notify both ways; the descriptor stays open, at the byte after the peer's */
static PyObject *Conn_shutdown(Conn *self, PyObject *args) {
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "i", &timeout_ms))
        return NULL;
    SSL *ssl = conn_enter(self);
    if (ssl == NULL)
        return NULL;
    int why, err = 0;
    char reason[256] = "";
    int fd = self->fd;
    Py_BEGIN_ALLOW_THREADS
    why = drive(ssl, fd, step_shutdown, NULL, deadline_of(timeout_ms), &err, reason, sizeof reason);
    conn_leave(self);
    Py_END_ALLOW_THREADS
    if (why == FULL)
        Py_RETURN_NONE;
    if (why == OS_ERROR) {
        errno = err ? err : EIO;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return raise_tls(why, err, reason);
}

static PyObject *Conn_pending(Conn *self, PyObject *Py_UNUSED(arg)) {
    pthread_mutex_lock(&self->mu);
    int closed = self->closed || self->ssl == NULL;
    pthread_mutex_unlock(&self->mu);
    if (closed)
        return PyLong_FromLong(0);
    SSL *ssl = conn_enter(self);
    if (ssl == NULL)
        return NULL;
    int pending = SSL_pending(ssl);
    conn_leave(self);
    return PyLong_FromLong(pending);
}

/* The client certificate's subject as the ssl module gives it, ((("commonName", "x"),), ...); None: no
   certificate (one that does not verify fails the handshake) */
static PyObject *Conn_peer_subject(Conn *self, PyObject *Py_UNUSED(arg)) {
    SSL *ssl = conn_enter(self);
    if (ssl == NULL)
        return NULL;
    X509 *cert = SSL_get1_peer_certificate(ssl);
    conn_leave(self); /* the certificate is ours now (a reference), whatever happens to the SSL */
    if (cert == NULL)
        Py_RETURN_NONE;
    X509_NAME *name = X509_get_subject_name(cert);
    int count = X509_NAME_entry_count(name);
    PyObject *subject = PyTuple_New(count);
    for (int i = 0; subject != NULL && i < count; i++) {
        X509_NAME_ENTRY *entry = X509_NAME_get_entry(name, i);
        int nid = OBJ_obj2nid(X509_NAME_ENTRY_get_object(entry));
        const char *field = nid == NID_undef ? "unknown" : OBJ_nid2ln(nid);
        unsigned char *utf8 = NULL;
        int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(entry));
        PyObject *rdn = n < 0 ? NULL : Py_BuildValue("((ss#))", field, (const char *)utf8, (Py_ssize_t)n);
        OPENSSL_free(utf8);
        if (rdn == NULL) {
            Py_CLEAR(subject);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "an unreadable certificate subject");
            break;
        }
        PyTuple_SET_ITEM(subject, i, rdn);
    }
    X509_free(cert);
    return subject;
}

/* close(): free the TLS state, not the descriptor. A call inside on another thread (a fill waiting for
   bytes) is cut: the descriptor is shut down both ways, and close returns once that call has left. */
static PyObject *Conn_close(Conn *self, PyObject *Py_UNUSED(arg)) {
    pthread_mutex_lock(&self->mu);
    int first = !self->closed;
    self->closed = 1;
    if (first && self->busy)
        shutdown(self->fd, SHUT_RDWR); /* its poll wakes up, its SSL call fails, it leaves */
    pthread_mutex_unlock(&self->mu);
    Py_BEGIN_ALLOW_THREADS /* the call inside may need the GIL to leave the method it is in: not to leave */
    pthread_mutex_lock(&self->mu);
    while (self->busy)
        pthread_cond_wait(&self->idle, &self->mu);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    SSL *ssl = self->ssl; /* closed and not busy: nobody can enter again, so nobody else touches it */
    self->ssl = NULL;
    if (ssl != NULL)
        SSL_free(ssl); /* the descriptor is the caller's (SSL_set_fd's BIO does not close it) */
    Py_RETURN_NONE;
}

static void Conn_dealloc(Conn *self) {
    /* no call can be inside: each holds a reference to self */
    if (self->ssl != NULL)
        SSL_free(self->ssl);
    pthread_cond_destroy(&self->idle);
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Conn_methods[] = {
    {"fill", (PyCFunction)Conn_fill, METH_VARARGS, "Read until the buffer is full, the peer pauses or the end."},
    {"sendall", (PyCFunction)Conn_sendall, METH_VARARGS, "Send every byte."},
    {"shutdown", (PyCFunction)Conn_shutdown, METH_VARARGS, "close_notify both ways; the TCP connection stays."},
    {"pending", (PyCFunction)Conn_pending, METH_NOARGS, "Decrypted bytes buffered."},
    {"peer_subject", (PyCFunction)Conn_peer_subject, METH_NOARGS, "The client certificate's subject, or None."},
    {"close", (PyCFunction)Conn_close, METH_NOARGS, "Free the TLS state (not the descriptor)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ConnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cdi.common._tlsfront.Conn",
    .tp_basicsize = sizeof(Conn),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_methods = Conn_methods,
    .tp_doc = "A server TLS connection over a descriptor (made by Context.accept).",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_tlsfront", .m_size = -1};

PyMODINIT_FUNC PyInit__tlsfront(void) {
    if (PyType_Ready(&ContextType) < 0 || PyType_Ready(&ConnType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ContextType);
    if (PyModule_AddObject(m, "Context", (PyObject *)&ContextType) < 0) {
        Py_DECREF(&ContextType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
