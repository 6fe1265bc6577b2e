/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * etcd's gRPC API under the backend's JSON requests: the method behind each
 * gateway path, a transcoder between jansson objects and etcd's protobuf
 * messages, and gRPC's message framing. Pure functions, no I/O.
 *
 * The backend builds every request as the JSON that etcd's v3 gateway takes
 * (etcd_codec.h) and reads replies in the gateway's JSON. Over gRPC the same
 * objects are transcoded with the descriptors protoc-c generated from etcd's
 * own .proto files, following the gateway's mapping (grpc-gateway's jsonpb
 * with the proto field names):
 *   - field names are the .proto names ("range_end", "ID");
 *   - int64, uint64 (and their fixed and zigzag kinds) are decimal strings
 *     in replies; requests may give a string or a number;
 *   - bytes are standard base64 (URL-safe accepted in requests);
 *   - enums by name ("DELETE"), a number accepted in requests;
 *   - in replies every field that holds its zero (0, false, "", empty
 *     list, no message) is left out, but a member of a oneof that is set
 *     is always there.
 * So the rest of the backend reads the same objects whichever transport
 * carried them.
 */
#ifndef DLOCK_ETCD_GRPC_H
#define DLOCK_ETCD_GRPC_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* The gRPC method of a gateway path ("/v3/kv/txn"), and its gRPC path
 * ("/etcdserverpb.KV/Txn") written into grpc_path. NULL for a path that
 * names no method. */
const ProtobufCMethodDescriptor *dlock__etcd_grpc_method(const char *path, char *grpc_path,
                                                         size_t size);

/* A message of type d from the JSON object j. NULL with a message in err
 * naming the field when j does not fit d (unknown field, wrong type, bad
 * base64, out of range), or when out of memory. Free it with
 * dlock__etcd_pb_free. */
ProtobufCMessage *dlock__etcd_pb_from_json(const ProtobufCMessageDescriptor *d, const json_t *j,
                                           char *err, size_t errsize);

/* The JSON of message m, as the gateway writes it. NULL when out of memory. */
json_t *dlock__etcd_pb_to_json(const ProtobufCMessage *m);

/* Free a message of dlock__etcd_pb_from_json or protobuf_c_message_unpack;
 * wipe: its strings and bytes are zeroed first (a password, a token). NULL
 * is a no-op. */
void dlock__etcd_pb_free(ProtobufCMessage *m, int wipe);

/* One JSON object j as a framed message of type d, in *out (malloc'd).
 * wipe: zero the copies made on the way. 0, or -1 with a message in err. */
int dlock__etcd_grpc_pack(const ProtobufCMessageDescriptor *d, const json_t *j, int wipe,
                          uint8_t **out, size_t *len, char *err, size_t errsize);

/*
 * The gRPC body of a request: every JSON object in text (one for a unary
 * call, several for a client stream, one after the other) as a message of
 * type d, each framed (a 0 byte, not compressed, then its length in 4 bytes
 * big-endian). *out is malloc'd, *len its length. wipe: the message's
 * copies are zeroed before they are freed (jansson's, of parsing the text,
 * are not: a secret goes through dlock__etcd_grpc_pack). 0, or -1 with a
 * message in err.
 */
int dlock__etcd_grpc_body(const ProtobufCMessageDescriptor *d, const char *text, int wipe,
                          uint8_t **out, size_t *len, char *err, size_t errsize);

/*
 * The next whole message in buf[*pos..len): 1 and *msg, *msg_len set, *pos
 * moved past it; 0 when the rest is not a whole message yet; -1 when the
 * frame is one dlock cannot read (compressed, or longer than max).
 */
int dlock__etcd_grpc_frame(const uint8_t *buf, size_t len, size_t *pos, size_t max,
                           const uint8_t **msg, size_t *msg_len);

/*
 * A response header or trailer line ("grpc-status: 14\r\n"): sets *status
 * (grpc-status) or message (grpc-message, %-decoded) and returns 1 when it
 * is one of those, else 0.
 */
int dlock__etcd_grpc_header(const char *line, size_t n, int *status, char *message,
                            size_t size);

#endif
