/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target: the etcd backend's gRPC transcoder (etcd_grpc.c), which
 * reads every reply etcd sends and writes every request.
 *
 * Input: byte 0 picks a method (a gateway path) and a direction.
 * - Replies (even byte 0): the rest is a gRPC body, frames of the method's
 *   reply type, as etcd would send; each whole frame is unpacked and turned
 *   into the gateway's JSON. Invariant: that JSON, turned back into a
 *   message, packs to bytes that give the same JSON again (the mapping loses
 *   nothing the backend reads, and accepts all it writes).
 * - Requests (odd byte 0): the rest is JSON text, one or more objects, as
 *   the backend would write; dlock__etcd_grpc_body frames them or refuses
 *   them with a message. Invariant: a refusal names something (a non-empty
 *   message); frames it wrote parse back, whole, as the request type.
 * And no crash, leak or undefined behaviour (ASan, UBSan, LSan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_grpc.h"

static const char *const paths[] = {
    "/v3/kv/range",       "/v3/kv/put",          "/v3/kv/deleterange", "/v3/kv/txn",
    "/v3/lease/grant",    "/v3/lease/revoke",    "/v3/lease/keepalive", "/v3/lease/timetolive",
    "/v3/watch",          "/v3/auth/authenticate",
};

static void die(const char *what)
{
    fprintf(stderr, "fuzz_etcd_grpc: %s\n", what);
    abort();
}

/* m's JSON, back to a message, packed, unpacked, to JSON: the same. */
static void round_trip(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *j = dlock__etcd_pb_to_json(m), *j2;
    ProtobufCMessage *back, *again;
    char err[200];
    uint8_t *buf;
    size_t len;

    if (j == NULL)
        return; /* out of memory */
    back = dlock__etcd_pb_from_json(d, j, err, sizeof(err));
    if (back == NULL) {
        fprintf(stderr, "%s\n", err);
        die("a reply's JSON does not go back into its message");
    }
    len = protobuf_c_message_get_packed_size(back);
    buf = malloc(len + 1);
    if (buf == NULL)
        die("out of memory");
    protobuf_c_message_pack(back, buf);
    again = protobuf_c_message_unpack(d, NULL, len, buf);
    if (again == NULL)
        die("packed message does not unpack");
    j2 = dlock__etcd_pb_to_json(again);
    if (j2 != NULL && !json_equal(j, j2))
        die("JSON -> protobuf -> JSON changed the reply");
    json_decref(j2);
    dlock__etcd_pb_free(again, 0);
    free(buf);
    dlock__etcd_pb_free(back, 0);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMethodDescriptor *method;
    char grpc_path[128];
    size_t pos = 0, n;
    const uint8_t *msg;

    if (size < 1)
        return 0;
    method = dlock__etcd_grpc_method(paths[(data[0] >> 1) % (sizeof(paths) / sizeof(paths[0]))],
                                     grpc_path, sizeof(grpc_path));
    if (method == NULL)
        die("a path of the backend has no method");
    if ((data[0] & 1) == 0) {
        while (dlock__etcd_grpc_frame(data + 1, size - 1, &pos, 1 << 20, &msg, &n) == 1) {
            ProtobufCMessage *m = protobuf_c_message_unpack(method->output, NULL, n, msg);
            if (m == NULL)
                continue;
            round_trip(m);
            dlock__etcd_pb_free(m, 1);
        }
    } else {
        char *text = malloc(size);
        char err[200] = "";
        uint8_t *body = NULL;
        size_t len = 0;

        if (text == NULL)
            return 0;
        memcpy(text, data + 1, size - 1);
        text[size - 1] = '\0';
        if (dlock__etcd_grpc_body(method->input, text, 0, &body, &len, err, sizeof(err)) != 0) {
            if (err[0] == '\0')
                die("a refused request without a message");
        } else {
            while (dlock__etcd_grpc_frame(body, len, &pos, len, &msg, &n) == 1) {
                ProtobufCMessage *m = protobuf_c_message_unpack(method->input, NULL, n, msg);
                if (m == NULL)
                    die("a request frame does not unpack");
                dlock__etcd_pb_free(m, 0);
            }
            if (pos != len)
                die("request frames do not cover the body");
        }
        free(body);
        free(text);
    }
    return 0;
}
