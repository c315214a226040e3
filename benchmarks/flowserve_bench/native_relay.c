/* The native floor's Kafka side (flowserve_bench.hop_native): librdkafka driven from C, woken by a pipe.

A relay on this module hands librdkafka a whole batch per call and gets a whole batch back per call, where
confluent-kafka takes one Python call per record to produce and one Python callback per delivery report,
and wakes its caller from threads of its own. Here:
- consume() takes every record queued for the consumer in one call (rd_kafka_consume_batch_queue) and
  returns them as (partition, offset, key, value, headers) tuples;
- produce() queues a list of records in one call (rd_kafka_producev per record, in C);
- delivery reports are events (RD_KAFKA_EVENT_DR) that reports() counts in C, a batch of reports per event;
- each queue writes a byte to a pipe when it goes from empty to non-empty (rd_kafka_queue_io_event_enable),
  so the event loop waits on a file descriptor (loop.add_reader) and no thread of ours crosses into Python.

It is a measuring instrument for `flowserve bench hop-cpu`, not a client: no rebalance callbacks, commits
are asynchronous and unchecked. Build: hop_native.build() (gcc, Python's headers, librdkafka's rdkafka.h).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#define MAX_BATCH 4096

typedef struct {
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    int fds[2];
    int consumer;
} handle;

static void handle_free(PyObject *capsule) {
    handle *h = PyCapsule_GetPointer(capsule, "native_relay");
    if (!h) return;
    rd_kafka_queue_io_event_enable(h->queue, -1, NULL, 0);
    rd_kafka_queue_destroy(h->queue);
    if (h->consumer) rd_kafka_consumer_close(h->rk);
    else rd_kafka_flush(h->rk, 5000);
    rd_kafka_destroy(h->rk);
    close(h->fds[0]);
    close(h->fds[1]);
    free(h);
}

static handle *get(PyObject *capsule) { return PyCapsule_GetPointer(capsule, "native_relay"); }

/* A librdkafka configuration from a dict of str -> anything str() spells as librdkafka wants. */
static rd_kafka_conf_t *make_conf(PyObject *settings) {
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(settings, &pos, &key, &value)) {
        PyObject *text = PyObject_Str(value);
        const char *k = text ? PyUnicode_AsUTF8(key) : NULL, *v = text ? PyUnicode_AsUTF8(text) : NULL;
        int ok = k && v && rd_kafka_conf_set(conf, k, v, err, sizeof err) == RD_KAFKA_CONF_OK;
        Py_XDECREF(text);
        if (!ok) {
            rd_kafka_conf_destroy(conf);
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "librdkafka setting: %s", err);
            return NULL;
        }
    }
    return conf;
}

/* (handle, read end of the pipe the queue wakes) for a new client of `kind` on `conf`. */
static PyObject *open_handle(rd_kafka_type_t kind, rd_kafka_conf_t *conf, const char *topic) {
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(kind, conf, err, sizeof err);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return PyErr_Format(PyExc_RuntimeError, "librdkafka: %s", err);
    }
    handle *h = calloc(1, sizeof *h);
    h->rk = rk;
    h->consumer = kind == RD_KAFKA_CONSUMER;
    if (pipe2(h->fds, O_NONBLOCK | O_CLOEXEC)) {
        rd_kafka_destroy(rk);
        free(h);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (h->consumer) {
        rd_kafka_poll_set_consumer(rk);
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, topic, RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t e = rd_kafka_subscribe(rk, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        h->queue = rd_kafka_queue_get_consumer(rk);
        if (e) {
            PyObject *capsule = PyCapsule_New(h, "native_relay", handle_free);
            Py_XDECREF(capsule);
            return PyErr_Format(PyExc_RuntimeError, "subscribe: %s", rd_kafka_err2str(e));
        }
    } else {
        h->queue = rd_kafka_queue_get_main(rk);
    }
    rd_kafka_queue_io_event_enable(h->queue, h->fds[1], "1", 1);
    return Py_BuildValue("Ni", PyCapsule_New(h, "native_relay", handle_free), h->fds[0]);
}

static PyObject *consumer(PyObject *self, PyObject *args) {
    PyObject *settings;
    const char *topic;
    if (!PyArg_ParseTuple(args, "O!s", &PyDict_Type, &settings, &topic)) return NULL;
    rd_kafka_conf_t *conf = make_conf(settings);
    return conf ? open_handle(RD_KAFKA_CONSUMER, conf, topic) : NULL;
}

static PyObject *producer(PyObject *self, PyObject *args) {
    PyObject *settings;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &settings)) return NULL;
    rd_kafka_conf_t *conf = make_conf(settings);
    if (!conf) return NULL;
    /* delivery reports as events on the main queue: counted a batch at a time, no callback per record */
    rd_kafka_conf_set_events(conf, RD_KAFKA_EVENT_DR);
    return open_handle(RD_KAFKA_PRODUCER, conf, NULL);
}

static PyObject *headers_of(rd_kafka_message_t *m) {
    rd_kafka_headers_t *hdrs;
    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) return PyList_New(0);
    size_t count = rd_kafka_header_cnt(hdrs);
    PyObject *out = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; out && i < count; i++) {
        const char *name;
        const void *value;
        size_t size;
        rd_kafka_header_get_all(hdrs, i, &name, &value, &size);
        PyList_SET_ITEM(out, i, Py_BuildValue("(sy#)", name, (const char *)value, (Py_ssize_t)size));
    }
    return out;
}

/* Every record queued for the consumer (at most `max`), without waiting: [(partition, offset, key, value,
   headers)]. Records carrying an error (a partition's end, a fetch failure) are skipped. */
static PyObject *consume(PyObject *self, PyObject *args) {
    PyObject *capsule;
    int max;
    if (!PyArg_ParseTuple(args, "Oi", &capsule, &max)) return NULL;
    handle *h = get(capsule);
    if (!h) return NULL;
    rd_kafka_message_t *batch[MAX_BATCH];
    ssize_t n = rd_kafka_consume_batch_queue(h->queue, 0, batch, max < MAX_BATCH ? max : MAX_BATCH);
    PyObject *out = PyList_New(0);
    for (ssize_t i = 0; i < n; i++) {
        rd_kafka_message_t *m = batch[i];
        if (out && !m->err) {
            PyObject *record = Py_BuildValue("(iLy#y#N)", (int)m->partition, (long long)m->offset,
                                             (const char *)m->key, (Py_ssize_t)(m->key ? m->key_len : 0),
                                             (const char *)m->payload, (Py_ssize_t)m->len, headers_of(m));
            if (!record || PyList_Append(out, record)) Py_CLEAR(out);
            Py_XDECREF(record);
        }
        rd_kafka_message_destroy(m);
    }
    return out;
}

/* Queue [(partition, key, value, [(name, value)])] for `topic`; returns how many were queued. */
static PyObject *produce(PyObject *self, PyObject *args) {
    PyObject *capsule, *records;
    const char *topic;
    if (!PyArg_ParseTuple(args, "OsO!", &capsule, &topic, &PyList_Type, &records)) return NULL;
    handle *h = get(capsule);
    if (!h) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < n; i++) {
        int partition;
        PyObject *key, *hlist;
        const char *value;
        Py_ssize_t value_len;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(records, i), "iOy#O!", &partition, &key, &value, &value_len,
                              &PyList_Type, &hlist))
            return NULL;
        char *key_buf = NULL;
        Py_ssize_t key_len = 0;
        if (key != Py_None && PyBytes_AsStringAndSize(key, &key_buf, &key_len)) return NULL;
        rd_kafka_headers_t *hdrs = rd_kafka_headers_new((size_t)PyList_GET_SIZE(hlist));
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(hlist); j++) {
            const char *name, *hvalue;
            Py_ssize_t hlen;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(hlist, j), "sy#", &name, &hvalue, &hlen)) {
                rd_kafka_headers_destroy(hdrs);
                return NULL;
            }
            rd_kafka_header_add(hdrs, name, -1, hvalue, hlen);
        }
        rd_kafka_resp_err_t e = rd_kafka_producev(
            h->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_KEY(key_buf, (size_t)key_len), RD_KAFKA_V_VALUE((void *)value, (size_t)value_len),
            RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
        if (e) {
            rd_kafka_headers_destroy(hdrs);
            return PyErr_Format(PyExc_RuntimeError, "produce: %s", rd_kafka_err2str(e));
        }
    }
    return PyLong_FromSsize_t(n);
}

/* Serve the producer's events without waiting: (records acknowledged, records failed). */
static PyObject *reports(PyObject *self, PyObject *args) {
    PyObject *capsule;
    if (!PyArg_ParseTuple(args, "O", &capsule)) return NULL;
    handle *h = get(capsule);
    if (!h) return NULL;
    long ok = 0, failed = 0;
    rd_kafka_event_t *ev;
    while ((ev = rd_kafka_queue_poll(h->queue, 0))) {
        if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_DR) {
            const rd_kafka_message_t *m;
            while ((m = rd_kafka_event_message_next(ev))) {
                if (m->err) failed++;
                else ok++;
            }
        }
        rd_kafka_event_destroy(ev);
    }
    return Py_BuildValue("(ll)", ok, failed);
}

/* Commit {partition: next offset} of `topic`, asynchronously (the floor's relays do not check it). */
static PyObject *commit(PyObject *self, PyObject *args) {
    PyObject *capsule, *offsets, *partition, *offset;
    const char *topic;
    if (!PyArg_ParseTuple(args, "OsO!", &capsule, &topic, &PyDict_Type, &offsets)) return NULL;
    handle *h = get(capsule);
    if (!h) return NULL;
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new((int)PyDict_Size(offsets));
    Py_ssize_t pos = 0;
    while (PyDict_Next(offsets, &pos, &partition, &offset))
        rd_kafka_topic_partition_list_add(list, topic, (int32_t)PyLong_AsLong(partition))->offset =
            PyLong_AsLongLong(offset);
    rd_kafka_resp_err_t e = PyErr_Occurred() ? RD_KAFKA_RESP_ERR_NO_ERROR : rd_kafka_commit(h->rk, list, 1);
    rd_kafka_topic_partition_list_destroy(list);
    if (PyErr_Occurred()) return NULL;
    if (e && e != RD_KAFKA_RESP_ERR__NO_OFFSET) return PyErr_Format(PyExc_RuntimeError, "commit: %s", rd_kafka_err2str(e));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"consumer", consumer, METH_VARARGS, "consumer(settings, topic) -> (handle, wake fd)"},
    {"producer", producer, METH_VARARGS, "producer(settings) -> (handle, wake fd)"},
    {"consume", consume, METH_VARARGS, "consume(handle, max) -> [(partition, offset, key, value, headers)]"},
    {"produce", produce, METH_VARARGS, "produce(handle, topic, [(partition, key, value, headers)]) -> count"},
    {"reports", reports, METH_VARARGS, "reports(handle) -> (acknowledged, failed)"},
    {"commit", commit, METH_VARARGS, "commit(handle, topic, {partition: offset})"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native_relay", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native_relay(void) { return PyModule_Create(&module); }
